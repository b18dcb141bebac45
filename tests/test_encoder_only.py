"""model.architecture=encoder_only: the source, then one blank slot per output token.

The model of Delétang et al. (2023) and Ruoss et al. (2023). The slot counts are the reference's
`output_length` for every task of their suite; evaluation is one forward pass; a task that cannot
say its output length refuses the architecture in one line; and the whole spine (train, eval,
load_model, inspect) runs on it.
"""
from __future__ import annotations

import json
import math
import random

import pytest
import torch

from relpos_lab.api import ConfigError, ContractError, EncoderOnly, Vocabulary, load_model, registry
from relpos_lab.api.seq2seq import slot_targets
from relpos_lab.api.testing import tiny_model_config
from relpos_lab.core.positions import builtin_config
from relpos_lab.records.wandb_offline import history, read_runs
from relpos_lab_tasks.chomsky.base import ChomskyTask

from installed import run_cli

# The reference's output_length (google-deepmind/neural_networks_chomsky_hierarchy, tasks/*/*.py)
# as a function of the input length n; every other task of the suite outputs one token.
REFERENCE_OUTPUT_LENGTH = {
    "reverse_string": lambda n: n, "odds_first_string": lambda n: n, "bucket_sort": lambda n: n,
    "duplicate_string": lambda n: 2 * n, "stack_manipulation": lambda n: n + 1,
    "binary_addition": lambda n: n + 1, "binary_multiplication": lambda n: n,
    "compute_sqrt": lambda n: math.ceil(n / 2),
}
CHOMSKY = [name for name in registry.available(registry.TASKS)
           if issubclass(registry.get_task_class(name), ChomskyTask)]


def create(name: str, **fields):
    cls = registry.get_task_class(name)
    cfg = cls.config_class(name=name, **fields)
    cfg.validate()
    return cls(cfg, seed=0)


def test_the_suite_has_its_fifteen_tasks():
    assert len(CHOMSKY) == 15, CHOMSKY


@pytest.mark.parametrize("name", CHOMSKY)
def test_slot_counts_are_the_references_output_length_and_every_target_fits(name):
    task = create(name)
    rng = random.Random(0)
    for length in range(1, 41):
        for _ in range(20):
            src, tgt = task.sample(length, rng)
            slots = task.output_length(len(src))
            assert slots == REFERENCE_OUTPUT_LENGTH.get(name, lambda n: 1)(len(src)), (length, len(src))
            # a target with the paper's termination token (our EOS) needs a slot for it
            assert len(tgt) + task.scores_eos <= slots if task.scores_eos else len(tgt) == slots, (src, tgt)


@pytest.mark.parametrize("name, length", [("copy", 5), ("reverse", 5), ("sort", 5), ("odds_first", 5),
                                          ("duplicate", 10)])
def test_the_string_tasks_fill_their_slots_exactly(name, length):
    task = create(name)
    for pair in task.dataset("train")[:200]:
        assert task.output_length(len(pair.src)) == len(pair.tgt)


def test_slot_targets_drop_eos_where_the_target_fills_its_slots_and_keep_it_where_it_is_shorter():
    v = Vocabulary(["a", "b"])
    a, b, eos, pad = v.encode(["a"])[0], v.encode(["b"])[0], v.eos_id, v.pad_id
    tgt_out = torch.tensor([[a, b, eos, pad], [a, eos, pad, pad], [b, a, b, eos]])
    got = slot_targets(tgt_out, torch.tensor([2, 3, 3]), v, "t")
    assert got.tolist() == [[a, b, pad], [a, eos, pad], [b, a, b]]
    with pytest.raises(ContractError) as err:
        slot_targets(tgt_out, torch.tensor([2, 3, 2]), v, "t")
    assert str(err.value) == ("task 't': a target of 3 tokens does not fit the 2 output slots its output_length "
                              "gives its source; output_length must be at least every target's length")


def test_a_padded_batch_gives_each_row_what_it_gives_alone():
    torch.manual_seed(0)
    model = EncoderOnly(tiny_model_config(builtin_config("shaw"), "encoder_only")).double().eval()
    src = torch.tensor([[3, 4, 5, 6], [7, 8, 0, 0], [9, 0, 0, 0]])
    n_slots = torch.tensor([2, 4, 1])
    with torch.no_grad():
        batch = model(src, n_slots)
        assert batch.shape == (3, 4, 12)
        for row, (n_src, n) in enumerate([(4, 2), (2, 4), (1, 1)]):
            alone = model(src[row:row + 1, :n_src], n_slots[row:row + 1])
            assert torch.allclose(batch[row, :n], alone[0], atol=1e-12)


def test_evaluation_is_one_forward_pass_and_scores_the_slots():
    task = create("binary_addition")
    model = task.build_model(tiny_model_config(builtin_config("shaw"), "encoder_only", src_vocab_size=0,
                                               tgt_vocab_size=0))
    assert isinstance(model, EncoderOnly)
    calls = []
    model.register_forward_hook(lambda module, args, out: calls.append(args[1].tolist()))
    batch = task.collate(task.dataset("valid")[:16])
    evaluation = task.build_evaluation("valid")
    with torch.no_grad():
        hyps = task.evaluate(model.eval(), batch, evaluation)
    lengths = (batch["src"] != task.src_vocab.pad_id).sum(-1)
    assert calls == [[n + 1 for n in lengths.tolist()]]  # one pass, binary addition's n + 1 slots
    assert hyps.shape == (16, int(lengths.max()) + 1)
    assert {"accuracy", "exact_match", "token_accuracy", "loss"} <= evaluation.compute().metrics.keys()


def test_a_task_without_output_length_refuses_encoder_only_in_one_line():
    task = create("addition")  # the sum's length depends on the digits, not on the input's length
    with pytest.raises(ConfigError) as err:
        task.build_model(tiny_model_config(builtin_config("shaw"), "encoder_only", src_vocab_size=0, tgt_vocab_size=0))
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("model.architecture=encoder_only reads the output at as many slots as it has "
                                     "tokens, and task 'addition' cannot say that number from its input")


# --- the spine: train, eval, load_model, inspect -------------------------------------------------

TINY = """
extends: [reverse_shaw.yaml, overlay/debug.yaml]
task: {train_lengths: [1, 4], valid_lengths: [1, 4], test_lengths: [1, 6], train_size: 256, eval_size_per_length: 4}
model: {architecture: encoder_only, dropout: 0.0, positions: {max_distance: 4}}
logging: {root: runs}
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("encoder-only")
    (root / "tiny.yaml").write_text(TINY)
    out = run_cli(root, "train", "tiny.yaml")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (run,) = [p for p in (root / "runs").glob("*/*") if p.is_dir()]
    return root, run


def test_a_run_trains_and_its_checkpoint_evaluates_to_the_same_numbers(trained):
    root, run = trained
    assert "encoder_only" in run.name
    results = json.loads((run / "results.json").read_text())
    out = run_cli(root, "eval", str(run / results["checkpoint"]))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (evaluated,) = run.glob("eval/*-test/results.json")
    evaluated = json.loads(evaluated.read_text())
    assert evaluated["metrics"] == {k: v for k, v in results["metrics"].items() if k.startswith("test/")}
    model, config, task = load_model(run / results["checkpoint"])
    assert type(model) is EncoderOnly and config.model.architecture == "encoder_only"
    evaluation = task.build_evaluation("test")
    with torch.no_grad():
        task.evaluate(model, task.collate(list(task.dataset("test"))), evaluation)
    for name, value in evaluation.compute().metrics.items():
        assert value == pytest.approx(results["metrics"][f"test/{name}"], abs=1e-5), name


def test_wandb_holds_the_runs_training_curve_and_its_test_numbers(trained):
    _, run = trained
    (attempts,) = read_runs(run / "wandb").values()
    (attempt,) = attempts
    results = json.loads((run / "results.json").read_text())
    assert attempt.config["model"]["architecture"] == "encoder_only"
    assert any("train/loss" in row for row in history(attempts))
    assert attempt.summary["test/exact_match"] == pytest.approx(results["metrics"]["test/exact_match"])


def test_inspect_reads_the_encoders_attention(trained):
    root, run = trained
    results = json.loads((run / "results.json").read_text())
    out = run_cli(root, "inspect", str(run / results["checkpoint"]))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    inspected = json.loads((run / "inspect.json").read_text())
    assert "encoder_self" in json.dumps(inspected)
    assert "decoder_self" not in json.dumps(inspected) and "cross" not in json.dumps(inspected)


def test_a_task_without_output_length_is_refused_before_any_run_directory(tmp_path):
    out = run_cli(tmp_path, "train", "zhou2024_addition", "debug", "model.architecture=encoder_only",
                  "logging.root=runs")
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stderr.startswith("relpos-lab: error: model.architecture=encoder_only reads the output at as many "
                                 "slots as it has tokens, and task 'addition'"), out.stderr
    assert len(out.stderr.splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_wandb_samples_span_the_test_lengths_with_their_length_and_correctness(trained):
    """The samples table reaches past the training lengths: shortest, the training maximum, longest."""
    _, run = trained
    (attempts,) = read_runs(run / "wandb").values()  # the fit's, and inspect's if it ran first
    fit, table = next((a, row["samples/test"]) for a in attempts for row in a.history if "samples/test" in row)
    logged = json.loads((fit.path.parent / "files" / table["path"]).read_text())
    assert logged["columns"] == ["length", "source", "target", "prediction", "correct"]
    lengths = [row[0] for row in logged["data"]]
    assert lengths == sorted(lengths) and {1, 4, 6} <= set(lengths)  # test 1–6, trained on 1–4
    assert all(row[4] == (row[2] == row[3]) for row in logged["data"])
