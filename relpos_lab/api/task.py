"""The Task: the contract between the framework and one problem. This is the plugin API.

As in fairseq (FairseqTask beside TranslationTask), the contract is small: a typed config, the
splits' datasets, how examples become a batch, the model, the training loss of a batch, and one
`evaluate` — used by validation, test and `relpos-lab eval` alike, which is what keeps them from
ever disagreeing. The framework (training/, the CLI) talks to a task only through these verbs.
What each verb returns is checked on its first use (contract.py), so a task that breaks the
contract is told so in one line. Everything else is an optional hook with a neutral default.
`Seq2SeqTask` (seq2seq.py) fills the contract for sequence-to-sequence problems over token ids, so
a typical task only defines `build_vocab` and `dataset`.

Tasks are found through the ``relpos_lab.tasks`` entry-point group (registry.py), never by import
side effects.
"""
from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from omegaconf import MISSING
from torch import Tensor, nn
from torch.utils.data import Dataset

from relpos_lab.api.errors import UserError, did_you_mean

if TYPE_CHECKING:  # type names only: the contract does not import the model core or torchmetrics
    from relpos_lab.api.evaluation import Evaluation
    from relpos_lab.core.loss import LossOutput
    from relpos_lab.core.transformer import ModelConfig

Batch = dict[str, Tensor]

@dataclass
class DecodingConfig:
    """How predictions are produced for evaluation: greedy when beam_size is 1."""

    beam_size: int = 1
    """hypotheses kept by beam search; 1: greedy"""
    length_penalty: float = 0.6
    """GNMT length penalty α of beam search"""
    max_len_a: float = 1.0
    """output budget a·|source| + b (fairseq's --max-len-a/b)"""
    max_len_b: int = 10
    """see max_len_a"""


@dataclass
class TaskConfig:
    """Base of every task's config; a task's own fields go in a subclass (`Task.config_class`)."""

    name: str = MISSING
    """the entry-point name that selects the task"""
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    """how evaluation decodes"""
    loss_on_source: bool = False
    """model.architecture=decoder_only: also train to predict the source (a language model over the
    whole sequence); false: the loss covers the target only"""
    loss_on_padding: bool = False
    """model.architecture=encoder_only: the padding in each example's output slots after its end counts as a
    target, the loss a mean over every slot, as DeepMind's reference code takes it (its zeros after the
    terminator); false: a mean over the target's tokens"""

    def for_debug(self) -> TaskConfig:
        """This config for the `debug` overlay: its evaluation cut to a few lengths and examples, its
        training data small, so that a debug run of any experiment finishes in seconds. The default
        changes nothing; the built-in tasks' configs cut what they generate or read."""
        return self

    def validate(self) -> None:
        """Raise ValueError naming a bad field; subclasses extend it (call super().validate())."""
        if self.decoding.beam_size < 1:
            raise ValueError(f"task.decoding.beam_size={self.decoding.beam_size} must be >= 1")


class Task(abc.ABC):
    """Base class of task plugins: set `config_class`, define the abstract verbs below."""

    config_class: ClassVar[type[TaskConfig]] = TaskConfig
    main_metric: ClassVar[str] = "loss"  # picks the best checkpoint (on split "valid")
    main_metric_mode: ClassVar[str] = "min"
    splits: ClassVar[tuple[str, ...]] = ("train", "valid", "test")  # "valid" picks checkpoints

    def __init__(self, cfg: TaskConfig, *, seed: int = 0):
        self.cfg = cfg
        self.seed = seed

    @classmethod
    def describe(cls) -> str:
        """One line for `relpos-lab tasks`: the first line of the class docstring."""
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""

    def check_split(self, split: str) -> None:
        if split not in self.splits:
            close = did_you_mean(split, list(self.splits))
            hint = f"did you mean '{close}'? " if close else ""
            raise UserError(f"task '{self.cfg.name}' has no split '{split}'; {hint}splits: {', '.join(self.splits)}")

    # --- the contract -----------------------------------------------------------------------

    @abc.abstractmethod
    def dataset(self, split: str) -> Dataset:
        """The examples of one split: "train", "valid", "test" or a task's own."""

    @abc.abstractmethod
    def collate(self, examples: Sequence[Any]) -> Batch:
        """A list of examples as one batch of tensors."""

    @abc.abstractmethod
    def build_model(self, cfg: ModelConfig) -> nn.Module:
        """The model to train, from the experiment's model section."""

    @abc.abstractmethod
    def loss(self, model: nn.Module, batch: Batch, label_smoothing: float) -> LossOutput:
        """The training objective of one batch."""

    @abc.abstractmethod
    def build_evaluation(self, split: str) -> Evaluation:
        """A fresh accumulator of this task's metrics for one pass over `split`."""

    @abc.abstractmethod
    def evaluate(self, model: nn.Module, batch: Batch, evaluation: Evaluation) -> Tensor | None:
        """Score one batch into `evaluation`; return its predictions (for `sample_rows`) or None."""

    # --- optional hooks ---------------------------------------------------------------------

    def prepare_data(self) -> None:
        """One-time work on one process (download, train a tokenizer); cache it on disk."""

    def max_tokens(self, split: str) -> int | None:
        """Bound the batches of `split` by padded tokens (fairseq's --max-tokens, see
        training/batching.py) instead of data.batch_size / eval_batch_size examples; None (the
        default) keeps the latter. A task that returns a number defines `num_tokens`."""
        return None

    def num_tokens(self, example: Any) -> int:
        """An example's size for token batching (only asked when `max_tokens` gives a number)."""
        raise NotImplementedError(f"{type(self).__name__}.max_tokens() asks for token batching: "
                                  "define num_tokens(example)")

    def length_buckets(self, split: str) -> Sequence[int] | None:
        """Bucket keys reported in results.json `by_length` for `split` (and the `_id`/`_ood`
        summaries and per-length plots drawn from them); None: no per-length view."""
        return None

    def train_length_range(self) -> tuple[int, int] | None:
        """Lengths seen in training (inclusive): splits `by_length` into `_id` / `_ood` summaries
        and is shaded in the per-length plots."""
        return None

    def inspect_lengths(self, split: str) -> Sequence[int] | None:
        """The lengths `relpos-lab inspect` measures on their own beside the whole split when no
        --lengths are given (a task is inspected if it defines `example_length(example)`, the
        length its examples are grouped by); None (the default): the longest training length and
        the longest test length past it."""
        return None

    def sample_rows(self, batch: Batch, predictions: Tensor, n: int = 8) -> tuple[list[str], list[list]] | None:
        """(columns, rows) of up to n predictions, as text, for the W&B samples table; None: no table.
        Asked of every evaluation batch: with a `length` column, the table spreads its rows across
        the split's lengths (training/samples.py); without, it shows the first batch's."""
        return None

    def state_dict(self) -> dict:
        """What the task learned from its data (say, a subword model) and a checkpoint must carry
        so that it alone rebuilds the task; stored under "task_state". Default: nothing."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()` from a checkpoint, before the data or model is first built."""

    # --- raw text in and out (`relpos-lab translate`, `generate`); optional ------------------

    def encode_input(self, line: str) -> Tensor:
        """The input ids of one line of user text."""
        raise UserError(f"task '{self.cfg.name}' does not take raw text input (it defines no encode_input)")

    def input_batch(self, inputs: Sequence[Tensor]) -> Batch:
        """A batch of encoded inputs, for `predict`."""
        raise UserError(f"task '{self.cfg.name}' does not take raw text input (it defines no input_batch)")

    def predict(self, model: nn.Module, batch: Batch) -> Tensor:
        """Predicted ids (B, T') of a batch's inputs: the search `task.decoding` configures, or what
        the model reads off in one pass."""
        raise UserError(f"task '{self.cfg.name}' does not generate output (it defines no predict)")

    def detokenize(self, ids: Tensor) -> str:
        """The text of one row of predicted ids."""
        raise UserError(f"task '{self.cfg.name}' does not produce text (it defines no detokenize)")
