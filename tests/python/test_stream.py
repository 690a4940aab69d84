"""moe_cpu.Stream (issue 34, stage 1): submit / wait on a worker thread, checked against the blocking call.
Errors and lifetimes as a user expects: argument errors at submit (nothing queued), run-time errors at wait
(every wait, later tasks still run), arrays held by the task, timeouts, close, exit with tasks in flight."""
import gc
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import moe_cpu
from conftest import make_moe, make_input, make_routing

E, H, I, K = 8, 128, 64, 2


@pytest.fixture(scope="module")
def moe():
    rng = np.random.default_rng(34)
    _, w13, _, w2 = make_moe(rng, {"scheme": "int4_w4a16", "group_size": 32}, E, H, I)
    return w13, w2


def inputs(seed, M=5):
    rng = np.random.default_rng(seed)
    x = make_input(rng, M, H)
    tw, ids = make_routing(rng, M, E, K)
    return x, tw, ids


def test_results_equal_the_blocking_call_in_order(moe):
    w13, w2 = moe
    calls = [inputs(s, M) for s, M in enumerate((1, 5, 33, 1, 7))]
    with moe_cpu.Stream() as s:
        handles = [s.submit(x, w13, w2, tw, ids) for x, tw, ids in calls]
        outs = [np.zeros((x.shape[0], H), np.float32) for x, _, _ in calls]
        into = [s.submit(x, w13, w2, tw, ids, out=o) for (x, tw, ids), o in zip(calls, outs)]
        s.sync()
        assert all(h.done() for h in handles + into)
    for (x, tw, ids), h, o, p in zip(calls, handles, outs, into):
        want = moe_cpu.fused_experts(x, w13, w2, tw, ids)
        np.testing.assert_array_equal(h.wait(), want)
        np.testing.assert_array_equal(h.wait(), want)   # a second wait returns the same result
        assert p.wait() is o
        np.testing.assert_array_equal(o, want)


def test_inplace_and_bf16_and_threads(moe):
    w13, w2 = moe
    x, tw, ids = inputs(3, 6)
    xb = make_input(np.random.default_rng(4), 6, H, "bfloat16")
    with moe_cpu.Stream(num_threads=1, spin_us=0) as s:
        assert s.num_threads == 1
        want = moe_cpu.fused_experts(x, w13, w2, tw, ids)
        y = x.copy()
        assert s.submit(y, w13, w2, tw, ids, inplace=True).wait() is y
        np.testing.assert_array_equal(y, want)
        got = s.submit(xb, w13, w2, tw, ids).wait()
        assert got.dtype == xb.dtype
        np.testing.assert_array_equal(got.view(np.uint16), moe_cpu.fused_experts(xb, w13, w2, tw, ids).view(np.uint16))


def test_argument_errors_raise_at_submit_and_queue_nothing(moe):
    w13, w2 = moe
    x, tw, ids = inputs(5)
    with moe_cpu.Stream() as s:
        bad = ids.copy()
        bad[1, 0] = E
        with pytest.raises(ValueError, match=r"topk_ids\[1, 0\] = 8 is out of range"):
            s.submit(x, w13, w2, tw, bad)
        x_nan = x.copy()
        x_nan[2, 3] = np.nan
        with pytest.raises(ValueError, match=r"hidden_states\[2, 3\] is not finite"):
            s.submit(x_nan, w13, w2, tw, ids)
        with pytest.raises(TypeError, match="hidden_states"):
            s.submit(x.astype(np.float64), w13, w2, tw, ids)
        a8 = moe_cpu.quantize_experts(w13.unpack(), "int4_w4a8", 32)
        with pytest.raises(ValueError, match="16-bit activations"):
            s.submit(x, a8, w2, tw, ids)
        s.sync()
        assert len(s._pending) == 0   # nothing was queued
        np.testing.assert_array_equal(s.submit(x, w13, w2, tw, ids).wait(), moe_cpu.fused_experts(x, w13, w2, tw, ids))


def test_run_time_errors_raise_at_wait_and_later_tasks_run(moe):
    w13, w2 = moe
    x, tw, ids = inputs(6)
    b13 = np.zeros((E, 2 * I), np.float32)
    b13[ids[0, 0], 5] = np.inf   # a routed expert's bias: found while computing
    with pytest.raises(ValueError) as blocking:
        moe_cpu.fused_experts(x, w13, w2, tw, ids, w13_bias=b13)
    with moe_cpu.Stream() as s:
        bad = s.submit(x, w13, w2, tw, ids, w13_bias=b13)
        good = s.submit(x, w13, w2, tw, ids)
        for _ in range(2):
            with pytest.raises(ValueError) as e:
                bad.wait()
            assert str(e.value) == str(blocking.value)
        np.testing.assert_array_equal(good.wait(), moe_cpu.fused_experts(x, w13, w2, tw, ids))


def test_task_holds_its_arrays(moe):
    w13, w2 = moe
    x, tw, ids = inputs(7, 64)
    want = moe_cpu.fused_experts(x, w13, w2, tw, ids)
    with moe_cpu.Stream() as s:
        h = s.submit(x.copy(), w13, w2, tw.copy(), ids.copy(), w13_bias=np.zeros((E, 2 * I), np.float32))
        gc.collect()
        np.testing.assert_array_equal(h.wait(), want)
        h2 = s.submit(x.copy(), *moe, tw, ids)
        del h2   # the stream keeps the task until it has run
        gc.collect()
        s.sync()


def test_timeout_raises_and_the_task_still_completes(moe):
    w13, w2 = moe
    x, tw, ids = inputs(8, 4096)
    with moe_cpu.Stream() as s:
        h = s.submit(x, w13, w2, tw, ids)
        with pytest.raises(TimeoutError, match="has not run within 0"):
            h.wait(timeout=0)
        with pytest.raises(ValueError, match="timeout"):
            h.wait(timeout=-1)
        np.testing.assert_array_equal(h.wait(timeout=600), moe_cpu.fused_experts(x, w13, w2, tw, ids))


def test_close_runs_what_is_queued_and_refuses_more(moe):
    w13, w2 = moe
    x, tw, ids = inputs(9, 256)
    s = moe_cpu.Stream()
    hs = [s.submit(x, w13, w2, tw, ids) for _ in range(3)]
    s.close()
    s.close()
    assert s.closed and all(h.done() for h in hs)
    np.testing.assert_array_equal(hs[2].wait(), moe_cpu.fused_experts(x, w13, w2, tw, ids))   # wait after close
    with pytest.raises(ValueError, match="closed"):
        s.submit(x, w13, w2, tw, ids)
    with pytest.raises(ValueError, match="num_threads"):
        moe_cpu.Stream(num_threads=0)
    with pytest.raises(ValueError, match="spin_us"):
        moe_cpu.Stream(spin_us=-1)


def test_streams_beside_blocking_calls(moe):
    w13, w2 = moe
    calls = [inputs(20 + i, 9) for i in range(6)]
    wants = [moe_cpu.fused_experts(*c[:1], w13, w2, *c[1:]) for c in calls]
    with moe_cpu.Stream(1) as a, moe_cpu.Stream(1) as b:
        ha = [a.submit(x, w13, w2, tw, ids) for x, tw, ids in calls]
        hb = [b.submit(x, w13, w2, tw, ids) for x, tw, ids in reversed(calls)]
        blocking = [moe_cpu.fused_experts(x, w13, w2, tw, ids) for x, tw, ids in calls]
        for i, w in enumerate(wants):
            np.testing.assert_array_equal(ha[i].wait(), w)
            np.testing.assert_array_equal(hb[len(calls) - 1 - i].wait(), w)
            np.testing.assert_array_equal(blocking[i], w)


@pytest.mark.parametrize("how", ["del_stream", "exit_in_flight"])
def test_dropping_a_busy_stream_or_exiting_ends_cleanly(tmp_path, how):
    code = textwrap.dedent(f"""
        import numpy as np, moe_cpu
        rng = np.random.default_rng(0)
        w13 = moe_cpu.quantize_experts(rng.standard_normal((8, 512, 256)).astype(np.float32), "int8_w8a16")
        w2 = moe_cpu.quantize_experts(rng.standard_normal((8, 256, 256)).astype(np.float32), "int8_w8a16")
        x = rng.standard_normal((2048, 256)).astype(np.float32)
        ids = np.argsort(rng.random((2048, 8)), axis=1)[:, :2].astype(np.int32)
        tw = np.full((2048, 2), 0.5, np.float32)
        s = moe_cpu.Stream()
        hs = [s.submit(x, w13, w2, tw, ids) for _ in range(4)]
        if "{how}" == "del_stream":
            del s
            print("dropped", all(h.done() for h in hs))
        print("exiting")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "exiting" in r.stdout and ("dropped True" in r.stdout or how != "del_stream"), r.stdout


def test_torch_tensors_in_and_out(moe):
    torch = pytest.importorskip("torch")
    w13, w2 = moe
    x, tw, ids = inputs(10, 3)
    with moe_cpu.Stream() as s:
        got = s.submit(torch.from_numpy(x), w13, w2, torch.from_numpy(tw), torch.from_numpy(ids)).wait()
        assert isinstance(got, torch.Tensor)
        np.testing.assert_array_equal(got.numpy(), moe_cpu.fused_experts(x, w13, w2, tw, ids))
        out = torch.zeros(3, H)
        assert s.submit(torch.from_numpy(x), w13, w2, tw, ids, out=out).wait() is out


HARNESS = r"""
#include <pthread.h>
#include <stdint.h>
#include <string.h>
typedef void (*host_fn)(void*);
struct job { host_fn submit, wait; void* ctx; float* x; const float* xs; int32_t* ids; const int32_t* idss;
             const float* out; float* outs; long n, xn, idn, on; };
static void* run(void* p) {
  struct job* j = (struct job*)p;
  for (long i = 0; i < j->n; ++i) {   /* what a graph replay does: new inputs in the fixed buffers, then the pair */
    memcpy(j->x, j->xs + i * j->xn, (size_t)j->xn * 4);
    memcpy(j->ids, j->idss + i * j->idn, (size_t)j->idn * 4);
    j->submit(j->ctx);
    j->wait(j->ctx);
    memcpy(j->outs + i * j->on, j->out, (size_t)j->on * 4);
  }
  return 0;
}
int replay(host_fn s, host_fn w, void* ctx, float* x, const float* xs, int32_t* ids, const int32_t* idss,
           const float* out, float* outs, long n, long xn, long idn, long on) {
  struct job j = {s, w, ctx, x, xs, ids, idss, out, outs, n, xn, idn, on};
  pthread_t t;
  if (pthread_create(&t, 0, run, &j)) return 1;
  return pthread_join(t, 0);
}
void call(host_fn f, void* ctx) { f(ctx); }
"""


def _harness(tmp_path):
    import ctypes
    src = tmp_path / "harness.c"
    src.write_text(HARNESS)
    lib = tmp_path / "libharness.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-pthread", str(src), "-o", str(lib)], check=True)
    return ctypes.CDLL(str(lib))


def test_capture_replays_from_a_pthread_without_python(tmp_path, moe):
    """A C thread calls (host_submit, host_wait) 1000 times, changing the fixed buffers between calls (a CUDA graph
    replay's semantics): every result equals the blocking call on those inputs."""
    import ctypes
    w13, w2 = moe
    lib = _harness(tmp_path)
    n, M = 1000, 2
    rng = np.random.default_rng(35)
    xs = rng.standard_normal((n, M, H)).astype(np.float32)
    idss = np.stack([np.argsort(rng.random((M, E)), axis=1)[:, :K] for _ in range(n)]).astype(np.int32)
    x, ids = np.zeros((M, H), np.float32), np.zeros((M, K), np.int32)
    tw = np.full((M, K), 0.5, np.float32)
    outs = np.zeros((n, M, H), np.float32)
    with moe_cpu.Stream() as s:
        with s.capture(x, w13, w2, tw, ids) as cap:
            p = ctypes.c_void_p
            fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
            rc = lib.replay(fn(cap.host_submit), fn(cap.host_wait), p(cap.context), p(x.ctypes.data),
                            p(xs.ctypes.data), p(ids.ctypes.data), p(idss.ctypes.data), p(cap.out.ctypes.data),
                            p(outs.ctypes.data), ctypes.c_long(n), ctypes.c_long(M * H), ctypes.c_long(M * K),
                            ctypes.c_long(M * H))
            assert rc == 0 and cap.replays == n and cap.last_error() == ""
    for i in range(0, n, 1):
        np.testing.assert_array_equal(outs[i], moe_cpu.fused_experts(xs[i], w13, w2, tw, idss[i]), err_msg=f"replay {i}")


def test_capture_errors_and_a_freed_context(tmp_path, moe):
    import ctypes
    w13, w2 = moe
    lib = _harness(tmp_path)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    x, tw, ids = inputs(11, 3)
    with moe_cpu.Stream() as s:
        with pytest.raises(ValueError, match="read-only"):
            ro = x.copy()
            ro.setflags(write=False)
            s.capture(ro, w13, w2, tw, ids)
        with pytest.raises(ValueError, match="contiguous"):
            s.capture(np.asfortranarray(x), w13, w2, tw, ids)
        with pytest.raises(TypeError, match="fixed buffer"):
            s.capture(x.tolist(), w13, w2, tw, ids)
        cap = s.capture(x, w13, w2, tw, ids)
        ids[0, 0] = E   # a replay on a bad id: kept for last_error, the next good replay clears it
        lib.call(fn(cap.host_submit), ctypes.c_void_p(cap.context))
        lib.call(fn(cap.host_wait), ctypes.c_void_p(cap.context))
        assert "out of range" in cap.last_error()
        ids[0, 0] = 0
        lib.call(fn(cap.host_submit), ctypes.c_void_p(cap.context))
        lib.call(fn(cap.host_wait), ctypes.c_void_p(cap.context))
        assert cap.last_error() == ""
        np.testing.assert_array_equal(cap.out, moe_cpu.fused_experts(x, w13, w2, tw, ids))
        cap.free()
        cap.free()
    # a freed context (and one that never was) is refused with a message on stderr, never run: in a subprocess,
    # to read its stderr
    code = textwrap.dedent(f"""
        import ctypes
        import numpy as np, moe_cpu
        lib = ctypes.CDLL({str(tmp_path / "libharness.so")!r})
        fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
        rng = np.random.default_rng(0)
        w13 = moe_cpu.quantize_experts(rng.standard_normal((4, 64, 64)).astype(np.float32), "int8_w8a16")
        w2 = moe_cpu.quantize_experts(rng.standard_normal((4, 64, 32)).astype(np.float32), "int8_w8a16")
        x, tw, ids = np.ones((2, 64), np.float32), np.ones((2, 1), np.float32), np.zeros((2, 1), np.int32)
        with moe_cpu.Stream() as s:
            cap = s.capture(x, w13, w2, tw, ids)
            ctx, submit, wait = cap.context, cap.host_submit, cap.host_wait
            del cap
            lib.call(fn(submit), ctypes.c_void_p(ctx))
            lib.call(fn(wait), ctypes.c_void_p(ctx))
            lib.call(fn(submit), ctypes.c_void_p(12345))
        print("survived")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and "survived" in r.stdout, r.stderr[-2000:]
    assert r.stderr.count("is not a live capture (freed?): ignored") == 3, r.stderr
