"""Machine translation: the task, its corpora (TSV, aligned files, gettext catalogs, HF), the
subword model, corpus BLEU, and the copy baseline every model must beat."""
from relpos_lab_tasks.translation.task import TranslationConfig, TranslationTask

__all__ = ["TranslationConfig", "TranslationTask"]
