"""The encoder/decoder Transformer of "Attention Is All You Need", with pluggable positions.

Relative positions (any scheme of positions/) act in the self-attention of encoder and
decoder; cross-attention has none. `model.architecture=decoder_only` uses the decoder stack alone
(prefix_lm.py for sequence-to-sequence tasks, DecoderLM for plain token streams);
`encoder_only`, the encoder stack alone (encoder_only.py: the source, then blank output slots). Decoding keeps a
per-layer key/value cache (cache.py); queries carry their absolute offset into it, so one-token
steps and multi-token prefill both equal a full pass.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from relpos_lab.core.attention import capture, relative_attention
from relpos_lab.core.attention.masks import visibility_mask
from relpos_lab.core.cache import DecoderCache, KVCache, LayerCache
from relpos_lab.core.embedding import Embedding, seed_eval_positions
from relpos_lab.core.init import haiku_layers_, linear
from relpos_lab.core.length_groups import per_length, row_lengths
from relpos_lab.core.model_config import ARCHITECTURES, MODEL_IMPLS, ModelConfig  # noqa: F401  (their old home)
from relpos_lab.core.positions import KeyState, RelativePositions, contract, position_scheme_of
from relpos_lab.core.positions.randomized import frame_slots, framed_mask, from_frame, spread, spread_mask, to_frame
from relpos_lab.core.renamed import renamed_state_dict_keys


class MultiHeadAttention(nn.Module):
    """Multi-head attention whose position scheme acts through three hooks (rotate, attention_kwargs,
    content_bias) and whose arithmetic is relative_attention's: self-attention over x, or
    cross-attention over a context (the encoder's memory, with no positions).

    Notation used for tensor shapes:
        B    batch size
        L    tokens of x: the queries, and the output's rows
        Lk   keys: L in self-attention, the context's length in cross-attention, and with a cache
             every position so far
        P    slots a randomized-position path spreads x's tokens over: max_random_len (decoding:
             the slots from the cache's end to the last position)
        H    heads (n_heads)
        D    a head's width, d_model / H
        d    d_model
    """

    def __init__(self, cfg: ModelConfig, relative: RelativePositions | None = None):
        super().__init__()
        self.n_heads, self.attention_impl = cfg.n_heads, cfg.attention_impl  # relative_attention's impl=
        self.dropout = cfg.attention_dropout
        self.dropout_at_eval = False  # eval_dropout.py: the reference evaluates with dropout on
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            linear(cfg.d_model, cfg.d_model, bias=cfg.attention_bias, init=cfg.init) for _ in range(4))
        self.relative = relative or RelativePositions()  # the scheme's module; was `positions` (old keys load)
        if relative is not None and cfg.init == "haiku":
            haiku_layers_(relative)
        self.scheme_label = contract.scheme_label(cfg.positions)  # how contract errors name the scheme
        self.slots = cfg.positions.max_random_len  # P of a randomized-position pass (None: positions 0..L-1)
        self.unchecked = relative is not None  # the scheme's hooks are checked on their first call
        self.content = relative is not None and contract.has_content_bias(relative)
        self.register_load_state_dict_pre_hook(renamed_state_dict_keys("positions", "relative"))

    def _heads(self, x: Tensor) -> Tensor:
        """(B, L, d) -> (B, H, L, D): each head its slice of the width."""
        b, n, d = x.shape
        return x.view(b, n, self.n_heads, d // self.n_heads).transpose(1, 2)  # (B, L, H, D) -> (B, H, L, D)

    def forward(self, x, *, context=None, attn_mask=None, is_causal=False, cache: KVCache | None = None,
                positions: Tensor | None = None, distances: Tensor | None = None) -> Tensor:
        """Self-attention when context is None, else cross-attention over context. x: (B, L, d),
        context: (B, Lk, d); returns (B, L, d).

        With a cache, self-attention's queries start at the cache's length (their absolute
        positions, which relative schemes need) and attend to everything cached; cross-attention
        projects the context on its first step only, since the memory never changes.
        `positions` (increasing, one per token) places self-attention's tokens there instead of
        0..L-1 (randomized positions; see positions/randomized.py); with a cache, it holds the
        positions of every token so far, x's last. `distances` (2L - 1,) or, each row its own,
        (B, 2L - 1): what the offsets of x's tokens stand for instead of themselves (random_distances;
        the scheme's attention_kwargs_at_distances).
        """
        if distances is not None:
            q, k, v = (self._heads(proj(x)) for proj in (self.q_proj, self.k_proj, self.v_proj))  # (B, H, L, D)
            extra = self.relative.attention_kwargs_at_distances(q, k, distances)
            return self._attend(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **extra)
        if positions is not None and cache is not None:
            return self._decode_at_positions(x, attn_mask=attn_mask, is_causal=is_causal, positions=positions,
                                             cache=cache)
        if positions is not None:
            return self._at_positions(x, attn_mask=attn_mask, is_causal=is_causal, positions=positions)
        q = self._heads(self.q_proj(x))  # (B, H, L, D)
        offset = 0
        if context is None:
            k, v = self._heads(self.k_proj(x)), self._heads(self.v_proj(x))  # (B, H, L, D)
            offset = cache.length if cache is not None else 0
            q, k = self._rotate(q, k, offset)
            if cache is not None:
                k, v = cache.append(k, v)  # (B, H, Lk, D): the cached positions, then x's
        elif cache is not None and cache.length:
            k, v = cache.k, cache.v  # (B, H, Lk, D): the memory, projected on the first step
        else:
            k, v = self._heads(self.k_proj(context)), self._heads(self.v_proj(context))  # (B, H, Lk, D)
            if cache is not None:
                cache.append(k, v)
        extra = self._scheme_kwargs(q, k, x, offset, attn_mask, is_causal, cache)
        return self._attend(q, k, v, attn_mask=attn_mask, is_causal=is_causal, query_offset=offset, **extra)

    def _at_positions(self, x, *, attn_mask, is_causal, positions: Tensor) -> Tensor:
        """The scheme's hooks see the tokens spread over a sequence of max_random_len slots (gaps
        masked), so every scheme places them at `positions` unchanged; attention itself runs over
        the real tokens only, with the labels of their positions: O(L²), not O(max_random_len²)."""
        q, k, v = (self._heads(proj(x)) for proj in (self.q_proj, self.k_proj, self.v_proj))  # (B, H, L, D)
        direct = None if self.content else self.relative.attention_kwargs_at(q, k, positions)
        if direct is not None:  # the scheme places the real tokens itself: nothing over the P slots
            if self.unchecked:
                contract.check_attention_kwargs(self.scheme_label, self.relative, direct, q, k)
                self.unchecked = False
            return self._attend(q, k, v, attn_mask=attn_mask, is_causal=is_causal, positions=positions, **direct)
        q, k = self._rotate(spread(q, positions, 2, self.slots), spread(k, positions, 2, self.slots), 0)  # (B, H, P, D)
        # (…, P, P); gaps: keys no query sees (content schemes skip them)
        mask = spread_mask(attn_mask, is_causal, positions, self.slots)
        extra = self._scheme_kwargs(q, k, spread(x, positions, 1, self.slots), 0, mask, False, None)
        if extra.get("attn_bias") is not None:  # a dense bias over the slots: the real tokens' rows and columns
            bias = extra["attn_bias"]
            for dim in (-2, -1):
                bias = bias.index_select(dim, positions) if bias.shape[dim] > 1 else bias
            extra["attn_bias"] = bias  # (…, P, P) -> (…, L, L)
        q, k = q.index_select(2, positions), k.index_select(2, positions)  # (B, H, L, D)
        return self._attend(q, k, v, attn_mask=attn_mask, is_causal=is_causal, positions=positions, **extra)

    def _decode_at_positions(self, x, *, attn_mask, is_causal, positions: Tensor, cache: KVCache) -> Tensor:
        """x's tokens at `positions`: spread over the slots from the cache's end to the last
        position, gaps masked; the cache keeps the spread keys, so a step sees what a full pass sees."""
        offset = cache.length
        new = positions[-x.shape[1]:] - offset  # x's slots in this segment
        q, k, v = (spread(self._heads(proj(x)), new, dim=2)  # (B, H, P, D)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        q, k = self._rotate(q, k, offset)
        k, v = cache.append(k, v)  # (B, H, Lk, D): every slot so far
        mask = spread_mask(attn_mask, is_causal, positions)[..., offset:, :]  # (…, P, Lk); gaps: keys no query sees
        extra = self._scheme_kwargs(q, k, spread(x, new, dim=1), offset, mask, False, cache)
        return self._attend(q, k, v, rows=new, attn_mask=mask, query_offset=offset, **extra)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, *, rows: Tensor | None = None, **call) -> Tensor:
        """The tail of every path: relative_attention with the path's `call` (its mask and offset, the
        scheme's keywords), then the heads merged back and projected. q: (B, H, L, D), or (B, H, P, D)
        with `rows` the L slots of x's tokens; k, v: (B, H, Lk, D)."""
        active = self.training or self.dropout_at_eval
        y = relative_attention(q, k, v, dropout_p=self.dropout if active else 0.0, impl=self.attention_impl,
                               **call)  # (B, H, L or P, D)
        if rows is not None:
            y = y.index_select(2, rows)  # (B, H, L, D)
        return self.out_proj(y.transpose(1, 2).flatten(2))  # (B, L, H, D) -> (B, L, d)

    # The scheme's hooks; what they return is checked on the first call only (positions/contract.py).

    def _rotate(self, q: Tensor, k: Tensor, offset: int) -> tuple[Tensor, Tensor]:
        rotated = self.relative.rotate(q, k, offset)
        if self.unchecked:
            contract.check_rotate(self.scheme_label, self.relative, rotated, q, k)
        return rotated

    def _scheme_kwargs(self, q: Tensor, k: Tensor, x: Tensor, offset: int, attn_mask: Tensor | None,
                       is_causal: bool, cache: KVCache | None) -> dict:
        """What the scheme adds to the attention call: its attention_kwargs, and the content_bias of
        a scheme that has one (computed from q, k and the layer input x) in attn_bias."""
        extra = self.relative.attention_kwargs(q, k, offset)
        if self.unchecked:
            contract.check_attention_kwargs(self.scheme_label, self.relative, extra, q, k)
        if self.content:
            visible = visibility_mask(attn_mask, is_causal, q.shape[-2], k.shape[-2], offset, q.device)
            state = cache.state if cache is not None else KeyState()
            bias = self.relative.content_bias(q, k, x, offset, visible, state)
            if self.unchecked:
                contract.check_content_bias(self.scheme_label, self.relative, bias, q, k, state)
            if capture.ACTIVE is not None:  # inspect: what the scheme draws of its bias (draw_content)
                capture.ACTIVE.observe_content(q, k, x, offset, visible)
            extra = {**extra, "attn_bias": bias if extra.get("attn_bias") is None else extra["attn_bias"] + bias}
        self.unchecked = False
        return extra


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc1 = linear(cfg.d_model, cfg.d_ff, init=cfg.init)
        self.fc2 = linear(cfg.d_ff, cfg.d_model, init=cfg.init)
        self.dropout = nn.Dropout(cfg.dropout if cfg.ffn_dropout is None else cfg.ffn_dropout)

    def forward(self, x):
        return self.fc2(self.dropout(F.relu(self.fc1(x))))


class Sublayer(nn.Module):
    """Residual + LayerNorm around one sublayer, post-LN (the paper) or pre-LN."""

    def __init__(self, cfg: ModelConfig, inner: nn.Module):
        super().__init__()
        self.inner, self.norm = inner, nn.LayerNorm(cfg.d_model)
        self.dropout, self.norm_first = nn.Dropout(cfg.dropout), cfg.norm_first

    def forward(self, x, **options):
        if self.norm_first:
            return x + self.dropout(self.inner(self.norm(x), **options))
        return self.norm(x + self.dropout(self.inner(x, **options)))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        rel = position_scheme_of(cfg.positions).attention(cfg.head_dim, cfg.n_heads, causal=False)
        self.self_attn = Sublayer(cfg, MultiHeadAttention(cfg, rel))
        self.ffn = Sublayer(cfg, FeedForward(cfg))

    def forward(self, x, *, key_mask: Tensor, positions: Tensor | None = None, distances: Tensor | None = None):
        return self.ffn(self.self_attn(x, attn_mask=key_mask, positions=positions, distances=distances))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, cross_attention: bool, causal: bool = True):
        super().__init__()
        rel = position_scheme_of(cfg.positions).attention(cfg.head_dim, cfg.n_heads, causal=causal)
        self.self_attn = Sublayer(cfg, MultiHeadAttention(cfg, rel))
        self.cross_attn = Sublayer(cfg, MultiHeadAttention(cfg)) if cross_attention else None
        self.ffn = Sublayer(cfg, FeedForward(cfg))

    def forward(self, x, *, memory=None, memory_mask=None, cache: LayerCache | None = None, positions=None,
                self_mask=None, causal: bool = True):
        x = self.self_attn(x, attn_mask=self_mask, is_causal=causal,
                           cache=cache.self_attn if cache is not None else None, positions=positions)
        if self.cross_attn is not None:
            x = self.cross_attn(x, context=memory, attn_mask=memory_mask,
                                cache=cache.cross_attn if cache is not None else None)
        return self.ffn(x)


def make_embedding(cfg: ModelConfig, vocab_size: int, tokens: nn.Embedding | None = None) -> Embedding:
    """The token embedding of model `cfg` for a vocabulary of `vocab_size` (`tokens`: a table to share)."""
    dropout = cfg.dropout if cfg.embedding_dropout is None else cfg.embedding_dropout
    return Embedding(vocab_size, cfg.d_model, cfg.positions, pad_id=cfg.pad_id, dropout=dropout, init=cfg.init,
                     tokens=tokens)


class Encoder(nn.Module):
    def __init__(self, cfg: ModelConfig, embed: Embedding):
        super().__init__()
        self.embed, self.pad_id = embed, cfg.pad_id
        self.redraw_per_layer = cfg.positions.redraw_per_layer
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()

    def forward(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Returns the memory and its key mask (B, 1, 1, S), True at real tokens. At evaluation, a
        pass that reads its width runs once per length of the right-padded batch (length_groups.py)."""
        key_mask = (src != self.pad_id)[:, None, None, :]
        if self.embed.frames_rows:  # each row its own positions (positions/randomized.py)
            slots = frame_slots(row_lengths(src, self.pad_id), src.shape[1])
            framed = to_frame(src, slots)
            return from_frame(self._encode(framed, (framed != self.pad_id)[:, None, None, :]), slots), key_mask
        if self.training or not self.embed.per_length_at_eval:
            return self._encode(src, key_mask), key_mask
        return per_length(lambda rows, n: self._encode(src[rows, :n], key_mask[rows, ..., :n]),
                          row_lengths(src, self.pad_id), src.shape[1]), key_mask

    def _encode(self, src: Tensor, key_mask: Tensor) -> Tensor:
        n = src.shape[1]
        draws = self.embed.draws(n)  # every draw of this pass: the embedding's, then each layer's
        positions = self.embed.random_positions(n, draws)
        lengths = row_lengths(src, self.pad_id) if self.training and self.embed.random_distances else None
        x = self.embed(src, positions=positions)
        for i, layer in enumerate(self.layers):
            if i and self.redraw_per_layer:  # the first layer keeps the embedding's draw
                positions = self.embed.random_positions(n, draws)
            x = layer(x, key_mask=key_mask, positions=positions,  # distances: each layer its own, each row its own
                      distances=self.embed.random_distances_of(n, draws, lengths))
        return self.norm(x)


class Decoder(nn.Module):
    """Causal stack; with cross_attention=False it is a decoder-only language model body.

    causal=False builds the position schemes for attention that may also look ahead (a prefix LM's
    bidirectional prefix: T5's bidirectional buckets); each call still says how it attends:
    `causal` and `self_mask` (bool, True = may attend) go to every self-attention.

    `positions` (increasing, one per token of tgt) places the tokens there; by default they are
    drawn as positions/randomized.py says (while decoding, taken from the cache's draw), else 0..L-1.
    """

    def __init__(self, cfg: ModelConfig, embed: Embedding, cross_attention: bool = True, causal: bool = True):
        super().__init__()
        self.embed, self.pad_id = embed, cfg.pad_id
        self.layers = nn.ModuleList(DecoderLayer(cfg, cross_attention, causal) for _ in range(cfg.n_decoder_layers))
        self.norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.output = linear(cfg.d_model, embed.tokens.num_embeddings, bias=cfg.output_bias, init=cfg.init)
        if cfg.tie_embeddings:
            self.output.weight = embed.tokens.weight

    def forward(self, tgt: Tensor, memory=None, memory_mask=None, cache: DecoderCache | None = None,
                self_mask: Tensor | None = None, causal: bool = True, positions: Tensor | None = None) -> Tensor:
        if cache is None and positions is None and self.embed.frames_rows:  # each row its own positions
            slots = frame_slots(row_lengths(tgt, self.pad_id), tgt.shape[1])
            framed = to_frame(tgt, slots)
            mask = framed_mask(framed != self.pad_id, self_mask, slots)
            return from_frame(self._decode(framed, memory, memory_mask, None, mask, causal, None), slots)
        if cache is None and positions is None and not self.training and self.embed.per_length_at_eval:
            def rows_alone(rows: Tensor, n: int) -> Tensor:  # a group of rows with n real tokens, cut to n
                return self._decode(tgt[rows, :n], None if memory is None else memory[rows],
                                    None if memory_mask is None else memory_mask[rows], None,
                                    None if self_mask is None else self_mask[rows, ..., :n, :n], causal, None)
            return per_length(rows_alone, row_lengths(tgt, self.pad_id), tgt.shape[1])
        return self._decode(tgt, memory, memory_mask, cache, self_mask, causal, positions)

    def _decode(self, tgt, memory, memory_mask, cache, self_mask, causal, positions) -> Tensor:
        offset = cache.length if cache is not None else 0
        n = tgt.shape[1]
        if positions is None and cache is not None:
            positions = cache.positions_with(n)
        elif positions is None:
            positions = self.embed.random_positions(n, self.embed.draws(n))
        seen = cache.remember(tgt) if cache is not None and self.embed.reads_tokens else None
        x = self.embed(tgt, offset=offset, positions=None if positions is None else positions[-n:], seen=seen)
        for i, layer in enumerate(self.layers):
            x = layer(x, memory=memory, memory_mask=memory_mask, cache=cache.layers[i] if cache is not None else None,
                      positions=positions, self_mask=self_mask, causal=causal)
        return self.output(self.norm(x))


class EncoderDecoder(nn.Module):
    """The Transformer of "Attention Is All You Need" with pluggable positions: encoder over the
    source, decoder over the target with cross-attention. Token ids are (B, L) long tensors whose
    padding is `cfg.pad_id` (masked in attention); logits are (B, L, vocabulary)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        if cfg.architecture != "encoder_decoder":
            raise ValueError(f"EncoderDecoder needs model.architecture=encoder_decoder, got {cfg.architecture!r}")
        if cfg.n_encoder_layers < 1 or cfg.src_vocab_size < 1 or cfg.tgt_vocab_size < 1:
            raise ValueError("EncoderDecoder needs n_encoder_layers >= 1 and both vocabulary sizes set")
        self.cfg = cfg
        src_embed = make_embedding(cfg, cfg.src_vocab_size)
        shared = src_embed.tokens if cfg.share_src_tgt_embeddings else None
        self.encoder = Encoder(cfg, src_embed)
        self.decoder = Decoder(cfg, make_embedding(cfg, cfg.tgt_vocab_size, shared))
        seed_eval_positions(self, 0)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher forcing: src (B, S), tgt_in (B, T) (the target shifted right, BOS first) ->
        logits (B, T, tgt_vocab_size), position t predicting target token t + 1."""
        memory, memory_mask = self.encoder(src)
        return self.decoder(tgt_in, memory, memory_mask)

    def start_decoding(self, src: Tensor, max_tokens: int | None = None) -> DecoderCache:
        """Encode src (B, S) once; the returned cache holds the memory and, as decoding goes, every
        decoder layer's keys and values. max_tokens: the most tokens decode_step will be fed (BOS
        included), for which randomize_at_eval draws the decoder's positions up front."""
        memory, memory_mask = self.encoder(src)
        positions = self.decoder.embed.decoding_positions(max_tokens)
        return DecoderCache(len(self.decoder.layers), memory, memory_mask, positions)

    def decode_step(self, tokens: Tensor, cache: DecoderCache) -> Tensor:
        """Logits (B, N, V) for `tokens` (B, N): one or several new positions (a multi-token prefill)
        placed after everything in the cache, which they are then added to."""
        return self.decoder(tokens, cache.memory, cache.memory_mask, cache=cache)


class DecoderLM(nn.Module):
    """Decoder-only use of the same stack, for language-model style tasks: causal self-attention
    only, token ids (B, L) in, next-token logits (B, L, tgt_vocab_size) out."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        if cfg.tgt_vocab_size < 1:
            raise ValueError("DecoderLM needs tgt_vocab_size set")
        self.cfg = cfg
        self.decoder = Decoder(cfg, make_embedding(cfg, cfg.tgt_vocab_size), cross_attention=False)

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens (B, L) -> logits (B, L, V), position t predicting token t + 1."""
        return self.decoder(tokens)

    def start_decoding(self, src: Tensor | None = None, max_tokens: int | None = None) -> DecoderCache:
        """An empty KV cache (`src` is unused: the signature is the encoder-decoder's, for decoding.py);
        max_tokens: the most tokens decode_step will be fed (randomize_at_eval draws their positions)."""
        return DecoderCache(len(self.decoder.layers), positions=self.decoder.embed.decoding_positions(max_tokens))

    def decode_step(self, tokens: Tensor, cache: DecoderCache) -> Tensor:
        """Logits (B, N, V) for `tokens` (B, N) placed after the cache's positions (the first call
        with the whole prompt is its prefill), which are then added to the cache."""
        return self.decoder(tokens, cache=cache)
