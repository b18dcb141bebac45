"""The offline W&B run-file reader, checked against files written by the real wandb client."""

from __future__ import annotations

from pathlib import Path

import pytest
import wandb

from relpos_lab.records.wandb_offline import (
    RunFileError,
    find_run_files,
    read_records,
    read_run,
    read_runs,
    wait_until_complete,
)

pytestmark = pytest.mark.usefixtures("offline_wandb")  # tests/conftest.py


def _log_run(root, run_id, rows, config=None, **init):
    run = wandb.init(dir=str(root), id=run_id, project="reader-test", config=config, **init)
    for row in rows:
        run.log(row)
    run.finish()
    # finish() can return while wandb-core still writes the file: wait for its exit record.
    assert wait_until_complete(Path(run.dir).parent / f"run-{run_id}.wandb")


def test_history_config_and_metadata_read_back(tmp_path):
    rows = [{"loss": 1.0 / (i + 1), "acc": i / 4, "val": {"bleu": 10.0 * i}, "note": f"s{i}"} for i in range(4)]
    _log_run(tmp_path, "abc123", rows, config={"model": {"d_model": 64}, "lr": 0.001},
             group="g1", job_type="reverse", tags=["shaw"], name="reverse-shaw")
    [path] = find_run_files(tmp_path)
    run = read_run(path)

    assert run.run_id == "abc123"
    assert (run.project, run.group, run.job_type, run.name, run.tags) == (
        "reader-test", "g1", "reverse", "reverse-shaw", ["shaw"])
    assert run.config == {"model": {"d_model": 64}, "lr": 0.001}
    assert run.metric("loss") == [1.0, 0.5, 1.0 / 3, 0.25]
    assert [r["val"]["bleu"] for r in run.history] == [0.0, 10.0, 20.0, 30.0]
    assert run.metric("note") == ["s0", "s1", "s2", "s3"]
    assert run.summary["acc"] == 0.75
    assert run.exit_code == 0


def test_an_offline_run_is_read_back_from_its_directory_as_from_its_file(tmp_path):
    """docs/wandb.md's path: the offline-run-* directory that `wandb sync` takes reads as its
    run-<id>.wandb file; a directory without one, or with two, is a clear error."""
    _log_run(tmp_path, "dir1", [{"loss": 2.0}, {"loss": 1.0}], config={"lr": 0.5})
    [path] = find_run_files(tmp_path)
    directory = path.parent
    assert directory.name.startswith("offline-run-") and directory.parent.name == "wandb"
    run = read_run(directory)
    assert (run.run_id, run.path, run.config, run.metric("loss"), run.exit_code) == (
        "dir1", path, {"lr": 0.5}, [2.0, 1.0], 0)
    assert read_run(str(directory)).history == read_run(path).history
    assert list(read_records(directory)) == list(read_records(path))
    empty = tmp_path / "wandb" / "offline-run-empty"
    empty.mkdir()
    with pytest.raises(RunFileError, match="offline-run-empty: no .wandb file; give an offline-run-"):
        read_run(empty)
    (directory / "run-other.wandb").write_bytes(path.read_bytes())
    with pytest.raises(RunFileError, match=r"2 \.wandb files \(run-dir1\.wandb, run-other\.wandb\)"):
        read_run(directory)


def test_records_spanning_several_blocks_are_reassembled(tmp_path):
    big = "x" * 100_000  # a history record ~3 blocks of 32 KiB long: first, middle, last chunks
    _log_run(tmp_path, "big1", [{"text": big, "n": 1}, {"n": 2}])
    run = read_run(find_run_files(tmp_path)[0])
    assert run.metric("text") == [big]
    assert run.metric("n") == [1, 2]


def test_config_updates_after_init_are_applied(tmp_path):
    run = wandb.init(dir=str(tmp_path), id="cfg1", project="reader-test", config={"a": 1})
    run.config.update({"b": {"c": 2}, "a": 3}, allow_val_change=True)
    run.finish()
    assert wait_until_complete(find_run_files(tmp_path)[0])
    assert read_run(find_run_files(tmp_path)[0]).config == {"a": 3, "b": {"c": 2}}


def test_resumed_run_files_are_grouped_by_id_in_start_order(tmp_path):
    _log_run(tmp_path, "same", [{"x": 1}])
    _log_run(tmp_path, "same", [{"x": 2}], resume="allow")
    _log_run(tmp_path, "other", [{"x": 9}])
    runs = read_runs(tmp_path)
    assert sorted(runs) == ["other", "same"]
    assert [part.metric("x") for part in runs["same"]] == [[1], [2]]


def test_truncated_file_yields_complete_records_and_warns(tmp_path):
    _log_run(tmp_path, "cut1", [{"x": i} for i in range(5)])
    path = find_run_files(tmp_path)[0]
    full = list(read_records(path))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 3])  # inside the last chunk
    with pytest.warns(UserWarning, match="ends inside a record"):
        cut = list(read_records(path))
    assert 0 < len(cut) < len(full)
    assert cut == full[: len(cut)]


def test_corrupt_chunk_is_an_error(tmp_path):
    _log_run(tmp_path, "bad1", [{"x": 1}])
    path = find_run_files(tmp_path)[0]
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF  # inside the first chunk's payload
    path.write_bytes(bytes(data))
    with pytest.raises(RunFileError, match="checksum mismatch"):
        list(read_records(path))


def test_a_file_that_is_not_a_run_file_is_an_error(tmp_path):
    path = tmp_path / "run-x.wandb"
    path.write_bytes(b"hello world")
    with pytest.raises(RunFileError, match="not a W&B run file"):
        read_run(path)


def test_find_run_files_looks_only_in_offline_run_folders(tmp_path):
    for rel in ("a/wandb/offline-run-1-x/run-x.wandb", "b/c/wandb/offline-run-2-y/run-y.wandb",
                "d/offline-run-3-z/run-z.wandb", "e/wandb/run-4-w/run-w.wandb"):
        (tmp_path / rel).parent.mkdir(parents=True)
        (tmp_path / rel).write_bytes(b"")
    found = [p.relative_to(tmp_path).as_posix() for p in find_run_files(tmp_path)]
    assert found == ["a/wandb/offline-run-1-x/run-x.wandb", "b/c/wandb/offline-run-2-y/run-y.wandb"]


def test_waiting_for_a_run_file_ends_at_its_exit_record(tmp_path):
    _log_run(tmp_path, "done1", [{"x": 1}])  # waits inside
    path = find_run_files(tmp_path)[0]
    assert wait_until_complete(path, timeout=0)
    cut = tmp_path / "run-cut.wandb"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # as if wandb-core were still writing
    assert not wait_until_complete(cut, timeout=0.3)
    assert not wait_until_complete(tmp_path / "run-missing.wandb", timeout=0.1)
