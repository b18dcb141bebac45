"""Shared fixtures."""
import os
import shutil
from pathlib import Path

import pytest

if shutil.which("nvidia-smi") is None:
    # Without a GPU, Triton kernels run in Triton's interpreter (tests/test_triton_kernel.py). It
    # is read when triton and the kernels are first imported, so it is set before anything else.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from interpreter_patching import patch_once_per_launch

    patch_once_per_launch()


if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two workers share the machine's cores: torch's default (a thread per core) in each would
    # oversubscribe them. Runs the tests start pick their own share (training/threads.py).
    import torch

    torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """Worker groups (--dist loadgroup). Tests that submit jobs to the SLURM dev cluster run on one
    worker, one after another: the cluster's two nodes are one shared resource. Tests that share
    a fixture built once per module or session (a trained run, a compiled kernel) run on one
    worker, so that it is built once, not once on each worker."""
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif group := shared_fixture_group(item):
            item.add_marker(pytest.mark.xdist_group(group))


def shared_fixture_group(item) -> str | None:
    """The group of a test that uses one of our fixtures built once per session (the fixture's
    name: its users may sit in several modules) or once per module (the module's name)."""
    definitions = getattr(item, "_fixtureinfo", None)  # pytest's resolved fixtures of the test
    if definitions is None:
        return None
    ours = [defs[-1] for defs in definitions.name2fixturedefs.values() if defs and defined_here(defs[-1].func)]
    if session := sorted(d.argname for d in ours if d.scope == "session"):
        return session[0]
    if any(d.scope == "module" for d in ours):
        return item.module.__name__
    return None


def defined_here(function) -> bool:
    code = getattr(function, "__code__", None)
    return code is not None and Path(code.co_filename).parent == Path(__file__).parent


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
    import wandb  # here, not at the top: the CUDA tier runs where wandb may not be installed

    # wandb.setup() keeps the settings it read from the environment (the mode among them) for the
    # whole process: torn down before and after, each test's W&B reads this test's environment,
    # whichever test ran before it on this worker.
    wandb.teardown()
    yield
    if wandb.run is not None:
        wandb.run.finish()
    wandb.teardown()


TINY_REVERSE = """
extends: [reverse_shaw.yaml, overlay/debug.yaml]
task: {train_lengths: [1, 4], valid_lengths: [1, 4], test_lengths: [1, 6], train_size: 256, eval_size_per_length: 4}
model: {dropout: 0.0, positions: {max_distance: 4}}
logging: {root: runs, wandb: {mode: disabled}}
"""


@pytest.fixture(scope="session", params=["encoder_decoder", "decoder_only"])
def tiny_reverse_run(request, tmp_path_factory) -> Path:
    """The run directory of a tiny reverse run (the debug overlay's 30 steps, seconds on a CPU)
    trained by `python -m relpos_lab train`, once a session for each model architecture."""
    from installed import run_cli

    root = tmp_path_factory.mktemp(f"tiny-{request.param}")
    (root / "tiny.yaml").write_text(TINY_REVERSE)
    out = run_cli(root, "train", "tiny.yaml", f"model.architecture={request.param}", timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    (run_dir,) = [p for p in root.glob("runs/*/*") if p.is_dir()]
    return run_dir
