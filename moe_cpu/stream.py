"""Asynchronous fused experts: ``Stream`` runs ``fused_experts`` calls on its own worker thread (and its own team
of compute threads) in submission order while the caller goes on, the CPU half of a hybrid GPU server
(docs/hybrid.md).

    with moe_cpu.Stream() as s:
        h = s.submit(x, w13, w2, topk_weights, topk_ids)   # returns at once; argument errors raise here
        ...                                                # the GPU part of the step
        y = h.wait()                                       # the output; a run-time error raises here

A task holds every array and PackedExperts it reads or writes until it has run: ``del x`` after ``submit`` is
safe. Between tasks the worker polls for ``spin_us`` microseconds, then sleeps. Where the stream's team leaves a
processor free, ``wait`` polls for ``spin_us`` plus twice the last task's run time (that part at most 0.1 s),
then sleeps.
"""
from __future__ import annotations

import atexit
import collections
import threading
import weakref
from typing import Any, Callable, Optional

import numpy as np

from . import _core
from ._dlpack import accepts_dlpack
from .api import _act_name, _bf16_bits, _int_arg, _wrap_out

__all__ = ["Stream", "PendingExperts", "Capture", "DEFAULT_SPIN_US"]

# How long an idle worker polls for the next task, and a waiter for its task, before sleeping (yielding the core
# between polls; a waiter adds twice the last task's run). On the Zen 4 VM of docs/hybrid.md a futex wake-up costs
# the woken thread 20-100 microseconds: polling 1000 us covers a GPU part of up to 1 ms between a decode step's
# tasks (submit after a 0.5 ms gap: 18-24 us, against 25-38 us with 0-200 us; bench/stream_overlap.py
# --spin-sweep). An idle stream burns at most that once per task, then sleeps.
DEFAULT_SPIN_US = 1000

_LIVE: "weakref.WeakSet[Stream]" = weakref.WeakSet()


class PendingExperts:
    """The handle ``Stream.submit`` returns: ``wait(timeout=None)`` gives the output, ``done()`` says whether
    the task has run."""

    def __init__(self, task: Any, hidden_states: Any, out: Any, inplace: bool):
        self._task, self._x, self._out, self._inplace = task, hidden_states, out, inplace
        self._dlpack_caller: Optional[Callable[[Any], Any]] = None   # set by accepts_dlpack for foreign callers

    def done(self) -> bool:
        return self._task.done()

    def wait(self, timeout: Optional[float] = None) -> Any:
        """The output ``[M, H]`` (``out`` or ``hidden_states`` with ``inplace``), once the task has run. Raises the
        task's error (the same type and message as the blocking call) on every wait, or ``TimeoutError`` when
        ``timeout`` seconds pass first (the task still runs)."""
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
            raise ValueError(f"timeout must be None or a number of seconds >= 0, got {timeout!r}")
        res = self._task.wait(-1.0 if timeout is None else float(timeout))
        if res is None:
            raise TimeoutError(f"the task has not run within {timeout} s (it is still queued or running)")
        if self._out is not None:
            res = self._out
        elif self._inplace:
            res = self._x
        else:
            res = _wrap_out(res, self._x)
        return self._dlpack_caller(res) if self._dlpack_caller else res


class Capture:
    """A ``fused_experts`` call captured on fixed buffers (``Stream.capture``), for hosts that replay a CUDA graph:
    ``host_submit`` and ``host_wait`` are the integer addresses of two C functions ``void fn(void*)`` and
    ``context`` their argument (``cudaLaunchHostFunc(stream, host_submit, context)``). Called from any OS thread,
    without Python, ``host_submit`` queues one run of the call on whatever the buffers hold at that moment and
    ``host_wait`` waits for it. They cannot raise: a replay's error is kept for ``last_error()`` ("" if none).
    The capture must outlive its use: ``free()`` (or dropping it) waits for the last replay, and a context called
    after that is refused with a message on stderr, never run."""

    def __init__(self, core: Any):
        self._core = core

    context = property(lambda self: self._core.context)
    host_submit = property(lambda self: self._core.host_submit)
    host_wait = property(lambda self: self._core.host_wait)
    out = property(lambda self: self._core.out, doc="The fixed output buffer [M, H].")
    replays = property(lambda self: self._core.replays, doc="Replays queued so far.")

    def last_error(self) -> str:
        return self._core.last_error()

    def free(self) -> None:
        """Wait for the last replay, then forget the context (idempotent)."""
        core, self._core = self._core, None
        if core is not None:
            core.free()

    def __enter__(self) -> "Capture":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()

    def __del__(self) -> None:
        if getattr(self, "_core", None) is not None:
            self.free()


class Stream:
    """A worker thread with its own compute team that runs submitted ``fused_experts`` calls in order.

    Args:
        num_threads: the team of each task (default: ``moe_cpu.get_num_threads()``). Streams and blocking
            calls run at once, each with its own threads: the counts add up (see docs/hybrid.md).
        spin_us: microseconds the idle worker polls for the next task before it sleeps (0: sleep at once). Where
            the team leaves a processor free, ``wait`` polls for ``spin_us`` plus twice the last task's run time
            (that part at most 0.1 s; none with ``spin_us=0``), then sleeps. Polls yield the core to any other
            thread that wants it.
    """

    def __init__(self, num_threads: Optional[int] = None, *, spin_us: int = DEFAULT_SPIN_US):
        n = _core.get_num_threads() if num_threads is None else _int_arg(num_threads, "num_threads")
        self._core = _core.Stream(n, _int_arg(spin_us, "spin_us"))
        self._pending: collections.deque = collections.deque()
        self._lock = threading.Lock()
        _LIVE.add(self)

    @property
    def num_threads(self) -> int:
        return self._core.num_threads

    @property
    def closed(self) -> bool:
        return self._core.closed

    @accepts_dlpack("hidden_states", "topk_weights", "topk_ids", "w13_bias", "w2_bias", "expert_map", "out",
                    bf16_from="hidden_states")
    def submit(self, hidden_states: np.ndarray, w13: Any, w2: Any, topk_weights: np.ndarray, topk_ids: np.ndarray,
               *, activation: str = "silu", apply_router_weight_on_input: bool = False,
               w13_bias: Optional[np.ndarray] = None, w2_bias: Optional[np.ndarray] = None,
               expert_map: Optional[np.ndarray] = None, out: Optional[np.ndarray] = None,
               inplace: bool = False) -> PendingExperts:
        """Queue ``fused_experts`` with exactly its arguments; returns at once with a :class:`PendingExperts`.
        Every argument check of ``fused_experts`` raises here, and then nothing is queued."""
        task = self._core.submit_fused(_bf16_bits(hidden_states), w13, w2, topk_weights, topk_ids,
                                       _act_name(activation), bool(apply_router_weight_on_input), w13_bias, w2_bias,
                                       expert_map, None if out is None else _bf16_bits(out), bool(inplace))
        p = PendingExperts(task, hidden_states, out, bool(inplace))
        self._prune(p)   # held until the task has run (the worker reads its arrays)
        return p

    def _submit_layer(self, plan: Any, x: np.ndarray) -> PendingExperts:
        """``MoELayer.submit``: the layer's C++ plan on x (checked by the layer)."""
        p = PendingExperts(self._core.submit_layer(plan, _bf16_bits(x)), x, None, False)
        self._prune(p)
        return p

    def capture(self, hidden_states: np.ndarray, w13: Any, w2: Any, topk_weights: np.ndarray, topk_ids: np.ndarray,
                *, activation: str = "silu", apply_router_weight_on_input: bool = False,
                w13_bias: Optional[np.ndarray] = None, w2_bias: Optional[np.ndarray] = None,
                expert_map: Optional[np.ndarray] = None, out: Optional[np.ndarray] = None) -> Capture:
        """Capture ``fused_experts`` with these arguments on fixed buffers (C-contiguous and writeable NumPy arrays;
        ``out`` is allocated when not given: ``Capture.out``) for replays from C (:class:`Capture`). The shapes and
        dtypes are checked here; the values at each replay (ValueError into ``last_error()``)."""
        for name, v in (("hidden_states", hidden_states), ("topk_weights", topk_weights), ("topk_ids", topk_ids),
                        ("out", out)):
            if v is not None and not isinstance(v, np.ndarray):
                raise TypeError(f"capture: {name} must be a NumPy array (a fixed buffer), got {type(v).__name__}")
        return Capture(self._core.capture_fused(_bf16_bits(hidden_states), w13, w2, topk_weights, topk_ids,
                                                _act_name(activation), bool(apply_router_weight_on_input), w13_bias,
                                                w2_bias, expert_map, _bf16_bits(out)))

    def sync(self) -> None:
        """Wait for every task submitted so far (their errors stay with their handles)."""
        self._core.sync()
        self._prune()

    def close(self) -> None:
        """Run what is queued, then end the worker; later ``submit`` raises ValueError. Idempotent."""
        self._core.close()
        self._prune()

    def _prune(self, add: Optional[PendingExperts] = None) -> None:
        """Drop the finished tasks at the front of the pending queue (then append `add`)."""
        with self._lock:
            while self._pending and self._pending[0].done():
                self._pending.popleft()
            if add is not None:
                self._pending.append(add)

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        core = getattr(self, "_core", None)
        if core is not None:
            core.close()

    def __repr__(self) -> str:
        return (f"Stream(num_threads={self.num_threads}, spin_us={self._core.spin_us}, "
                f"{'closed' if self.closed else 'open'}, {len(self._pending)} held)")


@atexit.register
def _close_streams() -> None:
    """Interpreter exit with tasks in flight: each stream runs what it has queued, then ends."""
    for s in list(_LIVE):
        s.close()
