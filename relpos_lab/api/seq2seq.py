"""Seq2SeqTask: the Task contract filled for sequence-to-sequence problems over token ids.

An encoder-decoder, or with `model.architecture=decoder_only` a prefix LM over ``source <sep>
target <eos>`` (core/prefix_lm.py: same call signature, so nothing below depends on which), trained
with label-smoothed cross-entropy under teacher forcing, evaluated by decoding (greedy or beam, per
`cfg.decoding`) and comparing with the reference: token accuracy and exact match, EOS included. A
task that subclasses it defines `build_vocab` and `dataset`, and may override any verb (translation
replaces the metrics with corpus BLEU).

With `model.architecture=encoder_only` (core/encoder_only.py) the model reads the source followed
by `output_length(len(source))` blank slots and predicts the output at the slots in one pass: the
target fills the slots, and EOS only where the output is shorter than its slots (the reference's
termination token); evaluation takes the argmax at every slot, with no decoding. A task that can
say its output length from its input defines `output_length`; the others refuse that architecture.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import cached_property, partial
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassExactMatch

from relpos_lab.api.errors import ConfigError
from relpos_lab.api.evaluation import Evaluation
from relpos_lab.api.samples import pick_rows
from relpos_lab.api.task import Batch, Task
from relpos_lab.api.vocabulary import Vocabulary
from relpos_lab.core.compiling import unwrapped
from relpos_lab.core.decoding import beam_search, by_source_length, greedy_search
from relpos_lab.core.encoder_only import EncoderOnly
from relpos_lab.core.errors import ContractError
from relpos_lab.core.loss import LossOutput, label_smoothed_loss
from relpos_lab.core.prefix_lm import PrefixLM
from relpos_lab.core.transformer import EncoderDecoder, ModelConfig


class Pair(NamedTuple):
    """One example: source and target token ids, without BOS/EOS (collate adds them)."""

    src: Tensor
    tgt: Tensor


class Seq2SeqTask(Task):
    """Base of sequence-to-sequence tasks: define `build_vocab` and `dataset`; the rest has defaults."""

    main_metric: ClassVar[str] = "exact_match"
    main_metric_mode: ClassVar[str] = "max"
    architecture: str = "encoder_decoder"  # set by build_model (token batching counts a model's whole sequence)
    pad_to_multiple: int = 1  # set from data.pad_to_multiple: collate pads every length up to a multiple of it

    # --- what every task defines ------------------------------------------------------------

    def build_vocab(self) -> Vocabulary:
        raise NotImplementedError(f"{type(self).__name__} must define build_vocab()")

    def dataset(self, split: str) -> Dataset:
        """The examples (`Pair`s) of one split: "train", "valid", "test" or a task's own."""
        raise NotImplementedError(f"{type(self).__name__} must define dataset(split)")

    # --- what a task may define ---------------------------------------------------------------

    def output_length(self, source_length: int) -> int:
        """model.architecture=encoder_only: the output slots after a source of this many tokens,
        at least every target's length for such a source (a shorter target ends in EOS there).
        A task that defines it serves the encoder-only model; by default it cannot say."""
        raise NotImplementedError

    @property
    def knows_output_length(self) -> bool:
        return type(self).output_length is not Seq2SeqTask.output_length

    # --- vocabulary and data ----------------------------------------------------------------

    @cached_property
    def vocab(self) -> Vocabulary:
        return self.build_vocab()

    @property
    def src_vocab(self) -> Vocabulary:
        return self.vocab

    @property
    def tgt_vocab(self) -> Vocabulary:
        return self.vocab



    def num_tokens(self, example: Pair) -> int:
        """An example's size for token batching: its longer side once collated (target + EOS), or
        for a decoder-only model (built before the data) its whole sequence, source <sep> target."""
        if self.architecture == "decoder_only":
            return len(example.src) + len(example.tgt) + 1
        if self.architecture == "encoder_only":
            return len(example.src) + self.output_length(len(example.src))
        return max(len(example.src), len(example.tgt) + 1)

    def example_length(self, example: Pair) -> int:
        """The length an example is bucketed by: its source length."""
        return len(example.src)


    def bucket_of(self, lengths: Tensor) -> Tensor:
        """Map example lengths to bucket keys (identity: one bucket per length)."""
        return lengths


    def collate(self, examples: Sequence[Pair]) -> Batch:
        """Pad a list of pairs into src, tgt_in (BOS + target), tgt_out (target + EOS), length."""
        src_v, tgt_v = self.src_vocab, self.tgt_vocab
        bos, eos = torch.tensor([tgt_v.bos_id]), torch.tensor([tgt_v.eos_id])
        src = [torch.as_tensor(e.src, dtype=torch.long) for e in examples]
        tgt = [torch.as_tensor(e.tgt, dtype=torch.long) for e in examples]
        batch = {
            "src": pad_sequence(src, batch_first=True, padding_value=src_v.pad_id),
            "tgt_in": pad_sequence([torch.cat((bos, t)) for t in tgt], batch_first=True, padding_value=tgt_v.pad_id),
            "tgt_out": pad_sequence([torch.cat((t, eos)) for t in tgt], batch_first=True, padding_value=tgt_v.pad_id),
            "length": torch.tensor([self.example_length(e) for e in examples], dtype=torch.long),
        }
        if getattr(self, "architecture", None) == "encoder_only":  # the slots, counted here on the host
            slots = torch.tensor([self.output_length(len(s)) for s in src], dtype=torch.long)
            batch |= {"slots": slots, "slot_target": slot_targets(batch["tgt_out"], slots, tgt_v, self.cfg.name)}
        if self.pad_to_multiple > 1:  # few shapes for a compiled model; what the pad adds is masked
            for key in ("src", "tgt_in", "tgt_out", "slot_target"):
                if key in batch:
                    pad = src_v.pad_id if key == "src" else tgt_v.pad_id
                    batch[key] = padded_to_multiple(batch[key], self.pad_to_multiple, pad)
        return batch

    # --- raw text in and out (`relpos-lab translate`) ------------------------------------------

    def encode_input(self, line: str) -> Tensor:
        """Source ids of one line of user input: whitespace-separated symbols by default."""
        return torch.tensor(self.src_vocab.encode(line.split()), dtype=torch.long)

    def input_batch(self, inputs: Sequence[Tensor]) -> Batch:
        return {"src": pad_sequence(list(inputs), batch_first=True, padding_value=self.src_vocab.pad_id)}

    def detokenize(self, ids: Tensor) -> str:
        """The text of predicted target ids (up to EOS): symbols joined by spaces by default."""
        return self.tgt_vocab.detokenize(ids)



    # --- model and training -----------------------------------------------------------------

    def build_model(self, cfg: ModelConfig) -> nn.Module:
        """The core model of `cfg.architecture`, with vocabulary sizes and pad id taken from the task.

        decoder_only: a PrefixLM whose token space is the task's vocabulary when source and target
        have the same symbols, else the two side by side (target ids after the source ids).
        encoder_only: an EncoderOnly, for a task that defines `output_length`.
        """
        sizes = {"src_vocab_size": len(self.src_vocab), "tgt_vocab_size": len(self.tgt_vocab)}
        for key, size in sizes.items():
            if getattr(cfg, key) not in (0, size):
                raise ConfigError(
                    f"model.{key}={getattr(cfg, key)} but task '{self.cfg.name}' has a vocabulary of "
                    f"{size} symbols; leave it 0 to take the task's size"
                )
        if self.src_vocab.pad_id != self.tgt_vocab.pad_id:
            raise ValueError("source and target vocabularies must share the pad id")
        cfg = dataclasses.replace(cfg, **sizes, pad_id=self.tgt_vocab.pad_id, positions=self._positions(cfg))
        shared = self.src_vocab.symbols == self.tgt_vocab.symbols
        if self.cfg.loss_on_source and (cfg.architecture != "decoder_only" or cfg.bidirectional_prefix):
            raise ConfigError("task.loss_on_source=true needs model.architecture=decoder_only with a causal prefix "
                              f"(now architecture={cfg.architecture}, "
                              f"bidirectional_prefix={cfg.bidirectional_prefix}): "
                              "an encoder or a bidirectional prefix sees the source tokens it would predict")
        if self.cfg.loss_on_padding and cfg.architecture != "encoder_only":
            raise ConfigError("task.loss_on_padding=true counts the padding in an example's output slots, which "
                              f"model.architecture=encoder_only has (now {cfg.architecture}); set it to "
                              "encoder_only or drop loss_on_padding")
        if cfg.architecture == "encoder_only" and not self.knows_output_length:
            raise ConfigError(f"model.architecture=encoder_only reads the output at as many slots as it has tokens, "
                              f"and task '{self.cfg.name}' cannot say that number from its input (it defines no "
                              "output_length(source_length)); use model.architecture=encoder_decoder or decoder_only")
        self.architecture = cfg.architecture
        if (self.architecture == "decoder_only" and not shared
                and getattr(type(cfg.positions).scheme_class, "reads_tokens", False)):
            raise ConfigError(f"model.positions.scheme={cfg.positions.scheme} reads token ids, which a decoder-only "
                              "model shifts on the target side when source and target vocabularies differ; use "
                              "model.architecture=encoder_decoder")
        if self.architecture == "decoder_only":
            return PrefixLM(cfg, shared_vocab=shared)
        if self.architecture == "encoder_only":
            return EncoderOnly(cfg)
        return EncoderDecoder(cfg)

    def _positions(self, cfg: ModelConfig):
        """The position config with the task's symbols given to it (a scheme that reads token ids
        learns its ids there); source and target must agree on them, as one scheme reads both."""
        try:
            positions = cfg.positions.with_vocabulary(self.src_vocab.symbols)
            if positions != cfg.positions.with_vocabulary(self.tgt_vocab.symbols):
                raise ValueError("the task's source and target vocabularies give it different token ids")
        except ValueError as err:
            raise ConfigError(f"model.positions.scheme={cfg.positions.scheme}: {err}") from None
        return positions

    def loss(self, model: nn.Module, batch: Batch, label_smoothing: float) -> LossOutput:
        """The training objective of one batch: label-smoothed cross-entropy under teacher forcing,
        on the target (and with `task.loss_on_source`, on the source too: a mean over both's tokens)."""
        pad = self.tgt_vocab.pad_id
        if isinstance(unwrapped(model), EncoderOnly):
            logits, target, n_slots = self.at_slots(model, batch)
            if self.cfg.loss_on_padding:  # every slot of a row counts, pad after its EOS too
                slots = torch.arange(target.shape[1], device=target.device)[None, :] < n_slots[:, None]
                return label_smoothed_loss(logits, target, smoothing=label_smoothing, counted=slots)
            return label_smoothed_loss(logits, target, smoothing=label_smoothing, ignore_index=pad)
        if not self.cfg.loss_on_source:
            logits = model(batch["src"], batch["tgt_in"])
            return label_smoothed_loss(logits, batch["tgt_out"], smoothing=label_smoothing, ignore_index=pad)
        logits, src_logits, src_next = model(batch["src"], batch["tgt_in"], with_source=True)
        parts = [label_smoothed_loss(logits, batch["tgt_out"], smoothing=label_smoothing, ignore_index=pad),
                 label_smoothed_loss(src_logits, src_next, smoothing=label_smoothing, ignore_index=pad)]
        n_tokens = sum(p.n_tokens for p in parts)
        loss = sum(p.loss * p.n_tokens for p in parts) / n_tokens.clamp_min(1)
        return LossOutput(loss, sum(p.nll_sum for p in parts), n_tokens)

    # --- evaluation -------------------------------------------------------------------------

    def build_metrics(self) -> MetricCollection:
        """Metrics of (predictions, reference) token tensors, both (B, T), pad where unused.

        token_accuracy: share of reference tokens (EOS included) predicted at their position;
        exact_match: share of examples whose prediction equals the reference, EOS included.
        """
        n, pad = len(self.tgt_vocab), self.tgt_vocab.pad_id
        return MetricCollection({
            "token_accuracy": MulticlassAccuracy(num_classes=n, average="micro", ignore_index=pad),
            "exact_match": MulticlassExactMatch(num_classes=n, ignore_index=pad),
        })

    def build_evaluation(self, split: str) -> Evaluation:
        return Evaluation(self.build_metrics(), self.length_buckets(split))

    def slot_counts(self, src: Tensor) -> Tensor:
        """encoder_only: each row's output slots (B,), from its source length alone."""
        lengths = (src != self.src_vocab.pad_id).sum(-1).tolist()
        return torch.tensor([self.output_length(n) for n in lengths], dtype=torch.long, device=src.device)

    def at_slots(self, model: EncoderOnly, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """encoder_only: the logits (B, N, V) at each row's slots and what they should predict (B, N),
        the target then EOS where it is shorter than its slots, pad past them; and each row's slots (B,).
        `collate` counted them on the host (a batch made elsewhere has them counted here, reading the
        device), so a training step waits on nothing."""
        n_slots, target = self._slots(batch)
        return model(batch["src"], n_slots, width=target.shape[1]), target, n_slots

    def _slots(self, batch: Batch) -> tuple[Tensor, Tensor | None]:
        """encoder_only: each row's slots (B,) and, where the batch has targets, what the slots predict."""
        if "slots" in batch:
            return batch["slots"], batch.get("slot_target")
        n_slots = self.slot_counts(batch["src"])
        target = slot_targets(batch["tgt_out"], n_slots, self.tgt_vocab, self.cfg.name) if "tgt_out" in batch else None
        return n_slots, target

    def predict(self, model: nn.Module, batch: Batch) -> Tensor:
        """Predicted target ids (B, T'), EOS included and pad after it, per `cfg.decoding`
        (encoder_only: the argmax at each slot, pad past a row's slots)."""
        if isinstance(unwrapped(model), EncoderOnly):
            n_slots, target = self._slots(batch)
            width = target.shape[1] if target is not None else max(n_slots.tolist(), default=0)
            return slot_predictions(model(batch["src"], n_slots, width=width), n_slots, self.tgt_vocab.pad_id)
        d, v = self.cfg.decoding, self.tgt_vocab
        kwargs = dict(bos_id=v.bos_id, eos_id=v.eos_id, pad_id=v.pad_id,
                      max_len_a=d.max_len_a, max_len_b=d.max_len_b)
        if d.beam_size > 1:
            search = partial(beam_search, model, beam_size=d.beam_size, length_penalty=d.length_penalty, **kwargs)
        else:
            search = partial(greedy_search, model, **kwargs)
        if isinstance(unwrapped(model), PrefixLM):  # the source is its prefix: no padding inside a search
            return by_source_length(search, batch["src"], v.pad_id)
        return search(batch["src"])

    def evaluate(self, model: nn.Module, batch: Batch, evaluation: Evaluation) -> Tensor:
        """Score one batch into `evaluation` and return the predictions (for sample tables).

        The one evaluation of the framework: validation, test and `relpos-lab eval` all call it.
        """
        pad = self.tgt_vocab.pad_id
        if isinstance(unwrapped(model), EncoderOnly):  # one pass: the slots' argmax is the prediction
            logits, target, n_slots = self.at_slots(model, batch)
            forced = label_smoothed_loss(logits, target, smoothing=0.0, ignore_index=pad)
            evaluation.update_nll(forced.nll_sum, forced.n_tokens)
            hyps = slot_predictions(logits, n_slots, pad)
            evaluation.update(hyps, target, lengths=self.bucket_of(batch["length"]))
            return hyps
        forced = label_smoothed_loss(model(batch["src"], batch["tgt_in"]), batch["tgt_out"],
                                     smoothing=0.0, ignore_index=pad)
        evaluation.update_nll(forced.nll_sum, forced.n_tokens)
        hyps = self.predict(model, batch)
        target = batch["tgt_out"]
        evaluation.update(align(hyps, target.shape[1], pad), target, lengths=self.bucket_of(batch["length"]))
        return hyps

    def sample_rows(self, batch: Batch, hyps: Tensor, n: int = 8) -> tuple[list[str], list[list]]:
        """(columns, rows) of a few predictions, as text, for the W&B samples table; `length` is the
        length the example is bucketed by, across which the table spreads its rows."""
        src_v, tgt_v = self.src_vocab, self.tgt_vocab
        lengths, train = batch["length"].tolist(), self.train_length_range()
        rows = []
        for i in pick_rows(lengths, n, train and train[1]):
            length = lengths[i]
            target, prediction = tgt_v.decode(batch["tgt_out"][i]), tgt_v.decode(hyps[i])
            rows.append([length, src_v.detokenize(batch["src"][i]), " ".join(target),
                         " ".join(prediction), target == prediction])
        return ["length", "source", "target", "prediction", "correct"], rows


def slot_targets(tgt_out: Tensor, n_slots: Tensor, vocab: Vocabulary, task: str) -> Tensor:
    """What encoder_only's slots predict (B, N): `tgt_out` (target + EOS) cut to each row's slots,
    so a target that fills its slots loses its EOS and a shorter one keeps it; pad past the slots."""
    n = int(n_slots.max()) if n_slots.numel() else 0
    lengths = ((tgt_out != vocab.pad_id) & (tgt_out != vocab.eos_id)).sum(-1)
    if (lengths > n_slots).any():
        row = int((lengths > n_slots).nonzero()[0])
        raise ContractError(f"task '{task}': a target of {int(lengths[row])} tokens does not fit the "
                         f"{int(n_slots[row])} output slots its output_length gives its source; "
                         "output_length must be at least every target's length")
    target = align(tgt_out, n, vocab.pad_id)
    return target.masked_fill(torch.arange(n, device=target.device)[None, :] >= n_slots[:, None], vocab.pad_id)


def padded_to_multiple(ids: Tensor, multiple: int, pad_id: int) -> Tensor:
    """`ids` (B, T) with pad columns added up to the next multiple of `multiple`."""
    extra = -ids.shape[1] % multiple
    return torch.nn.functional.pad(ids, (0, extra), value=pad_id) if extra else ids


def slot_predictions(logits: Tensor, n_slots: Tensor, pad_id: int) -> Tensor:
    """The argmax at each slot (B, N), pad past a row's slots."""
    hyps = logits.argmax(-1)
    return hyps.masked_fill(torch.arange(hyps.shape[1], device=hyps.device)[None, :] >= n_slots[:, None], pad_id)


def align(hyps: Tensor, width: int, pad_id: int) -> Tensor:
    """Cut or pad predictions to the reference width, so they compare position by position.

    A prediction longer than its reference cannot match: the reference's EOS position then holds
    a non-EOS token. A shorter one puts EOS (or pad) where the reference has a token.
    """
    if hyps.shape[1] >= width:
        return hyps[:, :width]
    return torch.nn.functional.pad(hyps, (0, width - hyps.shape[1]), value=pad_id)
