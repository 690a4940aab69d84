"""Threads per rank: ranks that share a host must not oversubscribe its cores."""
from __future__ import annotations

import os
from typing import Any

from .. import api
from ._mpi import mpi


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask: mpirun --bind-to, taskset, numactl)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        return os.cpu_count() or 1


def ranks_on_this_host(comm: Any) -> int:
    """How many ranks of ``comm`` share this host (collective: MPI_Comm_split_type SHARED)."""
    MPI = mpi()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return local.Get_size()
    finally:
        local.Free()


def threads_for_rank(comm: Any) -> int:
    """Threads for this rank (collective).

    OMP_NUM_THREADS set: as set (the user decided). A rank bound to a subset of the cores (mpirun
    ``--bind-to core|numa|socket`` with ``--map-by ...:PE=n``, or OMP_PLACES / taskset): all cores of
    its mask, which mpirun keeps disjoint between ranks. Unbound (the mask is every core, as with
    ``--bind-to none`` or oversubscription): the host's cores divided by the ranks on this host.
    """
    local = ranks_on_this_host(comm)
    if os.environ.get("OMP_NUM_THREADS"):
        return api.get_num_threads()
    cores, total = usable_cores(), os.cpu_count() or 1
    if cores < total:
        return cores
    return max(1, total // local)


def place_threads(comm: Any) -> int:
    """``set_num_threads(threads_for_rank(comm))``; returns the count."""
    n = threads_for_rank(comm)
    api.set_num_threads(n)
    return n
