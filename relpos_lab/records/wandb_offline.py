"""Read what an offline W&B run recorded, without a W&B server.

On machines without network every run is offline: one binary ``run-<id>.wandb`` file under
``wandb/offline-run-<time>-<id>/``, uploaded later by ``wandb sync``. wandb 0.31 ships no Python
reader for that file, yet it is the only evidence of what W&B will show — so tests check logged
history here, and users can inspect a run (or a cluster's worth of them) before syncing.

The format: a 7-byte header (``:W&B``, two magic bytes, a version byte), then the leveldb log
format — 32 KiB blocks of chunks, each chunk a CRC-32 (4 bytes, of type byte + data), a
little-endian length (2 bytes) and a type (1 byte: 1 full, 2 first, 3 middle, 4 last); a block's
tail shorter than a chunk header is zero padding. Each reassembled record is a serialized
``wandb.proto.wandb_internal_pb2.Record``.

A resumed run writes a new file with the same run id; `read_runs` lists them in start order and
`history` merges them into the one history W&B shows. A plain resume (``resume="allow"``, relpos_lab's
default) appends the new attempt's rows to the earlier ones. An attempt started with
``wandb.init(resume_from="<id>?_step=<k>")`` (W&B's rewind, ``logging.wandb.resume=rewind``) records
that branch point in its run record and numbers its rows from k + 1: the merged history keeps the
earlier attempts' rows up to ``_step`` k and continues with the new attempt's.

    from relpos_lab.records.wandb_offline import find_run_files, read_run
    for path in find_run_files("runs"):
        run = read_run(path)
        print(run.run_id, run.summary.get("val/acc"))

`read_run` also takes the ``offline-run-*`` directory itself, as ``wandb sync`` does.
"""

from __future__ import annotations

import json
import struct
import time
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEADER = b":W&B"
HEADER_SIZE = 7
BLOCK_SIZE = 32 * 1024
CHUNK_HEADER = struct.Struct("<IHB")  # crc32, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


class RunFileError(ValueError):
    """The file is not an offline W&B run file, or is corrupt."""


@dataclass
class OfflineRun:
    """What one offline run file recorded. History rows and values are JSON-decoded; nested
    dicts logged as ``{"a": {"b": 1}}`` come back nested. W&B's own ``_wandb`` key is left out of
    config and summary."""

    path: Path
    run_id: str
    project: str = ""
    entity: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    start_time: float = 0.0
    resumed: bool = False
    exit_code: int | None = None  # None: the process ended without finishing the run
    branch_point: tuple[str, float, str] | None = None  # (run id, value, metric) of resume_from / fork_from

    def metric(self, key: str) -> list[Any]:
        """The logged values of one history key, in order (rows without the key skipped)."""
        return [row[key] for row in self.history if key in row]


def find_run_files(root: str | Path, online: bool = False) -> list[Path]:
    """All offline run files under `root` (``**/wandb/offline-run-*/run-*.wandb``), sorted; with
    `online`, also the files online runs keep of what they sent (``**/wandb/run-<time>-<id>/``)."""
    root = Path(root)
    patterns = ["**/offline-run-*/run-*.wandb"] + (["**/run-[0-9]*/run-*.wandb"] if online else [])
    return sorted({p for pattern in patterns for p in root.glob(pattern) if p.parent.parent.name == "wandb"})


def read_records(path: str | Path) -> Iterator[Any]:
    """Yield each `wandb_internal_pb2.Record` in the run file (or its directory, `run_file`), in write order.

    A file cut short (the process was killed mid-write) yields every complete record and warns;
    a checksum mismatch inside the file is corruption and raises RunFileError.
    """
    from wandb.proto import wandb_internal_pb2

    for data in _record_bytes(run_file(path)):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        yield record


def _record_bytes(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    if len(data) < HEADER_SIZE or data[:4] != HEADER:
        raise RunFileError(f"{path}: not a W&B run file (no ':W&B' header)")
    pos, pending, truncated = HEADER_SIZE, None, False
    while pos < len(data):
        block_left = BLOCK_SIZE - pos % BLOCK_SIZE
        if block_left < CHUNK_HEADER.size:  # block tail too short for a chunk: zero padding
            pos += block_left
            continue
        if pos + CHUNK_HEADER.size > len(data):
            truncated = True
            break
        crc, length, kind = CHUNK_HEADER.unpack_from(data, pos)
        start = pos + CHUNK_HEADER.size
        end = start + length
        if kind == 0 and length == 0:  # preallocated zeros: nothing more in this block
            pos += block_left
            continue
        if end > len(data):
            truncated = True
            break
        pos = end
        chunk = data[start:end]
        if zlib.crc32(bytes([kind]) + chunk) != crc:
            raise RunFileError(f"{path}: checksum mismatch in the chunk at byte {start - CHUNK_HEADER.size}")
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = bytearray(chunk)
        elif kind in (MIDDLE, LAST) and pending is not None:
            pending += chunk
            if kind == LAST:
                yield bytes(pending)
                pending = None
        else:
            raise RunFileError(f"{path}: unexpected chunk type {kind} at byte {start - CHUNK_HEADER.size}")
    if truncated or pending is not None:
        warnings.warn(f"{path}: file ends inside a record (run killed mid-write?); read what was complete")


def run_file(path: str | Path) -> Path:
    """The run file at `path`: the ``run-<id>.wandb`` file itself, or the ``offline-run-*``
    directory holding it (what ``wandb sync`` takes), which must hold exactly one."""
    path = Path(path)
    if not path.is_dir():
        return path
    files = sorted(path.glob("*.wandb"))
    if len(files) == 1:
        return files[0]
    found = "no .wandb file" if not files else f"{len(files)} .wandb files ({', '.join(f.name for f in files)})"
    raise RunFileError(f"{path}: {found}; give an offline-run-* directory or the run-<id>.wandb file in it "
                       "(find_run_files and read_runs look for them under a run directory)")


def read_run(path: str | Path) -> OfflineRun:
    """Replay one run into its config, history rows and final summary: its ``offline-run-*``
    directory or the ``run-<id>.wandb`` file in it (`run_file`)."""
    path = run_file(path)
    run: OfflineRun | None = None
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    history: list[dict[str, Any]] = []
    exit_code = None
    for record in read_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run = OfflineRun(
                path=path, run_id=r.run_id, project=r.project, entity=r.entity, name=r.display_name,
                group=r.run_group, job_type=r.job_type, tags=list(r.tags),
                start_time=r.start_time.seconds + r.start_time.nanos / 1e9, resumed=r.resumed,
            )
            if r.HasField("branch_point") and r.branch_point.run:
                run.branch_point = (r.branch_point.run, r.branch_point.value, r.branch_point.metric)
            _apply(config, r.config.update, r.config.remove)
            _apply(summary, r.summary.update, r.summary.remove)
        elif kind == "config":
            _apply(config, record.config.update, record.config.remove)
        elif kind == "summary":
            _apply(summary, record.summary.update, record.summary.remove)
        elif kind == "history":
            row: dict[str, Any] = {}
            for item in record.history.item:
                _set(row, _key(item), _history_value(item))
            history.append(row)
        elif kind == "exit":
            exit_code = record.exit.exit_code
    if run is None:
        raise RunFileError(f"{path}: no run record; not a complete W&B run file")
    config.pop("_wandb", None)
    summary.pop("_wandb", None)
    run.config, run.summary, run.history, run.exit_code = config, summary, history, exit_code
    return run


def wait_until_complete(path: str | Path, timeout: float = 60.0) -> bool:
    """Wait until the run file holds its exit record; False if it still does not after `timeout` s.

    ``run.finish()`` can return while wandb-core is still writing the file (seen on a loaded
    machine: an empty file, or one without its run record), so a reader in the same process
    must wait for it.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a cut-short file warns while it is being written
                if read_run(path).exit_code is not None:
                    return True
        except (RunFileError, OSError):
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def read_runs(root: str | Path) -> dict[str, list[OfflineRun]]:
    """Every offline run under `root`, grouped by run id; a resumed run has several files,
    listed in the order they started (`history` merges them). A file without its run record (the
    attempt was killed before W&B wrote it) is skipped with a warning."""
    runs: dict[str, list[OfflineRun]] = {}
    for path in find_run_files(root):
        try:
            run = read_run(path)
        except RunFileError as err:
            if "no run record" not in str(err):
                raise
            # An attempt killed (with W&B's own process) before its first record reached the
            # file: it recorded nothing, so it adds nothing.
            warnings.warn(f"{err}: skipped")
            continue
        runs.setdefault(run.run_id, []).append(run)
    for parts in runs.values():
        parts.sort(key=lambda r: r.start_time)
    return runs


STEP = "trainer/global_step"  # the training step Lightning's WandbLogger adds to every row it logs


def history(attempts: list[OfflineRun]) -> list[dict[str, Any]]:
    """The one history of a run logged by several attempts (`read_runs`' list for one id).

    An attempt with a branch point on ``_step`` k in the same run (W&B's ``resume_from``: rewind)
    drops the earlier rows after ``_step`` k, as W&B does when it syncs the attempt. An attempt
    without one (a plain resume) adds its rows after theirs, as W&B does.
    """
    merged: list[dict[str, Any]] = []
    for run in attempts:
        point = run.branch_point
        if point is not None and point[0] == run.run_id and point[2] == "_step":
            merged = [row for row in merged if row.get("_step", -1) <= point[1]]
        merged.extend(run.history)
    return merged


def _key(item: Any) -> list[str]:
    return list(item.nested_key) or [item.key]


def _apply(target: dict[str, Any], updates: Any, removes: Any) -> None:
    for item in updates:
        _set(target, _key(item), _decode(item.value_json))
    for item in removes:
        parent = target
        *path, last = _key(item)
        for part in path:
            parent = parent.get(part, {})
        if isinstance(parent, dict):
            parent.pop(last, None)


def _set(target: dict[str, Any], keys: list[str], value: Any) -> None:
    for part in keys[:-1]:
        child = target.get(part)
        if not isinstance(child, dict):
            child = target[part] = {}
        target = child
    target[keys[-1]] = value


def _history_value(item: Any) -> Any:
    """History items carry either a typed value or JSON (older writers: JSON only)."""
    kind = item.WhichOneof("value")
    if kind is None:
        return _decode(item.value_json)
    if kind == "none":
        return None
    if kind == "json":
        return _decode(item.json)
    return getattr(item, kind)


def _decode(text: str) -> Any:
    return json.loads(text) if text else None
