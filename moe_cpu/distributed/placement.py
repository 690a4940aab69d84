"""Which rank holds which expert: the default split, user placements and their checks."""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

Placement = Tuple[Tuple[int, ...], ...]   # placement[r] = the global expert ids rank r holds, in order


def split_experts(num_experts: int, ranks: int) -> Placement:
    """Contiguous ranges of E // ranks or E // ranks + 1 experts; the larger ones go to the LAST ranks,
    because rank 0 also runs the shared expert."""
    E, R = num_experts, ranks
    sizes = [E // R + (r >= R - E % R) for r in range(R)] if E % R else [E // R] * R
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    return tuple(tuple(range(starts[r], starts[r + 1])) for r in range(R))


def _ints(v: object, what: str) -> List[int]:
    if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
        raise TypeError(f"{what} must be a sequence of ints, got {type(v).__name__}")
    out = []
    for x in v:
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
            raise TypeError(f"{what} must hold ints, got {type(x).__name__}")
        out.append(int(x))
    return out


def check_placement(placement: object, num_experts: int, ranks: int) -> Placement:
    """The placement as per-rank id tuples; every expert on exactly one rank.

    ``placement``: None (``split_experts``); a sequence of ``ranks`` sequences of global expert ids
    (rank r holds ``placement[r]``; a rank may hold none); or a flat sequence of E ints, the rank of
    each expert. Anything else raises TypeError / ValueError saying what is wrong.
    """
    E, R = num_experts, ranks
    if E < 1:
        raise ValueError(f"num_experts = {E} must be >= 1")
    if placement is None:
        if E < R:
            raise ValueError(f"{E} experts cannot be split over {R} ranks by default (E must be >= ranks); "
                             "pass a placement to leave some ranks without experts")
        return split_experts(E, R)
    if isinstance(placement, np.ndarray) and placement.ndim == 1 or (
            isinstance(placement, (list, tuple)) and placement and not hasattr(placement[0], "__iter__")):
        owner = _ints(placement, "placement (rank of each expert)")
        if len(owner) != E:
            raise ValueError(f"placement gives a rank for {len(owner)} experts but the layer has {E}")
        bad = [(e, r) for e, r in enumerate(owner) if not 0 <= r < R]
        if bad:
            raise ValueError(f"placement puts expert {bad[0][0]} on rank {bad[0][1]}, outside [0, {R})")
        return tuple(tuple(e for e in range(E) if owner[e] == r) for r in range(R))
    if isinstance(placement, (str, bytes)) or not hasattr(placement, "__len__"):
        raise TypeError(f"placement must be None, per-rank lists of expert ids or the rank of each expert, "
                        f"got {type(placement).__name__}")
    if len(placement) != R:
        raise ValueError(f"placement has {len(placement)} per-rank lists but the communicator has {R} ranks")
    per_rank = [_ints(p, f"placement[{r}]") for r, p in enumerate(placement)]
    where: dict = {}
    for r, ids in enumerate(per_rank):
        for e in ids:
            if not 0 <= e < E:
                raise ValueError(f"placement[{r}] holds expert {e}, outside [0, {E})")
            if e in where:
                raise ValueError(f"expert {e} is placed on two ranks ({where[e]} and {r}); each expert "
                                 "must be on exactly one rank")
            where[e] = r
    missing = [e for e in range(E) if e not in where]
    if missing:
        raise ValueError(f"expert {missing[0]} is on no rank ({len(missing)} expert(s) unplaced); each expert "
                         "must be on exactly one rank")
    return tuple(tuple(ids) for ids in per_rank)


def expert_map(held: Sequence[int], num_experts: int) -> np.ndarray:
    """int32 [E]: global id -> index in ``held``, or -1 (fused_experts' expert_map)."""
    m = np.full(num_experts, -1, np.int32)
    m[list(held)] = np.arange(len(held), dtype=np.int32)
    return m
