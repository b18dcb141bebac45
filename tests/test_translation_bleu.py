"""Corpus BLEU and chrF: exactly sacrebleu's, over batches, length buckets and DDP ranks."""
from __future__ import annotations

import json
import random

import pytest
import sacrebleu
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from sacrebleu.metrics import BLEU, CHRF

from relpos_lab_tasks.translation.bleu import CorpusEvaluation, CorpusScore, data_signature

from toy_translation import toy_corpus

SRC, REFS = toy_corpus(120, seed=3)
REFS = [r.replace("kato", "Kätzchen 🐈") for r in REFS]  # text beyond ASCII travels intact


def corrupt(sentence: str, rng: random.Random) -> str:
    words = sentence.split()
    for _ in range(rng.randint(0, 3)):
        words[rng.randrange(len(words))] = rng.choice(["la", "hundo", "vidas", "xyz"])
    return " ".join(words[: rng.randint(len(words) // 2, len(words))])


_rng = random.Random(0)
HYPS = [corrupt(r, _rng) for r in REFS]
BUCKETS = [1, 10, 16]


def source_bucket(i: int) -> int:
    n = len(SRC[i].split())
    return max(b for b in BUCKETS if b <= n)


def feed(evaluation: CorpusEvaluation, indices: list[int], batch: int = 16) -> None:
    for start in range(0, len(indices), batch):
        rows = indices[start: start + batch]
        evaluation.update([HYPS[i] for i in rows], [REFS[i] for i in rows], torch.tensor(rows),
                          [SRC[i] for i in rows], lengths=torch.tensor([source_bucket(i) for i in rows]))


def evaluation() -> CorpusEvaluation:
    from torchmetrics import MetricCollection

    return CorpusEvaluation(MetricCollection({"corpus": CorpusScore()}), BUCKETS)


def test_bleu_and_chrf_equal_sacrebleus_corpus_scores_and_carry_its_signatures():
    ev = evaluation()
    order = list(range(len(REFS)))
    random.Random(1).shuffle(order)
    feed(ev, order + order[:10])  # any order, and repeats (a padded sampler's) count once
    result = ev.compute()
    assert result.metrics["bleu"] == sacrebleu.corpus_bleu(HYPS, [REFS]).score
    assert result.metrics["chrf"] == sacrebleu.corpus_chrf(HYPS, [REFS]).score
    assert 5 < result.metrics["bleu"] < 95  # a corpus that tests the n-gram statistics
    bleu, chrf = BLEU(), CHRF()
    bleu.corpus_score(HYPS, [REFS]), chrf.corpus_score(HYPS, [REFS])
    assert result.details == {"bleu_signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature()),
                              "data_signature": data_signature(SRC, REFS)}
    assert result.details["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert result.outputs == {"hyp": HYPS, "ref": REFS, "src": SRC}  # back in split order


def test_data_signature_names_the_scored_sentences_and_changes_with_any_of_them():
    signature = data_signature(SRC, REFS)
    assert signature.startswith(f"sentences:{len(SRC)}|sha256:")
    assert data_signature(SRC, REFS) == signature
    assert data_signature(SRC, REFS[:-1] + [REFS[-1] + "."]) != signature  # one reference changed
    assert data_signature(SRC[1:] + SRC[:1], REFS[1:] + REFS[:1]) != signature  # another order


def test_per_length_scores_are_sacrebleus_on_each_bucket():
    ev = evaluation()
    feed(ev, list(range(len(REFS))))
    by_length = ev.compute().by_length
    for bucket in BUCKETS:
        rows = [i for i in range(len(REFS)) if source_bucket(i) == bucket]
        if rows:
            expected = sacrebleu.corpus_bleu([HYPS[i] for i in rows], [[REFS[i] for i in rows]]).score
            assert by_length[bucket]["bleu"] == expected and by_length[bucket]["n"] == len(rows)
        else:
            assert bucket not in by_length


def test_averaging_batch_bleu_would_not_give_corpus_bleu():
    """Why the text is gathered: BLEU of the whole is not the mean of the parts."""
    halves = [sacrebleu.corpus_bleu(HYPS[s], [REFS[s]]).score for s in (slice(0, 60), slice(60, None))]
    assert abs(sum(halves) / 2 - sacrebleu.corpus_bleu(HYPS, [REFS]).score) > 0.01


def _rank(rank: int, world: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    # Uneven shards, as the unrepeated sampler of the final evaluation gives; rank 1 sees no long source.
    long_ones = [i for i in range(len(REFS)) if source_bucket(i) == 16]
    others = [i for i in range(len(REFS)) if i not in long_ones]
    shard = long_ones + others[: len(others) // 3] if rank == 0 else others[len(others) // 3:]
    ev = evaluation()
    feed(ev, shard, batch=7)
    result = ev.compute()
    if rank == 0:
        with open(out, "w") as handle:
            json.dump({"metrics": result.metrics, "by_length": result.by_length, "hyp": result.outputs["hyp"]}, handle)
    dist.destroy_process_group()


@pytest.mark.integration
def test_two_ddp_processes_give_the_scores_of_one(tmp_path):
    out = tmp_path / "ddp.json"
    mp.spawn(_rank, args=(2, f"file://{tmp_path / 'init'}", str(out)), nprocs=2, join=True)
    ddp = json.loads(out.read_text())
    single = evaluation()
    feed(single, list(range(len(REFS))))
    result = single.compute()
    assert ddp["metrics"] == result.metrics and ddp["hyp"] == HYPS
    assert {int(k): v for k, v in ddp["by_length"].items()} == result.by_length
