"""A disk that fills during a run costs one line: it names the file, the room left and needed, and
the checkpoint kept; nothing good is replaced by a partial file, and the same command resumes once
there is room. The end-to-end test fills a 4 MB tmpfs in a private mount namespace (`unshare -m`,
where the platform allows it); the unit test injects the failure torch.save turns ENOSPC into."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from relpos_lab import cli  # imports Lightning, whose log handler then holds pytest's stream, not a test's
from relpos_lab.api.files import atomic_write_with

from test_train import TINY, run_dir_of


def test_a_write_that_fails_for_lack_of_room_names_its_file_and_keeps_the_old_one(tmp_path):
    target = tmp_path / "last.ckpt"
    target.write_bytes(b"the good checkpoint")

    def torch_save_on_a_full_disk(file):
        file.write(b"partial")
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:  # what torch's zip writer raises as it closes after a failed write
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1137664 vs 1137556")

    with pytest.raises(OSError) as failed:
        atomic_write_with(target, torch_save_on_a_full_disk)
    assert (failed.value.errno, failed.value.filename) == (errno.ENOSPC, str(target))
    assert target.read_bytes() == b"the good checkpoint" and [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def _can_mount_tmpfs(where: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=1M tmpfs {where}"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.slow  # two runs of the default model, ~40 s; tests/test_extend.py injects ENOSPC in the default tier
def test_a_disk_that_fills_mid_run_is_one_line_and_the_run_resumes_after(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    if not _can_mount_tmpfs(mount):
        pytest.skip("no private tmpfs here (unshare -m and mount need the rights a container may lack)")
    train = (f"{sys.executable} -m relpos_lab train reverse_shaw trainer.max_steps=100 trainer.val_every_n_steps=50 "
             f"trainer.log_every_n_steps=50 logging.root={mount}/runs")
    script = f"""
        mount -t tmpfs -o size=4M tmpfs {mount}
        OMP_NUM_THREADS=1 {train} > {tmp_path}/full.out 2> {tmp_path}/full.err; echo $? > {tmp_path}/full.rc
        ls {mount}/runs/reverse_shaw/*/checkpoints > {tmp_path}/kept.txt
        mount -o remount,size=64M {mount}
        OMP_NUM_THREADS=1 {train} > {tmp_path}/again.out 2> {tmp_path}/again.err; echo $? > {tmp_path}/again.rc
        ls {mount}/runs/reverse_shaw/*/ > {tmp_path}/after.txt
    """
    subprocess.run(["unshare", "-m", "sh", "-c", script], check=True, timeout=600, cwd=tmp_path)
    err = (tmp_path / "full.err").read_text()
    assert (tmp_path / "full.rc").read_text().strip() == "2", err
    (line,) = err.strip().splitlines()
    assert "No space left on device" in line and "MB free; a checkpoint takes" in line, line
    assert "last.ckpt (step 50), is intact" in line and "run the same command to resume" in line, line
    assert (tmp_path / "kept.txt").read_text().split() == ["last.ckpt"]  # no partial file beside it
    assert (tmp_path / "again.rc").read_text().strip() == "0", (tmp_path / "again.err").read_text()[-2000:]
    assert "resuming from last.ckpt" in (tmp_path / "again.out").read_text()
    assert "results.json" in (tmp_path / "after.txt").read_text().split()


# Files a run writes besides its checkpoints, and whether the disk fills at a later write of it
# (the good file written before must survive) or at its first; always once a checkpoint exists.
WRITERS = {
    "metrics.csv": True,  # flushed at each checkpoint and at the end
    "results.json": False,
    "by_length_exact_match.png": False,  # plots/
    "inspect.json": False,
}


@pytest.mark.parametrize("name", [n if n in ("metrics.csv", "inspect.json") else pytest.param(n, marks=pytest.mark.slow)
                                  for n in WRITERS])  # an appended file and a file written whole, by default
def test_a_full_disk_at_any_writer_is_one_line_keeps_the_good_file_and_the_run_resumes(name, tmp_path, monkeypatch,
                                                                                      capsys):
    (tmp_path / "tiny.yaml").write_text(TINY)
    monkeypatch.chdir(tmp_path)
    args = ["train", "tiny.yaml", "logging.wandb.mode=disabled", "logging.inspect=true"]
    real_fsync, written = os.fsync, {}  # name -> its content when last written whole

    def fsync(fd: int) -> None:  # every writer of a run ends a write with it (api/files.py)
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target.endswith(f"/{name}") or f"/.{name}." in target:  # appended to, or written beside and renamed
            if (name in written or not WRITERS[name]) and list(tmp_path.glob("runs/*/*/checkpoints/*.ckpt")):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_fsync(fd)
            written[name] = Path(target).read_bytes()
            return
        real_fsync(fd)

    monkeypatch.setattr("relpos_lab.api.files.os.fsync", fsync)
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("relpos-lab: error: cannot write "), err
    assert f"/{name}: No space left on device (" in err and "run the same command" in err, err
    run_dir = run_dir_of(tmp_path)
    assert "), is intact: make room" in err  # training was done: its last checkpoint is kept
    final = next(run_dir.rglob(name), None)
    assert (final.read_bytes() if final else None) == written.get(name)  # the good file as it was, or none
    assert not list(run_dir.rglob("*.tmp")) and not (run_dir / "results.json").exists()

    monkeypatch.setattr("relpos_lab.api.files.os.fsync", real_fsync)  # room again: the same command finishes
    assert cli.main(args) == 0, capsys.readouterr().err[-3000:]
    assert (run_dir / "results.json").is_file() and next(run_dir.rglob(name)).stat().st_size > 0
