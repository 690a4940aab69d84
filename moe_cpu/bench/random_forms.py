"""Random packed weights of every scheme and checkpoint form, for timing (the values do not change the
speed; codes are drawn directly, with no float32 copy)."""
from __future__ import annotations

import numpy as np

from .. import api
from ..forms import IQ4_NL_VALUES, MXFP4_VALUES, UNSIGNED4

# Checkpoint weight forms (GGUF), benched like schemes: name -> (scheme, group, codebook, mins).
# int4_g32 is the plain int4 kernel at the GGUF group size, the figure the int4 forms are held to.
FORMS = {
    "int4_g32": ("int4_w4a8", 32, None, False),
    "int4_pc": ("int4_w4a8", -1, None, False),
    "q4_0": ("int4_w4a8", 32, None, False),
    "q8_0": ("int8_w8a8", 32, None, False),
    "q4_k": ("int4_w4a8", 32, UNSIGNED4, True),
    "iq4_xs": ("int4_w4a8", 32, IQ4_NL_VALUES, False),
    "mxfp4": ("int4_w4a8", 32, MXFP4_VALUES, False),
    "q6_k": ("int8_w8a8", 16, None, False),
    "q5_k": ("int8_w8a8", 32, None, True),
}
GGUF_ROWS = ["int4_g32", "q4_k", "iq4_xs", "mxfp4", "int8_w8a8", "q6_k", "q5_k"]
# Forms whose files hold fp16 scales (ggml's d): exact fp16 values, so the kernels read them as the loader packs them.
HALF_SCALES = {"q4_0", "q8_0"}
# The GGUF forms and the activation blocks the loader packs them with (random_codes(..., gguf_blocks=True)): 32, 128
# for the K-quants (moe_cpu/loaders/gguf_loader.py, ACT_BLOCK).
GGUF_FORMS = {"q4_0": 32, "q8_0": 32, "q4_k": 128, "iq4_xs": 32, "mxfp4": 32, "q6_k": 128, "q5_k": 128}


def scheme_of(name: str) -> str:
    """The scheme of a bench row name (a scheme or a FORMS entry)."""
    return FORMS[name][0] if name in FORMS else name


def kquant_mins(rng, E, N, G):
    """Mins as Q4_K / Q5_K hold them: an fp16 dmin per run of 8 groups times 6-bit integers."""
    runs = -(-G // 8)
    d = (rng.random((E, N, runs, 1), dtype=np.float32) * 0.04).astype(np.float16).astype(np.float32)
    m6 = rng.integers(0, 64, (E, N, runs, 8)).astype(np.float32)
    return np.ascontiguousarray((d * m6).reshape(E, N, runs * 8)[:, :, :G])


def kquant_scales(rng, E, N, G, lo, hi):
    """Scales as K-quants and IQ4_XS hold them: an fp16 d per run of 8 groups times integers in [lo, hi]."""
    runs = -(-G // 8)
    d = (rng.random((E, N, runs, 1), dtype=np.float32) * 0.001).astype(np.float16).astype(np.float32)
    sc = rng.integers(lo, hi + 1, (E, N, runs, 8)).astype(np.float32)
    return np.ascontiguousarray((d * sc).reshape(E, N, runs * 8)[:, :, :G])


# Super-block scale integers of the forms whose files hold them (Q4_K, Q5_K: 6-bit, IQ4_XS: 6-bit - 32, Q6_K: int8).
KSCALES = {"q4_k": (0, 63), "iq4_xs": (-32, 31), "q5_k": (0, 63), "q6_k": (-128, 127)}


def random_codes(rng, scheme, E, N, K, gguf_blocks=False):
    """Random codes and scales for `scheme`, as a function that packs them (values do not matter for
    speed; no float32 copy). Timing that function times the packing alone. gguf_blocks: the GGUF forms with the
    loader's activation blocks (else one activation scale per token)."""
    shape = (E, N, K)
    if scheme in FORMS:
        sch, g, cb, with_mins = FORMS[scheme]
        G = 1 if g == -1 else K // g
        s = (kquant_scales(rng, E, N, G, *KSCALES[scheme]) if scheme in KSCALES
             else rng.random((E, N, G), dtype=np.float32) * 0.01)
        if scheme in HALF_SCALES:
            s = s.astype(np.float16).astype(np.float32)
        m = kquant_mins(rng, E, N, G) if with_mins else None
        ab = GGUF_FORMS[scheme] if gguf_blocks and scheme in GGUF_FORMS else None
        if sch == "int8_w8a8":
            lim = {"q8_0": 128, "q5_k": 16}.get(scheme, 32)  # Q8_0: 8-bit codes, Q5_K: 5-bit, Q6_K: 6-bit
            q8 = rng.integers(-lim, lim, shape, dtype=np.int16).astype(np.int8)
            return lambda: api.pack_int8(q8, s, g, mins=m, act_block=ab)
        if cb is None:
            q4 = rng.integers(-8, 8, shape, dtype=np.int8)
            return lambda: api.pack_int4(q4, s, g, act_block=ab)
        u4 = rng.integers(0, 16, shape, dtype=np.uint8)
        return lambda: api.pack_int4(u4, s, g, codebook=cb, mins=m, act_block=ab)
    if scheme in ("int4_w4a8", "int4_w4a16"):
        g = 128 if K % 128 == 0 else 32
        q, s = rng.integers(-8, 8, shape, dtype=np.int8), rng.random((E, N, K // g), dtype=np.float32) * 0.01
        return lambda: api.pack_int4(q, s, g, scheme=scheme)
    if scheme in ("int8_w8a8", "int8_w8a16"):
        q, s = rng.integers(-127, 128, shape, dtype=np.int8), rng.random((E, N), dtype=np.float32) * 0.01
        return lambda: api.pack_int8(q, s, scheme=scheme)
    if scheme == "fp8_w8a16":
        codes = rng.integers(0, 0x7E, shape, dtype=np.uint8) | (rng.integers(0, 2, shape, dtype=np.uint8) << 7)
        s = rng.random((E, -(-N // 128), -(-K // 128)), dtype=np.float32) * 0.01
        return lambda: api.pack_fp8(codes, s)
    bits = (rng.integers(0, 1 << 16, shape, dtype=np.uint16) & np.uint16(0x83FF)) | np.uint16(0x3C00)
    return lambda: api.pack_bf16(bits)


def random_packed(rng, scheme, E, N, K):
    """Packed weights from random codes."""
    return random_codes(rng, scheme, E, N, K)()


def random_block(rng, scheme, H, I, E):
    """(w13, w2) of one MoE block of random codes: w13 ``[E, 2I, H]``, w2 ``[E, H, I]``."""
    return random_packed(rng, scheme, E, 2 * I, H), random_packed(rng, scheme, E, H, I)
