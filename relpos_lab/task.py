"""Deprecated since 0.2.0, removed in 0.3.0: the pre-0.2 path of the Task API (see CHANGELOG.md).

The old `relpos_lab.task.Task` was the sequence-to-sequence task; that class is now
`relpos_lab.api.Seq2SeqTask` (`relpos_lab.api.Task` is the abstract contract), so `Task` here is
`Seq2SeqTask` and a plugin written against the old README keeps working, with a warning.
"""
import warnings

from relpos_lab.api.seq2seq import Pair, Seq2SeqTask, align
from relpos_lab.api.task import DecodingConfig, TaskConfig
from relpos_lab.api.vocabulary import Vocabulary

Task = Seq2SeqTask

__all__ = ["DecodingConfig", "Pair", "Task", "TaskConfig", "Vocabulary", "align"]

warnings.warn("relpos_lab.task is deprecated; import Seq2SeqTask (the old Task), TaskConfig, Pair and Vocabulary "
              "from relpos_lab.api (see CHANGELOG.md)", DeprecationWarning, stacklevel=2)
