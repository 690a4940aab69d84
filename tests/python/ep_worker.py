"""Run under mpirun by test_distributed.py: `python ep_worker.py CASE... [--checkpoint DIR]`.

Each case checks EPMoELayer on every rank against the single-process MoELayer built from the same
seeded float weights (and against moe_cpu.reference through layer.reference), asserts, and prints
"rank R ok CASE". Any assertion error ends the run with a traceback (and MPI_Abort via -m mpi4py).
"""
import os
import sys

import numpy as np
from mpi4py import MPI

import moe_cpu
from moe_cpu import reference as ref
from moe_cpu.distributed import EPMoELayer, RemoteRankError

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
H, I, M = 64, 32, 13


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def weights(E, seed=0, shared=False):
    rng = np.random.default_rng(seed)
    w = dict(gate=rng.standard_normal((E, H), dtype=np.float32),
             w13=rng.standard_normal((E, 2 * I, H), dtype=np.float32) * 0.1,
             w2=rng.standard_normal((E, H, I), dtype=np.float32) * 0.1)
    if shared:
        w.update(shared_w13=rng.standard_normal((2 * I, H), dtype=np.float32) * 0.1,
                 shared_w2=rng.standard_normal((H, I), dtype=np.float32) * 0.1)
    return w


def tokens(m=M, seed=1, dtype=np.float32):
    x = np.random.default_rng(seed).standard_normal((m, H), dtype=np.float32)
    return x if dtype == np.float32 else ref.float_to_bf16_bits(x)   # uint16 bf16 bits


def ok(case):
    print(f"rank {rank} ok {case}", flush=True)


def expect(exc_types, fn, needle=""):
    try:
        fn()
    except exc_types as e:
        assert needle in str(e), f"{needle!r} not in {e!r}"
        return e
    raise AssertionError(f"expected {exc_types}")


# ----------------------------------------------------------------------------------------- cases
CONFIGS = [  # (scheme, group_size, layer options)
    ("int4_w4a8", 32, dict(top_k=2)),
    ("int8_w8a8", None, dict(top_k=3, renormalize=True, w13_bias=True)),
    ("bf16", None, dict(top_k=2, shared=True, routed_scaling_factor=2.5)),
    ("int4_w4a8", 32, dict(top_k=2, shared=True, gated=True)),   # Qwen2-MoE's sigmoid shared-expert gate
    ("fp8_w8a16", None, dict(top_k=2, use_grouped_topk=True, num_expert_group=2, topk_group=1,
                             scoring_func="sigmoid", correction=True)),
]


def layer_args(E, opts, seed=0):
    opts = dict(opts)
    w = weights(E, seed, shared=opts.pop("shared", False))
    rng = np.random.default_rng(seed + 7)
    if opts.pop("w13_bias", False):
        w.update(w13_bias=rng.standard_normal((E, 2 * I), dtype=np.float32) * 0.1,
                 w2_bias=rng.standard_normal((E, H), dtype=np.float32) * 0.1)
    if opts.pop("gated", False):
        w["shared_expert_gate"] = rng.standard_normal(H, dtype=np.float32) * 0.3
    if opts.pop("correction", False):
        w["e_score_correction_bias"] = rng.standard_normal(E, dtype=np.float32) * 0.1
    w.update(opts)
    return w


def case_match(E_list=(7, 8)):
    """Every scheme and routing option, fp32 and bf16 x, against the single-process layer."""
    for E in E_list:
        for scheme, g, opts in CONFIGS:
            if E % opts.get("num_expert_group", 1):   # grouped routing needs groups that divide E
                continue
            kw = layer_args(E, opts)
            full = moe_cpu.MoELayer.from_float(scheme=scheme, group_size=g, **kw)
            ep = EPMoELayer.from_float(comm=comm, scheme=scheme, group_size=g, **kw)
            exact = EPMoELayer.from_float(comm=comm, scheme=scheme, group_size=g, exact=True, **kw)
            assert ep.w13.num_experts == len(ep.experts) == len(moe_cpu.distributed.split_experts(E, size)[rank])
            for dtype in (np.float32, np.uint16):
                x = tokens(dtype=dtype)
                want, got = full(x), ep(x)
                assert got.dtype == want.dtype and got.shape == want.shape
                if dtype == np.float32:
                    assert rel(got, want) <= 1e-6, (scheme, E, rel(got, want))
                else:
                    # EP rounds the fp32 all-reduced sum once: exactly its fp32 result rounded to bf16
                    g32, w32 = ref.bf16_bits_to_float(got), ref.bf16_bits_to_float(want)
                    assert np.array_equal(got, ref.float_to_bf16_bits(ep(ref.bf16_bits_to_float(x))))
                    # MoELayer rounds once (then within 1 bf16 ulp), or twice with a shared expert (routed
                    # sum, then + shared: an error of the routed part's ulp, so a norm-wise bound there)
                    if "shared" in opts:
                        assert rel(g32, w32) <= 2.0 ** -7, (scheme, rel(g32, w32))
                    else:
                        tol = 2.0 ** -7 * np.maximum(np.abs(g32), np.abs(w32)) + 1e-6 * np.abs(w32).max()
                        assert np.all(np.abs(g32 - w32) <= tol), scheme
                assert np.array_equal(ep(x), got), "repeated call not bitwise identical"
                assert np.array_equal(exact(x), want), f"exact mode differs from MoELayer ({scheme}, E={E})"
            x = tokens()
            r_ep, r_full = ep.reference(x), full.reference(x)
            assert rel(r_ep, r_full) < 1e-12, rel(r_ep, r_full)
            assert rel(ep(x), r_full) < 0.1   # quantized activations vs float64: loose, but a real check
    ok("match")


def case_placement():
    """User placements: per-rank lists (uneven, any order), rank per expert, a rank with no experts."""
    E = 6
    kw = layer_args(E, dict(top_k=2))
    full = moe_cpu.MoELayer.from_float(scheme="int8_w8a8", **kw)
    x = tokens()
    lists = [[5]] + [[e for e in range(5) if e % (size - 1) == r] for r in range(size - 1)]
    owner = [(e * 7) % size for e in range(E)]
    empty = [[]] + [list(range(E)) if r == 1 else [] for r in range(1, size)]
    for pl in (lists, owner, empty):
        ep = EPMoELayer.from_float(comm=comm, placement=pl, scheme="int8_w8a8", **kw)
        assert rel(ep(x), full(x)) <= 1e-6
        assert (ep.w13 is None) == (len(ep.experts) == 0)
    ok("placement")


def case_idle_rank():
    """Rank 1's experts get no token in this batch (router bias pushes them out): its partial is 0."""
    E = 8
    kw = layer_args(E, dict(top_k=2))
    pl = [[0, 1, 2, 3]] + [[e for e in range(4, E) if e % (size - 1) == r - 1] for r in range(1, size)]
    kw["gate_bias"] = np.where(np.arange(E) < 4, 0, -1e4).astype(np.float32)
    full = moe_cpu.MoELayer.from_float(scheme="int4_w4a8", group_size=32, **kw)
    ep = EPMoELayer.from_float(comm=comm, placement=pl, scheme="int4_w4a8", group_size=32, **kw)
    x = tokens()
    _, ids = ep.router.route(x)
    assert ids.max() < 4
    if rank > 0:
        assert not np.any(ep._partial(x, *ep.router.route(x)))
    assert rel(ep(x), full(x)) <= 1e-6
    ok("idle_rank")


def case_m0():
    E = 5
    kw = layer_args(E, dict(top_k=2, shared=True))
    ep = EPMoELayer.from_float(comm=comm, scheme="int8_w8a8", **kw)
    exact = EPMoELayer.from_float(comm=comm, scheme="int8_w8a8", exact=True, **kw)
    for layer in (ep, exact):
        out = layer(np.zeros((0, H), np.float32))
        assert out.shape == (0, H) and out.dtype == np.float32
    ok("m0")


def case_errors():
    """A rank that raises inside a call: it re-raises, the others get RemoteRankError, nobody hangs,
    and the layer still works afterwards. Mismatched inputs raise on every rank."""
    E = 5
    kw = layer_args(E, dict(top_k=2))
    ep = EPMoELayer.from_float(comm=comm, scheme="int8_w8a8", **kw)
    x = tokens()
    bad = tokens()[:, :H - 1].copy() if rank == 1 else x
    e = expect((ValueError, RemoteRankError), lambda: ep(bad))
    assert isinstance(e, ValueError if rank == 1 else RemoteRankError), repr(e)
    if rank != 1:
        assert "rank 1" in str(e) and "H=64" in str(e), str(e)
    expect(ValueError, lambda: ep(tokens(m=M + rank)), "M differs between ranks")
    expect(ValueError, lambda: ep(tokens(seed=rank)), "routing differs between ranks")
    full = moe_cpu.MoELayer.from_float(scheme="int8_w8a8", **kw)
    assert rel(ep(x), full(x)) <= 1e-6   # still usable
    # construction: bad placements raise the same ValueError everywhere; a failure on one rank reaches all
    expect(ValueError, lambda: EPMoELayer.from_float(comm=comm, placement=[[0, 1]] * size, **kw), "two ranks")
    expect(ValueError, lambda: EPMoELayer.from_float(comm=comm, placement=[[0]] + [[]] * (size - 1), **kw),
           "on no rank")
    expect(ValueError, lambda: EPMoELayer.from_float(comm=comm, placement=[0] * (E - 1), **kw), "rank for 4")
    bad_kw = dict(kw, top_k=2 if rank else 99, scheme="int8_w8a8")
    e = expect((ValueError, RemoteRankError), lambda: EPMoELayer.from_float(comm=comm, **bad_kw))
    assert isinstance(e, RemoteRankError if rank else ValueError), repr(e)
    ok("errors")


def case_threads():
    """Ranks on one host share its cores: threads x local ranks <= cores (unless OMP_NUM_THREADS)."""
    EPMoELayer.from_float(comm=comm, scheme="int8_w8a8", **layer_args(size, dict(top_k=1)))
    n, cores = moe_cpu.get_num_threads(), os.cpu_count()
    total = comm.allreduce(n)
    assert total <= max(cores, size), (n, total, cores)
    ok("threads")


def case_checkpoint(path):
    """from_pretrained with comm: each rank packs ~1/ranks of the layer; same output as one process."""
    full = moe_cpu.MoELayer.from_pretrained(path, 1)
    ep = EPMoELayer.from_pretrained(path, 1, comm=comm)
    routed = ep.w13.nbytes + ep.w2.nbytes
    share = len(ep.experts) / full.num_experts
    assert abs(routed / (full.w13.nbytes + full.w2.nbytes) - share) < 1e-9, (routed, share)
    x = tokens()
    assert rel(ep(x), full(x)) <= 1e-6
    sizes = comm.gather(routed)
    if rank == 0:
        print(f"routed bytes per rank {sizes} of {full.w13.nbytes + full.w2.nbytes}", flush=True)
    ok("checkpoint")


def case_abort():
    """Rank 1 raises outside any moe_cpu call while rank 0 waits in one: -m mpi4py must MPI_Abort."""
    ep = EPMoELayer.from_float(comm=comm, scheme="int8_w8a8", **layer_args(4, dict(top_k=2)))
    if rank == 1:
        raise RuntimeError("rank 1 fails outside the layer")
    ep(tokens())


if __name__ == "__main__":
    args = sys.argv[1:]
    ckpt = None
    if "--checkpoint" in args:
        i = args.index("--checkpoint")
        ckpt = args[i + 1]
        del args[i:i + 2]
    for case in args:
        if case == "checkpoint":
            case_checkpoint(ckpt)
        else:
            globals()[f"case_{case}"]()
