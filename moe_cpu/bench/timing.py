"""Timing: the median of repeated calls, and the routing that keeps decode weights cold."""
from __future__ import annotations

import statistics
import time

import numpy as np


def timed(fn, min_time=0.4, max_calls=30):
    fn()
    times = []
    t_end = time.perf_counter() + min_time
    while len(times) < 3 or (time.perf_counter() < t_end and len(times) < max_calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class Routing:
    """Token -> expert ids. M=1 walks a permutation so an expert returns only every E/k calls."""

    def __init__(self, rng, E, k):
        self.rng, self.E, self.k, self.pos = rng, E, k, 0
        self.perm = rng.permutation(E)

    def next(self, M):
        if M == 1:
            if self.pos + self.k > self.E:
                self.perm, self.pos = self.rng.permutation(self.E), 0
            ids = self.perm[self.pos:self.pos + self.k][None, :]
            self.pos += self.k
        else:
            ids = np.argsort(self.rng.random((M, self.E)), axis=1)[:, :self.k]
        return np.ascontiguousarray(ids, dtype=np.int32)


def routing_pool(rng, E, k, M, n=16):
    """n routings of M tokens, as ``(ids, weights)`` with weights that sum to 1 per token; at M = 1 they walk
    Routing's permutation, so an expert comes back only every E / k routings."""
    routing, pool = Routing(rng, E, k), []
    for _ in range(n):
        ids = routing.next(M)
        tw = rng.random(ids.shape).astype(np.float32)
        pool.append((ids, tw / tw.sum(1, keepdims=True)))
    return pool


def weight_bytes(w13, w2, ids):
    used = len(np.unique(ids))
    return used * (w13.nbytes + w2.nbytes) / w13.num_experts
