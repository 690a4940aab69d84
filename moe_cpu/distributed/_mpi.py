"""mpi4py on use (``import moe_cpu`` never imports it) and the error agreement every collective call
makes before its data moves."""
from __future__ import annotations

import zlib
from typing import Any, Optional

import numpy as np


class RemoteRankError(RuntimeError):
    """Raised on every rank of a collective call when another rank failed in it."""


def mpi() -> Any:
    """The ``mpi4py.MPI`` module, or an ImportError that says how to get it."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError("moe_cpu.distributed needs mpi4py and an MPI library: apt-get install openmpi-bin "
                          f"libopenmpi-dev && pip install mpi4py ({e})") from None
    return MPI


def check_comm(comm: object) -> Any:
    """``comm`` if it is an mpi4py intracommunicator, else TypeError."""
    MPI = mpi()
    if not isinstance(comm, MPI.Intracomm):
        raise TypeError(f"comm must be an mpi4py intracommunicator (e.g. MPI.COMM_WORLD), got {type(comm).__name__}")
    return comm


def digest(*arrays: np.ndarray) -> int:
    """CRC32 of the arrays' bytes (routing agreement between ranks)."""
    h = 0
    for a in arrays:
        h = zlib.crc32(np.ascontiguousarray(a).view(np.uint8).reshape(-1), h)
    return h


def agree(comm: Any, exc: Optional[BaseException], what: str, **values: int) -> None:
    """Collective: every rank learns whether any rank failed, and whether ``values`` match everywhere.

    One Allreduce(MAX) of [failed, v, -v, ...] (int64). If some rank failed, the failing rank re-raises
    its exception and every other rank raises RemoteRankError naming it (the messages travel in an
    allgather that only this error path pays). Values that differ between ranks raise ValueError on
    every rank. So no rank is left waiting in a later collective.
    """
    MPI = mpi()
    st = np.array([exc is not None] + [s * int(v) for v in values.values() for s in (1, -1)], np.int64)
    comm.Allreduce(MPI.IN_PLACE, st, op=MPI.MAX)
    if st[0]:
        msgs = comm.allgather(None if exc is None else f"{type(exc).__name__}: {exc}")
        if exc is not None:
            raise exc
        bad = [(r, m) for r, m in enumerate(msgs) if m is not None]
        raise RemoteRankError(f"{what} failed on rank {bad[0][0]} ({bad[0][1]})"
                              + (f" and on {len(bad) - 1} more rank(s)" if len(bad) > 1 else ""))
    for i, name in enumerate(values):
        if st[1 + 2 * i] != -st[2 + 2 * i]:
            raise ValueError(f"{what}: {name} differs between ranks (from {-st[2 + 2 * i]} to {st[1 + 2 * i]}); "
                             "every rank must make the same call with the same inputs")
