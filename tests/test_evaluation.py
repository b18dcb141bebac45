"""Evaluation: the task metrics overall and per length bucket, on hand-made predictions."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from relpos_lab.api import Seq2SeqTask, TaskConfig, Vocabulary
from relpos_lab.api.evaluation import Evaluation
from relpos_lab.api.seq2seq import align

PAD, EOS = Vocabulary.pad_id, Vocabulary.eos_id


class _Symbols(Seq2SeqTask):
    def build_vocab(self) -> Vocabulary:
        return Vocabulary("abcdef")


def evaluation(buckets=(1, 2, 3)) -> Evaluation:
    return Evaluation(_Symbols(TaskConfig(name="symbols")).build_metrics(), buckets)


def test_metrics_are_exact_overall_and_per_length_bucket():
    # References (EOS = 2, pad = 0) and predictions, bucketed by source length 1, 1, 2, 3.
    target = torch.tensor([[4, EOS, PAD, PAD], [5, EOS, PAD, PAD], [4, 5, EOS, PAD], [4, 5, 6, EOS]])
    preds = torch.tensor([[4, EOS, PAD, PAD], [6, EOS, PAD, PAD], [4, 5, EOS, PAD], [4, 6, 6, EOS]])
    ev = evaluation()
    ev.update(preds, target, lengths=torch.tensor([1, 1, 2, 3]))
    result = ev.compute()
    assert result.metrics["exact_match"] == pytest.approx(2 / 4)
    assert result.metrics["token_accuracy"] == pytest.approx(9 / 11)  # 11 reference tokens, 2 wrong
    assert result.by_length == {
        1: {"exact_match": 0.5, "token_accuracy": pytest.approx(3 / 4), "n": 2.0},
        2: {"exact_match": 1.0, "token_accuracy": 1.0, "n": 1.0},
        3: {"exact_match": 0.0, "token_accuracy": 0.75, "n": 1.0},
    }


def test_metrics_accumulate_over_batches_and_reset():
    ev = evaluation()
    ev.update(torch.tensor([[4, EOS]]), torch.tensor([[4, EOS]]), lengths=torch.tensor([1]))
    ev.update(torch.tensor([[5, EOS]]), torch.tensor([[4, EOS]]), lengths=torch.tensor([1]))
    assert ev.compute().by_length[1]["exact_match"] == 0.5
    ev.reset()
    ev.update(torch.tensor([[4, EOS]]), torch.tensor([[4, EOS]]), lengths=torch.tensor([1]))
    assert ev.compute().metrics["exact_match"] == 1.0


def test_buckets_without_examples_are_left_out():
    ev = evaluation(buckets=(1, 2, 3))
    ev.update(torch.tensor([[4, EOS]]), torch.tensor([[4, EOS]]), lengths=torch.tensor([1]))
    assert set(ev.compute().by_length) == {1}


def test_a_length_without_bucket_is_an_error():
    ev = evaluation(buckets=(1, 2))
    with pytest.raises(ValueError, match="length 7 has no bucket"):
        ev.update(torch.tensor([[4, EOS]]), torch.tensor([[4, EOS]]), lengths=torch.tensor([7]))


def test_without_buckets_there_is_no_by_length():
    ev = evaluation(buckets=None)
    ev.update(torch.tensor([[4, EOS]]), torch.tensor([[4, EOS]]), lengths=torch.tensor([1]))
    assert ev.compute().by_length is None


def test_nll_is_token_weighted_and_gives_perplexity():
    ev = evaluation()
    ev.update(torch.tensor([[4, EOS]]), torch.tensor([[4, EOS]]), lengths=torch.tensor([1]))
    ev.update_nll(torch.tensor(3.0), torch.tensor(1))
    ev.update_nll(torch.tensor(3.0), torch.tensor(3))  # mean (3 + 3) / 4 tokens
    metrics = ev.compute().metrics
    assert metrics["loss"] == pytest.approx(1.5) and metrics["ppl"] == pytest.approx(torch.tensor(1.5).exp().item())


def test_a_prediction_longer_than_its_reference_does_not_match():
    target = torch.tensor([[4, 5, EOS]])
    longer = align(torch.tensor([[4, 5, 6, EOS]]), target.shape[1], PAD)
    shorter = align(torch.tensor([[4, EOS]]), target.shape[1], PAD)
    assert longer.tolist() == [[4, 5, 6]] and shorter.tolist() == [[4, EOS, PAD]]
    ev = evaluation()
    ev.update(torch.cat((longer, shorter)), target.repeat(2, 1), lengths=torch.tensor([2, 2]))
    assert ev.compute().metrics["exact_match"] == 0.0


def test_list_arguments_are_split_by_bucket_too():
    from torchmetrics import MetricCollection
    from torchmetrics.text import CharErrorRate

    ev = Evaluation(MetricCollection({"cer": CharErrorRate()}), buckets=(1, 2))
    ev.update(["ab", "xy"], ["ab", "ab"], lengths=torch.tensor([1, 2]))
    by_length = ev.compute().by_length
    assert by_length[1]["cer"] == 0.0 and by_length[2]["cer"] == 1.0


def test_length_generalization_summaries_average_buckets_inside_and_beyond_training():
    from relpos_lab.api.evaluation import length_generalization

    by_length = {1: {"exact_match": 1.0, "n": 4}, 2: {"exact_match": 0.5, "n": 4}, 3: {"exact_match": 0.75, "n": 9},
                 4: {"exact_match": 0.25, "n": 4}, 5: {"exact_match": 0.0, "n": 4}}
    summary = length_generalization(by_length, (2, 3))  # length 1 is shorter than training: neither
    assert summary == {"exact_match_id": pytest.approx(0.625), "exact_match_ood": pytest.approx(0.125)}
    assert length_generalization({"2": {"acc": 1.0}}, (2, 3)) == {"acc_id": 1.0}  # JSON keys are strings
    assert length_generalization(by_length, None) == {}


def test_probe_from_hand_made_predictions_to_summary():
    """Bucketing + metrics + summary on predictions whose right answers are known by hand."""
    from relpos_lab.api.evaluation import length_generalization

    target = torch.tensor([[4, EOS, PAD], [4, 5, EOS], [4, 5, EOS], [5, 4, EOS]])
    preds = torch.tensor([[4, EOS, PAD], [4, 5, EOS], [4, 4, EOS], [5, 5, EOS]])
    ev = evaluation(buckets=(1, 2))
    ev.update(preds, target, lengths=torch.tensor([1, 2, 2, 2]))
    result = ev.compute()
    assert result.by_length[1]["exact_match"] == 1.0
    assert result.by_length[2]["exact_match"] == pytest.approx(1 / 3)
    assert result.by_length[2]["token_accuracy"] == pytest.approx(7 / 9)
    summary = length_generalization(result.by_length, (1, 1))
    assert summary["exact_match_id"] == 1.0 and summary["exact_match_ood"] == pytest.approx(1 / 3)
    assert summary["token_accuracy_ood"] == pytest.approx(7 / 9)


RANKS_SCRIPT = """
import sys, torch, torch.distributed as dist, torch.multiprocessing as mp
from torchmetrics import MetricCollection, SumMetric
from relpos_lab.api.evaluation import Evaluation

def main(rank, store):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    ev = Evaluation(MetricCollection({"total": SumMetric()}))
    if rank == 0:  # rank 1's shard of the split is empty
        ev.update(torch.tensor([1.0, 2.0]), lengths=torch.tensor([1, 1]))
        ev.update_nll(torch.tensor(6.0), torch.tensor(3))
    sys.stdout.write(f"{rank} {sorted(ev.compute().metrics.items())}\\n")  # one write: ranks share the pipe
    sys.stdout.flush()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(main, args=(sys.argv[1],), nprocs=2)
"""


def test_a_rank_without_examples_computes_what_the_others_compute(tmp_path):
    """The NLL is synced only if every rank computes it: a rank that saw no batch must too, or
    the ranks' collectives pair up wrongly (a hang, or another metric's values)."""
    (tmp_path / "ranks.py").write_text(RANKS_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(tmp_path / "ranks.py"), str(tmp_path / "store")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = sorted(line for line in out.stdout.splitlines() if line[:2] in ("0 ", "1 "))
    want = "[('loss', 2.0), ('ppl', 7.38905609893065), ('total', 3.0)]"
    assert lines == [f"0 {want}", f"1 {want}"]
