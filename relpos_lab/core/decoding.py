"""Batched greedy and beam search over any model with a cached decoding interface.

A model decodes through two methods (EncoderDecoder and DecoderLM have them):
``start_decoding(src, max_tokens) -> cache`` and ``decode_step(tokens, cache) -> logits`` for one or
more new positions; the cache has ``reorder(index)``. max_tokens is the most tokens the search
will feed decode_step (the prefix included), for a model that draws its positions up front
(randomized positions at evaluation, positions/randomized.py). The first step feeds the whole prefix (BOS, or a
prompt for a decoder-only model) at once: a multi-token prefill. Prompts in one batch must have
equal lengths: there is no key-padding mask for the decoder, so a padded prompt would be
continued from its padding.

`sample` continues a decoder-only model's prompt (temperature, top-k) for `relpos-lab generate`.

Both searches return generated tokens (no BOS, EOS included, pad_id after it) as (B, T).
A decoder-only model reads the source as its prefix, where padding would shift positions:
`by_source_length` runs a search once per source length, on unpadded rows, which is exactly what
decoding each example alone gives. A model that draws a generation's positions up front
(randomize_at_eval) draws them for a row's own budget, so the searches then run per source length
themselves: a row's budget is a function of its source's length.
"""
from __future__ import annotations

import torch
from torch import Tensor

from relpos_lab.core.embedding import draws_when_decoding
from relpos_lab.core.length_groups import length_groups, row_lengths


def max_lengths(src: Tensor | None, pad_id: int, max_len_a: float, max_len_b: int, batch: int, device) -> Tensor:
    """Per-sentence output budget: a·|source| + b, as fairseq's --max-len-a/--max-len-b."""
    if src is None:
        return torch.full((batch,), int(max_len_b), device=device)
    src_len = (src != pad_id).sum(-1)
    return (src_len.float() * max_len_a).floor().long() + int(max_len_b)


def by_source_length(search, src: Tensor, pad_id: int) -> Tensor:
    """`search(rows)` on each group of equal-length (right-padded) sources, padding cut off; the
    outputs back in batch order, (B, T) padded with pad_id. Calls: one per distinct length."""
    groups = length_groups(row_lengths(src, pad_id))
    outs = [search(src[rows, :n]) for n, rows in groups]
    result = src.new_full((src.shape[0], max(out.shape[1] for out in outs)), pad_id)
    for (_, rows), out in zip(groups, outs):
        result[rows, : out.shape[1]] = out
    return result


def _budgets_differ(model, src: Tensor | None, limit: Tensor) -> bool:
    """Whether a search must run per source length: the model draws positions for a budget, and
    the rows' budgets are not all one."""
    return src is not None and draws_when_decoding(model) and bool((limit != limit[0]).any())  # no sync otherwise


def _prefix(src, prompt, bos_id, device):
    if prompt is not None:
        return prompt
    return torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=device)


@torch.no_grad()
def greedy_search(model, src: Tensor | None, *, bos_id: int, eos_id: int, pad_id: int,
                  max_len_a: float = 1.0, max_len_b: int = 10, prompt: Tensor | None = None) -> Tensor:
    device = (src if src is not None else prompt).device
    tokens = _prefix(src, prompt, bos_id, device)
    batch = tokens.shape[0]
    limit = max_lengths(src, pad_id, max_len_a, max_len_b, batch, device).clamp_min(1)
    if _budgets_differ(model, src, limit):
        return by_source_length(lambda rows: greedy_search(model, rows, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
                                                           max_len_a=max_len_a, max_len_b=max_len_b), src, pad_id)
    cache = model.start_decoding(src, max_tokens=tokens.shape[1] + int(limit.max()) - 1)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    out = []
    for step in range(int(limit.max())):
        logits = model.decode_step(tokens, cache)[:, -1].float()
        nxt = logits.argmax(-1)
        nxt = torch.where(step + 1 >= limit, torch.full_like(nxt, eos_id), nxt)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        out.append(nxt)
        done |= nxt == eos_id
        if bool(done.all()):
            break
        tokens = nxt[:, None]
    return torch.stack(out, dim=1)


def gnmt_length_penalty(length: Tensor, alpha: float) -> Tensor:
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^α; hypothesis scores are log P(Y) / lp(Y)."""
    return ((5.0 + length.float()) / 6.0) ** alpha


@torch.no_grad()
def beam_search(model, src: Tensor | None, *, beam_size: int = 4, length_penalty: float = 0.6,
                bos_id: int, eos_id: int, pad_id: int, max_len_a: float = 1.0, max_len_b: int = 10,
                prompt: Tensor | None = None) -> Tensor:
    """Beam search with fairseq's bookkeeping: each step ranks 2·beam candidates, EOS candidates
    within the top beam are finalised with their length-normalised score, the best non-EOS ones
    stay active; a sentence stops once it has `beam_size` finished hypotheses."""
    k = beam_size
    device = (src if src is not None else prompt).device
    prefix = _prefix(src, prompt, bos_id, device)
    batch = prefix.shape[0]
    limit = max_lengths(src, pad_id, max_len_a, max_len_b, batch, device).clamp_min(1)
    if _budgets_differ(model, src, limit):
        return by_source_length(lambda rows: beam_search(model, rows, beam_size=k, length_penalty=length_penalty,
                                                         bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
                                                         max_len_a=max_len_a, max_len_b=max_len_b), src, pad_id)
    max_steps = int(limit.max())

    rows = torch.arange(batch, device=device).repeat_interleave(k)
    cache = model.start_decoding(src, max_tokens=prefix.shape[1] + max_steps - 1)
    cache.reorder(rows)
    tokens = prefix.index_select(0, rows)
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0
    history = torch.full((batch, k, 0), pad_id, dtype=torch.long, device=device)
    fin_scores = torch.full((batch, k), float("-inf"), device=device)
    fin_tokens = torch.full((batch, k, max_steps), pad_id, dtype=torch.long, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)

    for step in range(max_steps):
        logp = torch.log_softmax(model.decode_step(tokens, cache)[:, -1].float(), dim=-1)
        vocab = logp.shape[-1]
        logp = _only_eos_where(logp, (step + 1 >= limit).repeat_interleave(k), eos_id)  # at the length limit

        cand = (scores[:, :, None] + logp.view(batch, k, vocab)).view(batch, k * vocab)
        top_scores, top_idx = cand.topk(min(2 * k, k * vocab), dim=-1)
        src_beam, tok = top_idx // vocab, top_idx % vocab
        seqs = torch.cat((history.gather(1, src_beam[:, :, None].expand(-1, -1, step)), tok[:, :, None]), dim=2)

        # Finalise EOS candidates ranked within the top beam.
        rank = torch.arange(top_scores.shape[1], device=device)[None, :]
        is_eos = tok == eos_id
        finalise = is_eos & (rank < k) & torch.isfinite(top_scores) & ~done[:, None]
        fin_scores, fin_tokens = _keep_finished(fin_scores, fin_tokens, top_scores, seqs, finalise, step,
                                                length_penalty, pad_id)
        # A sentence is done with `beam_size` finished hypotheses, or at its length limit (every
        # live beam was forced to EOS and finalised this step, however few there were).
        done |= torch.isfinite(fin_scores).all(dim=1) | (step + 1 >= limit)
        if bool(done.all()):
            break

        scores, history, parent = _continuing(top_scores, is_eos, seqs, src_beam, k)
        cache.reorder(parent)
        tokens = history[:, :, -1].reshape(-1, 1)

    best = fin_scores.argmax(dim=1)
    out = fin_tokens[torch.arange(batch, device=device), best]
    length = int((out == eos_id).long().argmax(-1).max()) + 1  # every finished hypothesis ends in EOS
    return out[:, :length]


def _continuing(top_scores: Tensor, is_eos: Tensor, seqs: Tensor, src_beam: Tensor, k: int
                ) -> tuple[Tensor, Tensor, Tensor]:
    """The `k` best non-EOS candidates of each sentence, which continue (batch, 2k ranked
    candidates): their scores (-inf where fewer than k are not EOS), their tokens so far, and the
    beam rows (batch·k) of the cache each one extends."""
    rank = torch.arange(top_scores.shape[1], device=top_scores.device)[None, :]
    order = (rank + is_eos.long() * top_scores.shape[1]).argsort(dim=1)[:, :k]
    scores = top_scores.gather(1, order)
    scores = torch.where(is_eos.gather(1, order), torch.full_like(scores, float("-inf")), scores)
    history = seqs.gather(1, order[:, :, None].expand(-1, -1, seqs.shape[2]))
    rows = torch.arange(top_scores.shape[0], device=top_scores.device)[:, None] * k
    return scores, history, (src_beam.gather(1, order) + rows).view(-1)


def _only_eos_where(logp: Tensor, rows: Tensor, eos_id: int) -> Tensor:
    """`logp` (N, V) with every token but EOS impossible in `rows` (N,): a hypothesis at its length
    limit can only end."""
    forced = torch.full_like(logp, float("-inf"))
    forced[:, eos_id] = logp[:, eos_id]
    return torch.where(rows[:, None], forced, logp)


def _keep_finished(fin_scores: Tensor, fin_tokens: Tensor, top_scores: Tensor, seqs: Tensor, finalise: Tensor,
                   step: int, length_penalty: float, pad_id: int) -> tuple[Tensor, Tensor]:
    """The `beam_size` best finished hypotheses (B, k) and their tokens (B, k, max_steps): those kept
    so far and this step's candidates marked in `finalise` (B, 2k), scored length-normalised."""
    batch, k, max_steps = fin_tokens.shape
    normed = top_scores / gnmt_length_penalty(torch.tensor(step + 1, device=top_scores.device), length_penalty)
    new_scores = torch.where(finalise, normed, torch.full_like(normed, float("-inf")))
    padded = torch.full((batch, seqs.shape[1], max_steps), pad_id, dtype=torch.long, device=seqs.device)
    padded[:, :, : step + 1] = seqs
    fin_scores, keep = torch.cat((fin_scores, new_scores), dim=1).topk(k, dim=1)
    return fin_scores, torch.cat((fin_tokens, padded), dim=1).gather(1, keep[:, :, None].expand(-1, -1, max_steps))


def next_token(logits: Tensor, temperature: float = 1.0, top_k: int = 0,
               generator: torch.Generator | None = None) -> Tensor:
    """One token per row of `logits` (B, V): argmax at temperature 0, else a draw from
    softmax(logits / temperature), restricted to the `top_k` most likely tokens when top_k > 0."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(1)


@torch.no_grad()
def sample(model, prompt: Tensor, max_new_tokens: int, *, temperature: float = 1.0, top_k: int = 0,
           generator: torch.Generator | None = None, cached: bool = True) -> tuple[Tensor, Tensor]:
    """Continue `prompt` (B, P) of a decoder-only model (`DecoderLM`) by `max_new_tokens` tokens.

    Cached (the default): the prompt is prefilled in one call, then one position per step on the
    KV cache, as translation decodes. `cached=False` recomputes the whole sequence every step (the
    baseline the cache must match and beat). Returns (new tokens (B, N), their logits (B, N, V)).
    """
    cache = model.start_decoding(None, max_tokens=prompt.shape[1] + max_new_tokens - 1) if cached else None
    tokens, step_input, new, logits_seen = prompt, prompt, [], []
    for _ in range(max_new_tokens):
        logits = (model.decode_step(step_input, cache) if cached else model(tokens))[:, -1]
        nxt = next_token(logits, temperature, top_k, generator)
        new.append(nxt)
        logits_seen.append(logits)
        step_input = nxt[:, None]
        tokens = torch.cat((tokens, step_input), dim=1)
    if not new:
        return prompt.new_zeros((prompt.shape[0], 0)), prompt.new_zeros((prompt.shape[0], 0, 0), dtype=torch.float)
    return torch.stack(new, dim=1), torch.stack(logits_seen, dim=1)
