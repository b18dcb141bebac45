"""The rendezvous of a distributed run: bounded in time, and one line naming the address when it fails.

Before training, every process of a DDP run meets the others at one address: torch.distributed's
env:// rendezvous, a TCPStore that global rank 0 serves at MASTER_ADDR:MASTER_PORT (under SLURM,
Lightning's SLURMEnvironment makes that the job's first node and 15000 + the job id's last 4
digits, unless MASTER_ADDR / MASTER_PORT are set). A process that cannot reach it (a node name
that does not resolve, a port nothing listens on, a rank 0 that never started) retried for
Lightning's 30-minute process-group timeout, one c10d warning per retry, and rank 0 waited as long
for the others. Here torch's own bound, the process group's `timeout` (Lightning's
`DDPStrategy(timeout=...)`), is `trainer.rendezvous_timeout_seconds` while the processes meet, and
what torch raises when it expires (DistNetworkError, DistStoreError) becomes one UserError naming
the address, the rank and what to check.

Once every process has joined, the process group and its store get Lightning's timeout back for
the rest of the run: a barrier in which the other ranks wait for rank 0's `prepare_data` (a corpus
to tokenize) or a checkpoint write must not fail after the rendezvous's few minutes.

In a quiet run (no -v) c10d's own lines while waiting (a warning per retry, the C++ stack of the
timeout) are held back: shown after a rendezvous that succeeds, dropped for one that fails, whose
one line says what they would have said. With -v they come as they are written.
"""
from __future__ import annotations

import os
import re
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from omegaconf import DictConfig

from relpos_lab.api.errors import UserError
from relpos_lab.training.progress import is_quiet

SETTING = "trainer.rendezvous_timeout_seconds"


class BoundedRendezvousDDP(DDPStrategy):
    """Lightning's DDPStrategy whose processes wait `rendezvous_timeout` for each other at the start."""

    def __init__(self, rendezvous_timeout: timedelta, **kwargs: Any) -> None:
        self.collective_timeout = kwargs.pop("timeout", default_pg_timeout)
        super().__init__(timeout=rendezvous_timeout, **kwargs)
        self.rendezvous_timeout = rendezvous_timeout

    def setup_distributed(self) -> None:
        if dist.is_available() and dist.is_initialized():  # validate/test after fit: the group is there
            return super().setup_distributed()
        try:
            with _held_stderr(enabled=is_quiet()):  # met: what c10d and Lightning printed meanwhile is shown
                super().setup_distributed()
        except dist.DistError as err:
            if dist.is_initialized():
                raise
            raise UserError(self._failure(err)) from err
        _restore_timeout(self.collective_timeout)

    def _failure(self, err: dist.DistError) -> str:
        """One line: which rank, the address it tried, what torch found, what to check."""
        host, port = self.cluster_environment.main_address, self.cluster_environment.main_port
        rank, world = self.global_rank, self.world_size
        waited = f"{self.rendezvous_timeout.total_seconds():g} s"
        set_by = "MASTER_ADDR / MASTER_PORT, under SLURM the job's first node"
        longer = f"{SETTING} sets the wait"
        text = (str(err).strip().splitlines() or [type(err).__name__])[0].rstrip(".")
        joined = re.search(r"(\d+)/\d+ clients joined", text)
        if rank == 0 and isinstance(err, dist.DistStoreError) and joined:
            return (f"rank 0 of {world} waited {waited} at its rendezvous, {host}:{port}, and {joined.group(1)} of "
                    f"{world} processes joined: check that every process started, that {host} resolves and port "
                    f"{port} is open from every node ({set_by}); {longer}")
        if rank != 0 and isinstance(err, dist.DistNetworkError) and "timed out" in text.lower():
            cause = "nothing answered there" if _resolves(host, port) else f"{host} does not resolve here"
            return (f"rank {rank} of {world} could not reach the rendezvous at {host}:{port} within {waited} "
                    f"({cause}): check that {host} is rank 0's node and resolves here, that rank 0 started and that "
                    f"port {port} is open between the nodes ({set_by}); {longer}")
        return (f"rank {rank} of {world}: the rendezvous at {host}:{port} failed ({text}): check that {host} is rank "
                f"0's node and that no other job uses port {port} there ({set_by}); {longer}")


def ddp_strategy(cfg: DictConfig) -> str | BoundedRendezvousDDP:
    """What build_trainer passes as `strategy`: the config's name, or for DDP (named, or the one
    Lightning's "auto" picks for several processes) that strategy with a bounded rendezvous."""
    t = cfg.trainer
    name = t.strategy
    if name == "auto":  # Lightning's own choice (AcceleratorConnector._choose_strategy)
        if t.num_nodes > 1:
            name = "ddp"
        elif t.devices > 1:
            name = "ddp_fork" if hasattr(sys, "ps1") or sys.flags.interactive else "ddp"
    entry = StrategyRegistry[name] if name in StrategyRegistry else None  # (.get would build it)
    if entry is None or entry["strategy"] is not DDPStrategy or not _timeout_restorable():
        return t.strategy
    return BoundedRendezvousDDP(timedelta(seconds=t.rendezvous_timeout_seconds), **entry["init_params"])


def _resolves(host: str, port: int) -> bool:
    try:
        socket.getaddrinfo(host, port)
    except OSError:
        return False
    return True


def _timeout_restorable() -> bool:
    """Whether this torch has the private setters `_restore_timeout` needs; without them the
    rendezvous keeps Lightning's own timeout rather than leave every collective a short one."""
    try:
        from torch.distributed.distributed_c10d import _get_default_store, _set_pg_timeout  # noqa: F401
    except ImportError:
        return False
    return True


def _restore_timeout(timeout: timedelta) -> None:
    """Collectives, and the store they may wait on, get `timeout` back (torch has no public setter;
    tests/test_distributed.py checks both functions used here still exist)."""
    from torch.distributed import PrefixStore
    from torch.distributed.distributed_c10d import _get_default_store, _set_pg_timeout

    _set_pg_timeout(timeout)
    store = _get_default_store()
    while isinstance(store, PrefixStore):
        store = store.underlying_store
    store.set_timeout(timeout)


@contextmanager
def _held_stderr(enabled: bool) -> Iterator[None]:
    """File descriptor 2 (c10d's C++ lines and Python's stderr alike) into a temporary file while
    the processes meet, written out afterwards unless the rendezvous failed."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as file:
        os.dup2(file.fileno(), 2)
        show = True
        try:
            yield
        except dist.DistError:
            show = dist.is_initialized()  # the one line says it; otherwise not ours to hide
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if show:
                file.seek(0)
                data = memoryview(file.read())
                while data:
                    data = data[os.write(2, data):]
