"""Deprecated, removed in 0.3.0: `load_model` and `LoadedModel` live with the checkpoint loader in
`relpos_lab.training.inference` (see CHANGELOG.md); import them from `relpos_lab.api`.

This path stays for a release; it loads the training layer (and Lightning) when imported, so
tests/test_layout.py places it with the face of the api (`relpos_lab.api`), above training.
"""
import warnings

from relpos_lab.training.inference import LoadedModel, load_model

__all__ = ["LoadedModel", "load_model"]

warnings.warn("relpos_lab.api.checkpoint is deprecated; import load_model and LoadedModel from relpos_lab.api "
              "(see CHANGELOG.md)", DeprecationWarning, stacklevel=2)
