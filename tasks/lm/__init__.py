"""Language modelling: token streams from text (built-in corpus, files, HF datasets), windows of
the training length, perplexity by evaluation length and token position."""
from relpos_lab_tasks.lm.task import LMConfig, LMTask

__all__ = ["LMConfig", "LMTask"]
