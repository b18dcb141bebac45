"""`data.pad_to_multiple`: batches padded up to a multiple of a length, so that a compiled model
meets few shapes, compute what unpadded ones compute: the same loss and predictions in every model
family, and a whole run the same results."""
from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from relpos_lab import cli
from relpos_lab.api import registry
from relpos_lab.config import load_config

from test_train import TINY, run_dir_of

FAMILIES = {
    "encoder_decoder": [],
    "encoder_only": ["model.architecture=encoder_only"],
    "encoder_only_loss_on_padding": ["model.architecture=encoder_only", "task.loss_on_padding=true"],
    "decoder_only": ["model.architecture=decoder_only"],
    "decoder_only_bidirectional_prefix": ["model.architecture=decoder_only", "model.bidirectional_prefix=true"],
}


@pytest.mark.parametrize("scheme", ["shaw", "sinusoidal", "alibi"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_padded_batch_gives_the_same_loss_and_predictions(family, scheme, tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    cfg = load_config(str(tmp_path / "tiny.yaml"), [f"model.positions.scheme={scheme}", *FAMILIES[family]])
    task = registry.create_task(OmegaConf.to_object(cfg.task), seed=0)
    torch.manual_seed(0)
    model = task.build_model(OmegaConf.to_object(cfg.model)).double()
    examples = [task.dataset("test")[i] for i in range(0, 24, 3)]  # lengths 1-6: every row padded
    task.pad_to_multiple = 1
    plain = task.collate(examples)
    task.pad_to_multiple = 16
    padded = task.collate(examples)
    assert padded["src"].shape[1] == 16 and plain["src"].shape[1] < 16

    model.train()  # dropout is 0: the training forward, as the loss sees it
    want, got = task.loss(model, plain, 0.1), task.loss(model, padded, 0.1)
    assert torch.allclose(got.loss, want.loss, rtol=1e-6), (got.loss - want.loss).item()
    assert got.n_tokens == want.n_tokens
    model.eval()
    with torch.no_grad():
        want, got = task.predict(model, plain), task.predict(model, padded)
    width = max(want.shape[1], got.shape[1])
    pad = task.tgt_vocab.pad_id
    assert torch.equal(torch.nn.functional.pad(got, (0, width - got.shape[1]), value=pad),
                       torch.nn.functional.pad(want, (0, width - want.shape[1]), value=pad))


def test_a_run_with_padded_batches_has_the_unpadded_runs_results_in_its_directory(tmp_path, monkeypatch):
    """Padding changes no number, so it is not part of the run's identity: the padded run finds the
    unpadded one's directory; forced to train again there, it reaches the same results."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    monkeypatch.chdir(tmp_path)
    args = ["train", "tiny.yaml", "logging.wandb.mode=disabled"]
    assert cli.main(args) == 0
    run_dir = run_dir_of(tmp_path)
    plain = json.loads((run_dir / "results.json").read_text())["metrics"]
    assert cli.main([*args, "data.pad_to_multiple=16", "--force"]) == 0
    assert [p for p in run_dir.parent.iterdir() if ".old-" not in p.name] == [run_dir]
    padded = json.loads((run_dir / "results.json").read_text())["metrics"]
    assert padded.keys() == plain.keys()
    for name, value in plain.items():
        assert padded[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
