#!/usr/bin/env python3
"""moe_cpu.Stream.capture under a real cudaLaunchHostFunc: time per decode step against a serial loop, bit-exactness.

Needs a CUDA GPU and torch built for it (bench-only peers).

What one decode step does, on one CUDA stream, as a hybrid server's layer would:
    the GPU routes a fresh token (top-k of random logits) -> copies x, ids and weights into pinned host buffers
    -> ``cudaLaunchHostFunc(host_submit)`` -> a GPU part of T ms (``torch.cuda._sleep``) -> ``cudaLaunchHostFunc
    (host_wait)`` -> copies the capture's pinned ``out`` back to the GPU.
Modes: the steps issued eagerly on the stream, and one step recorded in a CUDA graph and replayed. Every step's
GPU result must equal the blocking ``fused_experts`` on the same inputs, bit for bit. Timing: the pipelined steps
against a serial loop (GPU part, sync, blocking call, copy back), as wall / step and as wall / max(T, t).

    python bench/stream_cuda_host.py [--steps 200] [--threads 8] [--scheme int4_w4a8]
    python bench/stream_cuda_host.py --steps 4 --threads 2 --experts 8              # a quick check
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import numpy as np

import moe_cpu
from moe_cpu.bench.random_forms import random_block

H, I, E, K = 2048, 768, 128, 8
torch = None   # imported by main: a peer of this bench only


def cudart() -> ctypes.CDLL:
    """The libcudart that torch loaded into this process (the same runtime that owns its streams)."""
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    with open("/proc/self/maps") as f:
        paths = sorted({ln.split()[-1] for ln in f if "libcudart" in ln})
    if not paths:
        raise SystemExit("no libcudart in this process: torch links the CUDA runtime statically here")
    lib = ctypes.CDLL(paths[0])
    lib.cudaLaunchHostFunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.cudaLaunchHostFunc.restype = ctypes.c_int
    print(f"# cudaLaunchHostFunc from {paths[0]}")
    return lib


def main(argv=None) -> int:
    global torch
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="decode steps per mode (default 200)")
    ap.add_argument("--threads", type=int, default=8, help="the stream's team (default 8)")
    ap.add_argument("--scheme", default="int4_w4a8", choices=moe_cpu.SCHEMES)
    ap.add_argument("--experts", type=int, default=E, help=f"experts in the block (default {E}; at least top-k {K})")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be >= 1")
    if args.experts < K:
        ap.error(f"--experts {args.experts} must be >= the top-k of {K}")
    try:
        moe_cpu.set_num_threads(args.threads)
    except ValueError as e:
        ap.error(f"--threads: {e}")
    try:
        import torch
    except ImportError:
        ap.error("needs torch with CUDA (a peer of this bench only)")
    if not torch.cuda.is_available():
        ap.error(f"needs a CUDA GPU: torch {torch.__version__} sees none (torch.cuda.is_available() is False)")
    rt = cudart()
    rng = np.random.default_rng(0)
    w13, w2 = random_block(rng, args.scheme, H, I, args.experts)
    dev = torch.device("cuda")
    n = args.steps
    g = torch.Generator(device=dev).manual_seed(1)
    xs = torch.randn(n, 1, H, device=dev, generator=g)
    logits = torch.randn(n, 1, args.experts, device=dev, generator=g)
    tw_all, ids_all = torch.topk(torch.softmax(logits, -1), K, dim=-1)
    tw_all = (tw_all / tw_all.sum(-1, keepdim=True)).contiguous()
    ids_all = ids_all.to(torch.int32).contiguous()
    pin = dict(pin_memory=True)
    x_h, tw_h = torch.empty(1, H, **pin), torch.empty(1, K, **pin)
    ids_h, out_h = torch.empty(1, K, dtype=torch.int32, **pin), torch.empty(1, H, **pin)
    # blocking-call time t (the CPU part) and a GPU part of about the same length
    x0, tw0, ids0 = xs[0].cpu().numpy(), tw_all[0].cpu().numpy(), ids_all[0].cpu().numpy()
    ts = []
    for i in range(50):
        t0 = time.perf_counter()
        moe_cpu.fused_experts(x0, w13, w2, tw0, ids0)
        ts.append(time.perf_counter() - t0)
    t_cpu = statistics.median(ts[10:])
    torch.cuda.synchronize()
    c0, e0, e1 = 1 << 22, torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record(); torch.cuda._sleep(c0); e1.record(); torch.cuda.synchronize()
    cycles = int(c0 * t_cpu * 1e3 / e0.elapsed_time(e1))
    print(f"# {torch.cuda.get_device_name()}, {args.scheme} {w13.kernel}, stream team {args.threads}; "
          f"blocking decode t = {t_cpu * 1e3:.3f} ms; GPU part T = t")
    s = torch.cuda.current_stream()
    results = {}
    with moe_cpu.Stream(args.threads) as st, st.capture(x_h.numpy(), w13, w2, tw_h.numpy(), ids_h.numpy(),
                                                         out=out_h.numpy()) as cap:
        sub, wai, ctx = ctypes.c_void_p(cap.host_submit), ctypes.c_void_p(cap.host_wait), ctypes.c_void_p(cap.context)

        def step(x, tw, ids, dst):
            x_h.copy_(x, non_blocking=True); tw_h.copy_(tw, non_blocking=True); ids_h.copy_(ids, non_blocking=True)
            assert rt.cudaLaunchHostFunc(ctypes.c_void_p(s.cuda_stream), sub, ctx) == 0
            torch.cuda._sleep(cycles)
            assert rt.cudaLaunchHostFunc(ctypes.c_void_p(s.cuda_stream), wai, ctx) == 0
            dst.copy_(out_h, non_blocking=True)

        # eager: every step issued on the stream at once, one sync at the end
        out_e = torch.empty(n, 1, H, device=dev)
        step(xs[0], tw_all[0], ids_all[0], out_e[0]); torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(n):
            step(xs[i], tw_all[i], ids_all[i], out_e[i])
        torch.cuda.synchronize()
        results["eager"] = (out_e, (time.perf_counter() - t0) / n)
        # graph: one step recorded, replayed on new inputs in its static buffers
        x_s, tw_s, ids_s, out_s = xs[0].clone(), tw_all[0].clone(), ids_all[0].clone(), torch.empty(1, H, device=dev)
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            s = torch.cuda.current_stream()
            step(x_s, tw_s, ids_s, out_s)
        s = torch.cuda.current_stream()
        torch.cuda.synchronize()
        out_g = torch.empty(n, 1, H, device=dev)
        t0 = time.perf_counter()
        for i in range(n):
            x_s.copy_(xs[i]); tw_s.copy_(tw_all[i]); ids_s.copy_(ids_all[i])
            graph.replay()
            out_g[i].copy_(out_s)
        torch.cuda.synchronize()
        results["graph"] = (out_g, (time.perf_counter() - t0) / n)
        replays, err = cap.replays, cap.last_error()
    # serial: the GPU part, then the blocking call, then the copy back
    out_r = torch.empty(n, 1, H, device=dev)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        x_h.copy_(xs[i]); tw_h.copy_(tw_all[i]); ids_h.copy_(ids_all[i])
        torch.cuda._sleep(cycles)
        torch.cuda.synchronize()
        moe_cpu.fused_experts(x_h.numpy(), w13, w2, tw_h.numpy(), ids_h.numpy(), out=out_h.numpy())
        out_r[i].copy_(out_h)
    torch.cuda.synchronize()
    serial = (time.perf_counter() - t0) / n
    print(f"# replays {replays}, last_error {err!r}")
    ref = np.stack([moe_cpu.fused_experts(xs[i].cpu().numpy(), w13, w2, tw_all[i].cpu().numpy(),
                                          ids_all[i].cpu().numpy()) for i in range(n)])
    ok = True
    for name, (out, per) in results.items():
        same = int((out.cpu().numpy() == ref).all(axis=(1, 2)).sum())
        ok &= same == n
        print(f"{name:6s}: {same}/{n} steps equal the blocking call bit for bit; {per * 1e3:.3f} ms/step, "
              f"serial {serial * 1e3:.3f} ms/step -> {serial / per:.2f}x; wall / max(T, t) {per / t_cpu:.2f}")
    ok &= bool((out_r.cpu().numpy() == ref).all())
    print("PASS" if ok and err == "" and replays == 2 * n + 1 else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
