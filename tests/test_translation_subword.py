"""The subword vocabulary: SentencePiece with the framework's ids, trained once and cached."""
from __future__ import annotations

import threading
import time

import pytest

from relpos_lab.api import Vocabulary
from relpos_lab.api.errors import UserError
from relpos_lab_tasks import subword
from relpos_lab_tasks.subword import SubwordConfig, load_or_train
from relpos_lab_tasks.translation.task import TranslationConfig, TranslationTask

from toy_translation import toy_corpus, write_toy_files

SRC, TGT = toy_corpus(300, seed=1)
SMALL = SubwordConfig(vocab_size=60)


def no_training(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a cached subword model was trained again")

    monkeypatch.setattr(subword, "train", refuse)


def test_the_second_run_reuses_the_cached_model_and_trains_nothing(tmp_path, monkeypatch):
    model, trained = load_or_train(SMALL, SRC, TGT, tmp_path)
    assert trained and len(list(tmp_path.glob("spm-*.model"))) == 1
    no_training(monkeypatch)
    again, trained = load_or_train(SMALL, SRC, TGT, tmp_path)
    assert not trained and again.proto == model.proto


@pytest.mark.parametrize("change", ["settings", "corpus"])
def test_other_settings_or_another_corpus_get_their_own_model(tmp_path, change):
    load_or_train(SMALL, SRC, TGT, tmp_path)
    cfg, src = (SubwordConfig(vocab_size=50), SRC) if change == "settings" else (SMALL, SRC[:-1])
    _, trained = load_or_train(cfg, src, TGT, tmp_path)
    assert trained and len(list(tmp_path.glob("spm-*.model"))) == 2


def test_piece_ids_are_the_frameworks_token_ids_and_decoding_inverts_encoding(tmp_path):
    model, _ = load_or_train(SMALL, SRC, TGT, tmp_path)
    vocab = model.vocabulary()
    assert len(vocab) == len(model) and vocab.symbols[:4] == list(Vocabulary.SPECIALS)
    assert model.sp.pad_id() == Vocabulary.pad_id and model.sp.eos_id() == Vocabulary.eos_id
    ids = model.encode([SRC[0], TGT[0]])
    assert all(i >= len(Vocabulary.SPECIALS) for seq in ids for i in seq)
    assert [model.detokenize(seq) for seq in ids] == [SRC[0], TGT[0]]
    # decode is every vocabulary's: the symbols up to EOS, without BOS, as the task's Vocabulary gives them
    framed = [Vocabulary.bos_id, *ids[1], Vocabulary.eos_id, *ids[0]]
    assert model.decode(framed) == vocab.decode(framed) == [vocab.symbols[i] for i in ids[1]]
    assert model.detokenize(framed) == TGT[0]


def test_other_ranks_wait_for_rank_zeros_model_instead_of_training(tmp_path, monkeypatch):
    def rank_zero():
        time.sleep(0.5)
        load_or_train(SMALL, SRC, TGT, tmp_path)

    thread = threading.Thread(target=rank_zero)
    thread.start()
    real_train = subword.train
    monkeypatch.setattr(subword, "train", lambda *a: real_train(*a) if threading.current_thread() is thread
                        else pytest.fail("rank 1 trained"))
    model, trained = load_or_train(SMALL, SRC, TGT, tmp_path, rank=1, wait_seconds=60)
    thread.join()
    assert not trained and len(model) > 4


def test_a_rank_that_waits_in_vain_says_so(tmp_path):
    with pytest.raises(UserError, match="waited 1s for rank 0 to train the subword model"):
        load_or_train(SMALL, SRC, TGT, tmp_path, rank=1, wait_seconds=1)


def test_a_vocabulary_smaller_than_the_alphabet_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="cannot train the subword model"):
        load_or_train(SubwordConfig(vocab_size=8), SRC, TGT, tmp_path)


def test_the_task_caches_its_model_in_the_data_dir_and_a_checkpoint_state_needs_no_corpus(tmp_path, monkeypatch):
    data = write_toy_files(tmp_path / "toy", {"train": 300, "valid": 10, "test": 10})
    cfg = TranslationConfig(name="translation", corpus="files", data_dir=str(data), tgt_lang="xx", subword=SMALL)
    first = TranslationTask(cfg)
    size = len(first.vocab)
    assert list((data / "subword").glob("spm-*.model"))
    no_training(monkeypatch)
    assert len(TranslationTask(cfg).vocab) == size  # a second run: cached
    state = first.state_dict()
    for path in data.glob("*.en"):
        path.unlink()  # neither corpus nor cache is needed once the state is restored
    restored = TranslationTask(cfg)
    restored.load_state_dict(state)
    assert restored.vocab.symbols == first.vocab.symbols
    assert restored.detokenize(restored.encode_input(SRC[0])) == SRC[0]
