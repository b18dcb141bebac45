"""The papers' protocols as configs: deletang2023_paper, ruoss2023_paper and their
`_small` twins, as experiments and as sweeps."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from relpos_lab import cli
from relpos_lab.config.load import load_config
from relpos_lab.launch.slurm import sbatch_options
from relpos_lab.launch.sweep import load_sweep

from installed import run_cli

SWEEPS = {"deletang2023_paper": 10 * 3 * 15 * 6, "ruoss2023_paper": 10 * 3 * 15 * 13,
          "deletang2023_paper_small": 2 * 15 * 17, "ruoss2023_paper_small": 2 * 15 * 15}


@pytest.mark.parametrize("name", ["deletang2023_paper", "ruoss2023_paper", "deletang2023_paper_small",
                                  "ruoss2023_paper_small"])
def test_the_experiments_are_the_papers_protocol(name):
    cfg = load_config(name)
    assert cfg.model.architecture == "encoder_only"
    assert cfg.task.train_size == 0 and cfg.task.length_per_batch  # fresh data, one length per batch
    assert cfg.optim.scheduler == "constant" and cfg.optim.warmup_steps == 0 and cfg.optim.label_smoothing == 0
    assert tuple(cfg.optim.betas) == (0.9, 0.999) and cfg.optim.eps == 1e-8 and cfg.trainer.gradient_clip_val == 1.0
    assert cfg.model.d_model == 64 and cfg.data.batch_size == (64 if name.endswith("_small") else 128)
    if not name.endswith("_small"):
        assert cfg.model.n_encoder_layers == 5 and cfg.model.n_heads == 8 and cfg.trainer.max_steps == 1_000_000
        assert list(cfg.task.train_lengths) == [1, 40] and list(cfg.task.test_lengths) == [41, 500]
    randomized = cfg.model.positions.max_random_len
    assert (randomized is not None) == name.startswith("ruoss") and (cfg.model.positions.randomize_at_eval
                                                                      == name.startswith("ruoss"))
    # the reference: its final parameters, one process; its model's details (tests/test_reference_options.py)
    assert cfg.trainer.evaluate == "last" and cfg.trainer.devices * cfg.trainer.num_nodes == 1
    assert cfg.trainer.eval_dropout  # the reference evaluates with a random key: dropout on
    assert cfg.trainer.precision == "32" and cfg.model.init == "haiku" and cfg.task.loss_on_padding
    assert not cfg.model.attention_bias and cfg.model.output_bias
    assert cfg.model.attention_dropout == cfg.model.ffn_dropout == cfg.model.embedding_dropout == 0.0
    if not name.endswith("_small"):  # 512 examples a length; the CPU twin scales both down
        assert cfg.task.eval_size_per_length == 512 and cfg.optim.lr == 1e-4
    else:
        assert cfg.task.eval_size_per_length == 32 and cfg.optim.lr == 1e-3


@pytest.mark.parametrize("name", ["deletang2023_paper", "ruoss2023_paper"])
def test_one_gpu_per_run_keeps_the_papers_batch_and_precision(name):
    """trainer=gpu1: the world of one process that a batch of 128 per process is the paper's global batch in."""
    cfg = load_config(name, ["trainer=gpu1", "cluster=example"])
    t = cfg.trainer
    assert (t.accelerator, t.devices, t.num_nodes, t.precision) == ("gpu", 1, 1, "32")
    assert cfg.data.batch_size == 128 and t.gradient_clip_val == 1.0 and t.evaluate == "last"
    options = sbatch_options(cfg, job_name=name, output=Path("o"), error=Path("e"))
    assert "--ntasks-per-node=1" in options and "--gpus-per-node=1" in options and "--nodes=1" in options


@pytest.mark.parametrize("name, points", SWEEPS.items())
def test_the_sweeps_resolve_with_every_scheme_randomized_in_ruoss(name, points):
    sweep = load_sweep(name, only=0)
    assert len(sweep.points) == points
    schemes = [p for p in sweep.points if all(v == sweep.points[0].labels[a] for a, v in p.labels.items()
                                              if a != "scheme")]
    for point in schemes:  # every scheme of the first cell: the protocol reaches each
        cfg = sweep.config(point.index)
        assert cfg.model.architecture == "encoder_only" and cfg.task.train_size == 0
        label = point.labels["scheme"]
        randomized = "randomized" in label
        assert (cfg.model.positions.max_random_len is not None) == randomized, point.labels
        assert cfg.model.positions.randomize_at_eval == (randomized and (name.startswith("ruoss")
                                                                         or label.endswith("_eval"))), point.labels
    if name.startswith("ruoss"):  # Ruoss et al.'s grid: each encoding randomized and not, and none
        labels = {p.labels["scheme"] for p in schemes}
        assert {"none", "learned", "learned_randomized"} <= labels
        assert all(f"{label}_randomized" in labels for label in labels - {"none"} if "randomized" not in label)


@pytest.mark.parametrize("name, rates", [("deletang2023_paper", [1e-4, 3e-4, 5e-4]),
                                         ("ruoss2023_paper", [1e-4, 3e-4, 5e-4])])
def test_the_paper_sweeps_cross_three_learning_rates_with_ten_seeds(name, rates):
    sweep = load_sweep(name, only=0)
    assert {p.labels["seed"] for p in sweep.points} == {str(s) for s in range(1, 11)}
    firsts = {p.labels["lr"]: p.index for p in reversed(sweep.points)}
    assert sorted(sweep.config(i).optim.lr for i in firsts.values()) == sorted(rates)


# rope: every scheme in the encoder-only model is tests/test_encoder_only.py's, in-process
@pytest.mark.parametrize("scheme", ["shaw", pytest.param("rope", marks=pytest.mark.slow)])
def test_the_small_protocol_trains_an_encoder_only_model(tmp_path, scheme):
    out = run_cli(tmp_path, "train", "deletang2023_paper_small", "task.name=reverse_string",
                  f"model.positions.scheme={scheme}", "trainer.max_steps=20", "trainer.val_every_n_steps=20",
                  "task.eval_size_per_length=2", "task.test_lengths=[17,19]", "logging.wandb.mode=disabled",
                  "logging.root=runs")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (run,) = (tmp_path / "runs" / "deletang2023_paper_small").iterdir()
    assert run.name.startswith(f"reverse_string-{scheme}") and "encoder_only" in run.name
    results = json.loads((run / "results.json").read_text())
    assert "test/accuracy_ood" in results["metrics"]


@pytest.mark.slow  # every one of the 2,700 points is checked first: minutes
def test_the_paper_sweep_submits_as_one_slurm_array(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["sweep", "deletang2023_paper", "--slurm", "--dry-run", "trainer=gpu1",
                     "cluster.partition=gpu"]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --array=0-2699" in script and "#SBATCH --gpus-per-node=1" in script
    assert "#SBATCH --ntasks-per-node=1" in script  # one GPU per run: the batch of 128 is global
