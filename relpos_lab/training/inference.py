"""Using a trained checkpoint: `load_model` (a script's way in, re-exported by `relpos_lab.api`),
and on new text what `relpos-lab translate` and `generate` run.

A checkpoint rebuilds its task — with the task's saved state, such as its subword model — and its
model, so translating needs neither the training corpus nor the run directory. Each input line
is encoded by the task (`Task.encode_input`), lines are batched by length (the same token batches
as training, so a long file does not pad every sentence to its longest one), decoded with the
task's decoding settings (`Task.predict`: beam search with the checkpoint's beam size and length
penalty unless overridden), and returned in input order as text (`Task.detokenize`).

Input the vocabulary does not know (characters absent from the training corpus, say) is read as
<unk>, which the model has learnt to drop or garble: `translate` says so once, with a count and
the first line concerned, rather than translating it silently.

`generate` continues a prompt with a language model (a `DecoderLM` checkpoint, task lm) by
sampling on the KV cache (core/decoding.sample). A sequence-to-sequence checkpoint, decoder-only
or not, is refused: its model continues a source with a target, which `translate` decodes.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import SequentialSampler

from relpos_lab.api.errors import UserError
from relpos_lab.api.task import Task
from relpos_lab.core.compiling import unwrapped
from relpos_lab.core.decoding import sample
from relpos_lab.core.embedding import seed_eval_positions
from relpos_lab.core.transformer import DecoderLM
from relpos_lab.training.batching import TokenBatchSampler
from relpos_lab.training.checkpoints import OVERRIDES_FIX, check_weights_fit, load_checkpoint, task_from_checkpoint
from relpos_lab.training.module import RelposModule


class LoadedModel(NamedTuple):
    """What `load_model` returns; unpack it (`model, config, task = load_model(path)`) or read its fields.

    model: the trained core model (`EncoderDecoder`, `PrefixLM`, `DecoderLM` or a plugin task's own
        `nn.Module`), in eval mode, on the device asked for.
    config: the run's resolved experiment config (an OmegaConf `DictConfig`: `config.model`,
        `config.task`, `config.seed`, ...) as saved in the checkpoint, with the overrides on top.
    task: the task that trained it (vocabularies, `encode_input`, `decode`, `evaluate`), with its
        saved state (a subword model, say) restored: it needs neither the training data nor the run
        directory.
    """

    model: nn.Module
    config: DictConfig
    task: Task


def load_model(checkpoint: str | Path, overrides: Sequence[str] = (),
               device: str | torch.device = "cpu") -> LoadedModel:
    """The model a `relpos-lab train` checkpoint holds, with its config and task: a `LoadedModel`.

    checkpoint: a .ckpt file written by `relpos-lab train` (runs/<name>/<run>/checkpoints/last.ckpt,
        best-step=N.ckpt, a requeue's hpc_ckpt_N.ckpt).
    overrides: dot-list overrides of the checkpoint's config, as on the command line
        (``["decoding.beam_size=1", "task.test_lengths=[1,40]"]``); they may change lengths, sizes
        and decoding, not the model's shape.
    device: where the model's weights go.

    The model is in eval mode (no dropout) and its evaluation position draws (randomize_at_eval)
    restart from the run's seed, so it gives the outputs the run's own evaluation gave. Gradients
    stay on: wrap scoring in `torch.no_grad()`.

    A missing file, one torch cannot read, one that is not a relpos-lab checkpoint, or overrides that
    change the model's shape raise `UserError` with a one-line message naming the fix.
    """
    state = load_checkpoint(Path(checkpoint))
    cfg, task = task_from_checkpoint(checkpoint, list(overrides), state)
    module = RelposModule(cfg, task)
    check_weights_fit(Path(checkpoint), state, module, cfg, OVERRIDES_FIX)  # one line, not a size-mismatch traceback
    module.load_state_dict(state["state_dict"])
    seed_eval_positions(module.model, cfg.seed)
    return LoadedModel(module.model.to(device).eval(), cfg, task)


@torch.no_grad()
def translate(task: Task, model: nn.Module, lines: Sequence[str], max_tokens: int = 4096,
              warn: Callable[[str], None] | None = None) -> list[str]:
    """The model's output for each line, in input order; an empty line gives an empty output.

    Input tokens unknown to the task's source vocabulary are reported once through `warn`
    (default: `warnings.warn`).
    """
    device = next(model.parameters()).device
    sources = [task.encode_input(line) if line.strip() else None for line in lines]
    message = unknown_input(task, sources)
    if message is not None:
        (warn or (lambda m: warnings.warn(m, stacklevel=3)))(message)
    todo = [i for i, s in enumerate(sources) if s is not None and len(s) > 0]
    outputs = [""] * len(lines)
    sizes = [len(sources[i]) for i in todo]
    batches = TokenBatchSampler(SequentialSampler(todo), sizes, max_tokens, even=False)
    for batch in batches:
        rows = [todo[j] for j in batch]
        inputs = {key: value.to(device) for key, value in task.input_batch([sources[i] for i in rows]).items()}
        hyps = task.predict(model, inputs)
        for i, hyp in zip(rows, hyps.cpu()):
            outputs[i] = task.detokenize(hyp)
    return outputs


def unknown_input(task: Task, sources: Sequence[torch.Tensor | None]) -> str | None:
    """What to say when encoded input lines hold the source vocabulary's <unk> id, else None
    (also for a task without a source vocabulary: it has no <unk> to count)."""
    vocab = getattr(task, "src_vocab", None)
    unk = getattr(vocab, "unk_id", None)
    if unk is None:
        return None
    counts = [int((s == unk).sum()) if s is not None else 0 for s in sources]
    total = sum(counts)
    if not total:
        return None
    lines = sum(c > 0 for c in counts)
    first = next(i for i, c in enumerate(counts) if c) + 1
    tokens = "1 input token" if total == 1 else f"{total} input tokens"
    return (f"{tokens} in {lines} of {len(sources)} lines {'is' if total == 1 else 'are'} unknown to the "
            f"checkpoint's vocabulary and read as <unk> (first in line {first}); their translation will be "
            "missing or wrong: check that the input is in the language and script the model was trained on")


def generate(task: Task, model: nn.Module, prompt: str, max_new_tokens: int = 100, temperature: float = 1.0,
             top_k: int = 0, seed: int = 0) -> str:
    """The text a language-model checkpoint writes after `prompt` (the prompt not repeated)."""
    held = unwrapped(model)
    if not isinstance(held, DecoderLM):
        raise UserError(f"the checkpoint holds a {type(held).__name__} of task '{task.cfg.name}', a "
                        "sequence-to-sequence model: `generate` continues text with a language model (task lm); "
                        "decode its inputs with `relpos-lab translate` instead")
    if temperature < 0 or top_k < 0 or max_new_tokens < 0:
        raise UserError(f"--temperature ({temperature}), --top-k ({top_k}) and --max-new-tokens ({max_new_tokens}) "
                        "must be >= 0")
    device = next(model.parameters()).device
    ids = task.encode_input(prompt).to(device)[None, :]
    generator = torch.Generator(device=device).manual_seed(seed)
    new, _ = sample(model, ids, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator)
    # Decoded with the prompt, so the first new piece keeps its leading space (a subword model
    # drops it at the start of a text), then the prompt's own text cut off.
    prefix, full = task.detokenize(ids[0].cpu()), task.detokenize(torch.cat((ids[0], new[0])).cpu())
    return full[len(prefix):] if full.startswith(prefix) else full
