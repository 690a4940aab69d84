"""Expert parallelism over MPI (mpi4py): each rank holds and computes its own experts, one fp32
Allreduce sums the partial outputs. ``import moe_cpu`` does not import this package; mpi4py is
imported when a communicator is used (ImportError with the install line if it is missing).

    mpirun -np 4 python -m mpi4py my_script.py       # docs/API.md, "Expert parallelism"
"""
from ._mpi import RemoteRankError
from .layer import EPMoELayer
from .placement import check_placement, expert_map, split_experts
from .threads import place_threads, threads_for_rank

__all__ = ["EPMoELayer", "RemoteRankError", "check_placement", "expert_map", "split_experts", "place_threads",
           "threads_for_rank"]
