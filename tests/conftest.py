"""Shared fixtures."""
import os
import shutil

import pytest

if shutil.which("nvidia-smi") is None:
    # Without a GPU, Triton kernels run in Triton's interpreter (tests/test_triton_kernel.py). It
    # is read when triton and the kernels are first imported, so it is set before anything else.
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """Keep every W&B file of a test under tmp_path, offline, quiet, with no API key in sight."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    for var, sub in (("WANDB_DIR", "wandb_dir"), ("WANDB_CONFIG_DIR", "wandb_config"),
                     ("WANDB_CACHE_DIR", "wandb_cache"), ("WANDB_DATA_DIR", "wandb_data")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc W&B login
    yield
    import wandb  # here, not at the top: the CUDA tier runs where wandb may not be installed

    if wandb.run is not None:
        wandb.run.finish()
