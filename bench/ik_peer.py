#!/usr/bin/env python3
"""moe_cpu against ik_llama.cpp on the same GGUF files: time and error of one Qwen3-30B-A3B- or DeepSeek-V3-shaped MoE block.

What it builds
    One-layer GGUF models written with gguf-py, by ``--block``:
    qwen3-30b-a3b (default): ``qwen3moe``, H = 2048, 128 experts, expert FFN 768, top-8, softmax routing
        renormalized over the chosen 8 (Qwen3-30B-A3B's MoE block); 2 query heads and 1 KV head of 128.
    deepseek-v3: ``deepseek2``, H = 7168, expert FFN 2048, top-8 of 256 experts cut to 32 by default
        (``--experts``; the F16 base file of 256 would be 22 GB) in 8 groups, DeepSeek-V3's routing: sigmoid
        scores plus a correction bias choose the 4 groups with the best sum of their top 2, then the top 8 in
        them; weights the unbiased scores renormalized and scaled by 2.5; one shared expert of 2048. MLA
        attention with DeepSeek-V3's ranks (q 1536, kv 512, rope 64) but 2 heads. ik_llama.cpp's deepseek2
        graph ignores the expert groups (a plain top-8 of the biased scores); moe_cpu follows the file.
    Everything llama.cpp needs to load the model is there but kept tiny: a byte-level SPM vocabulary of 259
    tokens, all norms 1. Weights are Gaussian with scale 1/sqrt(fan_in); experts are written in F16
    (``--base-dtype f32`` for F32), the rest in F32. Each base file is quantized with the peer's
    ``llama-quantize --pure <TYPE>`` (every 2-D tensor gets TYPE; llama-quantize keeps the router
    ``ffn_gate_inp`` and the 1-D norms in F32, and the script prints the types it finds; IQ1_S, IQ1_M, IQ2_XXS,
    IQ2_XS and IQ2_S, which llama-quantize refuses without an importance matrix, get one of ones: every weight
    equally important). A twin model is
    built the same way with the same seeds, everything equal except that the expert FFN is 32 wide (its
    down rows are then not whole 256-blocks, so for k-quant / IQ4_XS types llama-quantize gives the twin's
    down tensor a fallback type: Q5_0, Q6_0, Q8_0 or IQ4_NL; printed). Files are cached under ``--work-dir``
    (by shape, seed and type) and reused across runs.

What it times (median over ``--reps`` rounds after warm-up; ik and moe_cpu interleaved in every round)
    Each ratio is also given from the best round of each call ("best-of"): on a shared host other work only
    adds time to a call, so the fastest of many interleaved rounds is each engine's least disturbed time
    (ik's: the fastest full call minus the fastest twin call).
    Inputs change from call to call (ik: the next M tokens of a random pool; moe_cpu: 8 random inputs per
    M in turn), so decode calls route to other experts each time instead of re-reading cache-hot ones. Both
    engines run OpenMP teams whose idle threads spin after a call, so the script pauses 20 ms whenever it
    switches engine and, for calls under 50 ms, makes untimed calls for 2 ms (at least one) before 3 timed ones:
    with one untimed call, the first timed calls after the pause ran 5-10% slow on a Zen 5 VM.
    ik:      one ``llama_decode`` of a batch of M tokens (positions 0..M-1, KV cache cleared before each call,
             every token asks for its output so that no row is dropped before the FFN) on the full model,
             MINUS the same call on the 32-wide twin in the same round. What is left is ik's MoE time beyond
             the router: attention, norms, router logits, softmax / top-k, the output head and the graph
             overhead cancel; the twin still does 32/768 (deepseek-v3: 32/2048, its shared expert too) of
             the expert work, so the difference leaves that small part out (it favours ik slightly). The run-time options that matter for MoE are tried in
             every combination given by ``--ik-configs`` (default: run-time repack ``rtr`` = model param
             ``repack_tensors`` off/on x fused MoE up/gate ``fmoe`` = context param ``fused_moe_up_gate``
             off/on; the wheel's other defaults are kept and printed) and the best is reported per M.
             ``muge=1`` (model param ``merge_up_gate_exps``) can be added to a config; it corrupts the heap
             on the 32-wide twin in this wheel, so with it the twin is loaded without it.
    moe_cpu: ``MoELayer.from_pretrained(file, layer_idx=0)`` on the same quantized file (it reads the GGUF
             blocks losslessly and by default quantizes activations in blocks of 32: ggml's Q8_0, finer than its
             Q8_K for the K-quants and IQ4_XS; ``layer.act_blocks``; ``--act-block`` another block, e.g. 256,
             ggml's Q8_K, which ik's run-time repack uses),
             called on M random float32 rows [M, 2048] with ``moe_cpu.set_num_threads(--threads)``. This
             includes moe_cpu's router (logits, softmax, top-k), which the ik number does not; the column
             "mc exp" times ``moe_cpu.fused_experts`` alone on precomputed routing for comparison.
    read:    the host's read bandwidth in the same rounds (``moe_cpu._core.ReadBuffer``: aligned loads over a
             1 GiB first-touched buffer in huge pages with --threads threads, the best of 2 passes per round and M,
             after the same pause),
             so each M also gets "mc exp % bw" and "ik % bw": the expert bytes the call touches (the expected
             distinct experts of M random routings; moe_cpu's packing, ik's GGUF blocks) per second of the call,
             as a share of that median bandwidth. ``--no-bw`` leaves the probe out.

What it measures for error (relative L2 of the MoE block output, over the M rows)
    The reference is float64 NumPy: the quantized file's expert tensors (gate / up / down, and the shared
    expert's) and router dequantized with ``gguf.quants.dequantize`` (ik's own types: ik's
    ``dequantize_row_<type>``), routing from float64 router logits through ``moe_cpu.select_experts`` with the
    block's settings (for ik on deepseek-v3: its plain top-8, so that its error is its quantization's),
    experts through ``moe_cpu.reference.fused_experts_float64``, the shared expert in NumPy. The input rows
    are ik's own FFN input: a separate ik context with an eval callback (``cb_eval`` in llama_context_params)
    copies the graph tensors ``ffn_inp_normed-0`` (deepseek2: ``ffn_norm-0``; the ffn_norm output, the MoE
    block's input) and the MoE output (``routed_out-0``; deepseek2: ``ffn_out-0``, routed plus shared, before
    the residual add) during one decode of M tokens. ik's error compares that output with the reference on
    those rows; moe_cpu's error compares ``layer(rows)`` with the same reference.

The peer (bench-only, never a runtime dependency: moe_cpu never imports it; this script puts ``--ik-dir``
first on sys.path for itself only)
    pip install --no-deps --target /tmp/ikpeer ik-llama-cpp-python==0.1.5
    (an AVX2 build of ik_llama.cpp's libllama / libggml with a ctypes API in ``ik_llama_cpp`` and the
    ``llama-quantize`` binary in ``ik_llama_cpp/bin``). The script runs that command itself when
    ``--ik-dir`` holds no copy (``--no-install`` only prints it).

Usage
    python bench/ik_peer.py --small                                  # tiny shape, a quick check of the plumbing
    python bench/ik_peer.py --block deepseek-v3 --types Q2_K,IQ2_XXS --m 1,128 --ik-configs 'rtr=0,fmoe=1;rtr=1,fmoe=1'
    python bench/ik_peer.py --types Q4_0,Q8_0,Q4_K,IQ4_XS,Q5_K,Q6_K --m 1,128,512 --threads 2 --out r.json
    MOE_CPU_ISA=avx2 python bench/ik_peer.py ...                     # moe_cpu on its AVX2 tier (as ik's wheel)
    python bench/ik_peer.py --prepare-only                           # only write and quantize the GGUF files
    python bench/ik_peer.py --small --list-nodes                     # print ik's graph nodes (name, op, shape)
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import struct
import subprocess
import sys
import time
import zlib
from dataclasses import asdict, dataclass, replace
from typing import Dict, List, Optional, Tuple

import numpy as np

IK_PACKAGE = "ik-llama-cpp-python==0.1.5"
# the GGUF types moe_cpu's loader reads (moe_cpu/loaders/gguf_loader.py's _QUANT and _FLOAT; a test keeps them equal)
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4",
         "Q2_K", "Q3_K", "TQ1_0", "TQ2_0", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
         "Q6_0", "IQ2_K", "IQ3_K", "IQ4_K", "IQ5_K", "IQ4_KS", "IQ2_KS", "IQ4_KSS", "IQ5_KS", "IQ3_KS", "IQ2_KL",
         "IQ1_KT", "IQ2_KT", "IQ3_KT", "IQ4_KT",
         "BF16", "F16", "F32")
DEFAULT_TYPES = "Q4_0,Q8_0,Q4_K,IQ4_XS,Q5_K,Q6_K"
DEFAULT_CONFIGS = "rtr=0,fmoe=1;rtr=1,fmoe=1;rtr=0,fmoe=0;rtr=1,fmoe=0"
IN_NAME = "ffn_inp_normed-0"                            # the MoE block's input (after ffn_norm)
OUT_NAMES = ("routed_out-0", "ffn_moe_out-0")           # the routed experts' output, before the residual add
SHORT_S, INNER, WARM_S = 0.05, 3, 0.002                 # calls under 50 ms: untimed calls for 2 ms, then 3 timed
POOL = 8                                                # moe_cpu inputs per M, used in turn


# ------------------------------------------------------------------------------------------------ shapes
@dataclass(frozen=True)
class Shape:
    H: int = 2048            # hidden
    E: int = 128             # experts
    I: int = 768             # expert FFN
    I_twin: int = 32         # the twin's expert FFN
    top_k: int = 8
    n_head: int = 2          # attention kept tiny; n_head * head_dim must be a multiple of 256 (k-quants)
    n_head_kv: int = 1
    head_dim: int = 128
    n_vocab: int = 259       # <unk> <s> </s> + 256 byte tokens
    arch: str = "qwen3moe"
    # DeepSeek-V3 (deepseek2): sigmoid scores, correction bias, groups, scaled weights, one shared expert of width I
    n_group: int = 0         # expert groups (0: plain top-k)
    topk_group: int = 0      # groups kept per token
    n_shared: int = 0        # shared experts (their FFN: n_shared * I, as llama.cpp's n_ff_exp * n_expert_shared)
    scale: float = 1.0       # routed_scaling_factor
    q_lora: int = 0          # MLA ranks (deepseek2 only; attention cancels out in full - twin)
    kv_lora: int = 0

    def tag(self, I: int) -> str:
        base = f"H{self.H}_E{self.E}_I{I}_k{self.top_k}"
        return base if self.arch == "qwen3moe" else f"ds_{base}_g{self.n_group}_{self.topk_group}"

    @property
    def io_names(self) -> Tuple[str, Tuple[str, ...]]:
        """ik's graph nodes holding the MoE block's input and output (routed experts, plus the shared expert)."""
        if self.arch == "deepseek2":
            return "ffn_norm-0", ("ffn_out-0",)
        return IN_NAME, OUT_NAMES


QWEN3 = Shape()
QWEN3_SMALL = Shape(H=256, E=8, I=256, top_k=2)
# DeepSeek-V3's MoE block: H 7168, expert FFN 2048, 8 of 256 experts in 8 groups (top 4 groups by the sum of their
# best 2 biased scores), sigmoid scores renormalized over the chosen 8 and scaled by 2.5, one shared expert of 2048.
# E is cut to 32 (4 per group) by default (--experts): the F16 base file of 256 would be 22 GB. MLA attention with
# DeepSeek-V3's ranks (q 1536, kv 512, rope 64, nope 128, v 128) but 2 heads.
DEEPSEEK = Shape(H=7168, E=32, I=2048, top_k=8, n_head=2, n_head_kv=2, head_dim=192, arch="deepseek2",
                 n_group=8, topk_group=4, n_shared=1, scale=2.5, q_lora=1536, kv_lora=512)
DEEPSEEK_SMALL = Shape(H=256, E=16, I=256, top_k=4, n_head=2, n_head_kv=2, head_dim=192, arch="deepseek2",
                       n_group=8, topk_group=4, n_shared=1, scale=2.5, q_lora=256, kv_lora=512)
BLOCKS = {"qwen3-30b-a3b": (QWEN3, QWEN3_SMALL), "deepseek-v3": (DEEPSEEK, DEEPSEEK_SMALL)}


# ------------------------------------------------------------------------------------------------ GGUF
def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _gauss(seed: int, name: str, shape: Tuple[int, ...], fan_in: int, dtype) -> np.ndarray:
    """N(0, 1/fan_in) of ``shape`` in ``dtype``, drawn slice by slice (the expert tensors are ~200M values)."""
    rng, out = _rng(seed, name), np.empty(shape, dtype)
    s = np.float32(1.0 / np.sqrt(fan_in))
    for i in range(shape[0]):
        out[i] = rng.standard_normal(shape[1:], dtype=np.float32) * s
    return out


def write_base(path: str, sh: Shape, I: int, seed: int, base_dtype: str) -> None:
    """A one-layer MoE GGUF (``sh.arch``) with expert FFN ``I``; everything but the experts is the same for any I
    (deepseek2: the shared expert is n_shared * I wide, as llama.cpp reads it, so the twin's is narrow too)."""
    import gguf

    H, E, hd = sh.H, sh.E, sh.head_dim
    ds = sh.arch == "deepseek2"
    edt = np.float16 if base_dtype == "f16" else np.float32
    tmp = path + ".part"
    w = gguf.GGUFWriter(tmp, sh.arch)
    w.add_name(f"ik_peer one-layer {sh.arch} {sh.tag(I)}")
    w.add_context_length(4096)
    w.add_embedding_length(H)
    w.add_block_count(1)
    w.add_feed_forward_length(I)
    w.add_head_count(sh.n_head)
    w.add_head_count_kv(sh.n_head_kv)
    w.add_key_length(hd)
    w.add_value_length(128 if ds else hd)
    w.add_rope_freq_base(1e6 if not ds else 1e4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(E)
    w.add_expert_used_count(sh.top_k)
    w.add_expert_feed_forward_length(I)
    if ds:
        w.add_rope_dimension_count(64)
        w.add_q_lora_rank(sh.q_lora)
        w.add_kv_lora_rank(sh.kv_lora)
        w.add_leading_dense_block_count(0)
        w.add_expert_shared_count(sh.n_shared)
        w.add_expert_weights_scale(sh.scale)
        w.add_expert_weights_norm(True)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_group_count(sh.n_group)
        w.add_expert_group_used_count(sh.topk_group)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if base_dtype == "f16" else gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    w.add_token_list(toks)
    w.add_token_scores([0.0] * len(toks))
    w.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
                      + [gguf.TokenType.BYTE] * 256)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    ones = lambda n: np.ones(n, np.float32)  # noqa: E731
    f32 = lambda name, shape, fan_in: _gauss(seed, name, shape, fan_in, np.float32)  # noqa: E731
    tensors = {
        "token_embd.weight": _gauss(seed, "token_embd.weight", (sh.n_vocab, H), 1, np.float32),
        "output_norm.weight": ones(H),
        "output.weight": f32("output.weight", (sh.n_vocab, H), H),
        "blk.0.attn_norm.weight": ones(H),
    }
    if ds:   # MLA: q through a rank-q_lora bottleneck, k/v through a rank-kv_lora latent plus 64 rope dims
        nq, nkvb, vd = sh.n_head * hd, sh.n_head * (hd - 64 + 128), sh.n_head * 128
        tensors.update({
            "blk.0.attn_q_a_norm.weight": ones(sh.q_lora),
            "blk.0.attn_kv_a_norm.weight": ones(sh.kv_lora),
            "blk.0.attn_q_a.weight": f32("blk.0.attn_q_a.weight", (sh.q_lora, H), H),
            "blk.0.attn_q_b.weight": f32("blk.0.attn_q_b.weight", (nq, sh.q_lora), sh.q_lora),
            "blk.0.attn_kv_a_mqa.weight": f32("blk.0.attn_kv_a_mqa.weight", (sh.kv_lora + 64, H), H),
            "blk.0.attn_kv_b.weight": f32("blk.0.attn_kv_b.weight", (nkvb, sh.kv_lora), sh.kv_lora),
            "blk.0.attn_output.weight": f32("blk.0.attn_output.weight", (H, vd), vd),
        })
    else:
        qd, kvd = sh.n_head * hd, sh.n_head_kv * hd
        tensors.update({
            "blk.0.attn_q.weight": f32("blk.0.attn_q.weight", (qd, H), H),
            "blk.0.attn_k.weight": f32("blk.0.attn_k.weight", (kvd, H), H),
            "blk.0.attn_v.weight": f32("blk.0.attn_v.weight", (kvd, H), H),
            "blk.0.attn_output.weight": f32("blk.0.attn_output.weight", (H, qd), qd),
            "blk.0.attn_q_norm.weight": ones(hd),
            "blk.0.attn_k_norm.weight": ones(hd),
        })
    tensors.update({
        "blk.0.ffn_norm.weight": ones(H),
        "blk.0.ffn_gate_inp.weight": f32("blk.0.ffn_gate_inp.weight", (E, H), H),
        # seeds name the width, so the twin's experts are their own draw (only their width matters)
        "blk.0.ffn_gate_exps.weight": _gauss(seed, f"gate_exps{I}", (E, I, H), H, edt),
        "blk.0.ffn_up_exps.weight": _gauss(seed, f"up_exps{I}", (E, I, H), H, edt),
        "blk.0.ffn_down_exps.weight": _gauss(seed, f"down_exps{I}", (E, H, I), I, edt),
    })
    if ds:
        Is = sh.n_shared * I
        tensors.update({
            # DeepSeek-V3's correction biases are small against the spread of the sigmoid scores
            "blk.0.exp_probs_b.bias": (_rng(seed, "exp_probs_b").standard_normal(E) * 0.05).astype(np.float32),
            "blk.0.ffn_gate_shexp.weight": _gauss(seed, f"gate_shexp{Is}", (Is, H), H, edt),
            "blk.0.ffn_up_shexp.weight": _gauss(seed, f"up_shexp{Is}", (Is, H), H, edt),
            "blk.0.ffn_down_shexp.weight": _gauss(seed, f"down_shexp{Is}", (H, Is), Is, edt),
        })
    for name, t in tensors.items():
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)


def gguf_types(path: str, ik_header: Optional[str] = None) -> Dict[str, str]:
    """{tensor name: type name} from a GGUF header. gguf-py cannot open files with ik-only types (llama-quantize
    falls back to ik's Q6_0 for Q5_K rows that are not whole 256-blocks), so this reads the tensor infos itself
    and names type ids gguf-py does not know from ik's include/ggml.h."""
    import struct

    import gguf

    names = {int(t): t.name for t in gguf.GGMLQuantizationType}
    if ik_header and os.path.exists(ik_header):
        import re

        for m in re.finditer(r"GGML_TYPE_(\w+)\s*=\s*(\d+)", open(ik_header).read()):
            names.setdefault(int(m.group(2)), m.group(1))
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    with open(path, "rb") as f:
        rd = lambda fmt: struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]  # noqa: E731
        rs = lambda: f.read(rd("Q")).decode(errors="replace")  # noqa: E731

        def skip(vt: int) -> None:
            if vt == 8:
                rs()
            elif vt == 9:
                it, n = rd("I"), rd("Q")
                if it in scalar:
                    f.seek(n * struct.calcsize(scalar[it]), 1)
                else:
                    for _ in range(n):
                        skip(it)
            else:
                f.seek(struct.calcsize(scalar[vt]), 1)

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        rd("I")
        n_t, n_kv = rd("Q"), rd("Q")
        for _ in range(n_kv):
            rs()
            skip(rd("I"))
        out = {}
        for _ in range(n_t):
            name = rs()
            f.seek(8 * rd("I"), 1)
            typ = rd("I")
            rd("Q")
            out[name] = names.get(typ, f"type {typ}")
    return out


# Types llama-quantize refuses (and its quantizers assert) without an importance matrix.
IMATRIX_TYPES = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S")
# llama-quantize's name for the file type whose tensors are TYPE, where the two differ (its IQ2_S file type is IQ2_XS
# tensors, even with --pure).
QUANTIZE_FTYPE = {"IQ2_S": "IQ2_M"}


def write_unit_imatrix(base: str, path: str) -> None:
    """An importance matrix of ones for every 2-D / 3-D tensor of base, in llama.cpp's legacy .dat form (entries:
    name, ncall, one value per input column and expert): every weight equally important, the plain squared error
    the other types minimize without one."""
    with open(path, "wb") as f:
        ents = [(n, shape) for n, (_, shape, _) in gguf_tensors(base).items() if len(shape) >= 2]
        f.write(struct.pack("<i", len(ents)))
        for name, shape in ents:
            nval = shape[0] * (shape[2] if len(shape) > 2 else 1)
            f.write(struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", 1, nval))
            f.write(np.ones(nval, np.float32).tobytes())


def quantize(qbin: str, base: str, out: str, typ: str, threads: int, log: List[str]) -> None:
    cmd = [qbin, "--pure", base, out + ".part", QUANTIZE_FTYPE.get(typ, typ), str(threads)]
    if typ in IMATRIX_TYPES:
        write_unit_imatrix(base, out + ".imatrix")
        cmd[1:1] = ["--imatrix", out + ".imatrix"]
        log.append(f"{typ}: importance matrix of ones (bench/ik_peer.py write_unit_imatrix)")
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0 or not os.path.exists(out + ".part"):
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    # what llama-quantize says about tensors it could not give TYPE (e.g. 32-wide rows with 256-blocks)
    log += [ln.strip() for ln in (p.stdout + p.stderr).splitlines() if "fallback" in ln.lower()
            or "not divisible" in ln.lower() or "incompatible" in ln.lower()]
    os.replace(out + ".part", out)


# ------------------------------------------------------------------------------------------------ ik peer
def ensure_ik(ik_dir: str, install: bool) -> bool:
    """Whether the peer is in ik_dir, after pip-installing it there when asked to."""
    if os.path.exists(os.path.join(ik_dir, "ik_llama_cpp", "__init__.py")):
        return True
    if not install:
        return False
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", ik_dir, IK_PACKAGE]
    print(f"ik_llama.cpp peer not found in {ik_dir}; installing it: {' '.join(cmd[2:])}", flush=True)
    return subprocess.run(cmd).returncode == 0 and os.path.exists(os.path.join(ik_dir, "ik_llama_cpp", "__init__.py"))


class _GgmlTensor(ctypes.Structure):
    """struct ggml_tensor as in the wheel's include/ggml.h (GGML_MAX_DIMS 4, MAX_SRC 10, MAX_NAME 64,
    MAX_OP_PARAMS 64); checked against ggml_get_name on the first callback."""
    _fields_ = [("type", ctypes.c_int), ("backend", ctypes.c_int), ("buffer", ctypes.c_void_p),
                ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int),
                ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32), ("grad", ctypes.c_void_p),
                ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
                ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64), ("extra", ctypes.c_void_p)]


@dataclass(frozen=True)
class IkConfig:
    rtr: bool = False        # llama_model_params.repack_tensors: run-time repack to the _R4 / _R8 row-interleaved types
    fmoe: bool = True        # llama_context_params.fused_moe_up_gate: one op for the experts' up and gate
    muge: bool = False       # llama_model_params.merge_up_gate_exps: up and gate in one tensor (full model only)

    @staticmethod
    def parse(s: str) -> "IkConfig":
        pairs = [p.split("=") for p in s.replace(" ", "").split(",") if p]
        if any(len(p) != 2 for p in pairs):
            raise ValueError(f"--ik-configs {s!r}: take NAME=VALUE pairs, e.g. rtr=1,fmoe=1")
        kv = dict(pairs)
        bad = set(kv) - {"rtr", "fmoe", "muge"}
        if bad:
            raise ValueError(f"--ik-configs: unknown option(s) {sorted(bad)} (rtr, fmoe, muge)")
        return IkConfig(**{k: v not in ("0", "false", "off") for k, v in kv.items()})

    def name(self) -> str:
        return f"rtr={int(self.rtr)},fmoe={int(self.fmoe)}" + (",muge=1" if self.muge else "")


class Ik:
    """ik_llama.cpp through the wheel's ctypes API (``ik_llama_cpp._ctypes_api``), plus a few symbols it
    does not bind (the eval callback's tensor, logging, system info)."""

    def __init__(self, ik_dir: str, threads: int, verbose: bool):
        sys.path.insert(0, os.path.abspath(ik_dir))
        import ik_llama_cpp
        from ik_llama_cpp import _ctypes_api as C

        self.C, self.lib, self.threads = C, C._lib, threads
        self.dir = os.path.dirname(ik_llama_cpp.__file__)
        self.log: List[str] = []
        self._log_cb = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(
            lambda level, text, ud: (self.log.append(text.decode(errors="replace")),
                                     verbose and sys.stderr.write(text.decode(errors="replace"))) and None)
        self.lib.llama_log_set.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self.lib.llama_log_set.restype = None
        self.lib.llama_log_set(ctypes.cast(self._log_cb, ctypes.c_void_p), None)
        self.lib.llama_print_system_info.restype = ctypes.c_char_p
        self.lib.ggml_get_name.argtypes = [ctypes.c_void_p]
        self.lib.ggml_get_name.restype = ctypes.c_char_p
        C.llama_backend_init()
        self.system_info = self.lib.llama_print_system_info().decode().strip()
        self.version = getattr(ik_llama_cpp, "__version__", "?")
        self.batch = None
        self.cb_tensors: Dict[str, np.ndarray] = {}
        self.cb_nodes: List[Tuple[str, int, Tuple[int, ...]]] = []
        self.cb_wanted: Optional[set] = None       # None: every node (listing)
        self._cb = C.ggml_backend_sched_eval_callback(self._eval)
        self._layout_checked = False

    def quantize_bin(self) -> str:
        p = os.path.join(self.dir, "bin", "llama-quantize")
        if not os.access(p, os.X_OK):
            raise SystemExit(f"no llama-quantize in {p}")
        return p

    # -------------------------------------------------------------- models and contexts
    def model_defaults(self) -> Dict[str, object]:
        p = self.C.llama_model_default_params()
        return {k: getattr(p, k) for k in ("use_mmap", "repack_tensors", "merge_up_gate_exps", "merge_qkv",
                                          "flash_attn", "use_thp")}

    def context_defaults(self) -> Dict[str, object]:
        p = self.C.llama_context_default_params()
        return {k: getattr(p, k) for k in ("flash_attn", "fused_moe_up_gate", "fused_up_gate", "fused_mmad",
                                          "graph_reuse", "only_active_experts", "min_experts", "thresh_experts",
                                          "rope_cache", "mla_attn", "attn_max_batch", "type_k", "type_v")}

    def load(self, path: str, cfg: IkConfig) -> int:
        p = self.C.llama_model_default_params()
        p.use_mmap = False                 # weights in anonymous memory, as moe_cpu's packed copy; rtr needs it
        p.repack_tensors = cfg.rtr
        p.merge_up_gate_exps = cfg.muge
        # the model's MLA setting must match the context's (mla_attn, default 3): with the model's default 0, ik
        # does not derive attn_k_b / attn_v_b from attn_kv_b and the deepseek2 graph reads a null tensor
        p.mla = self.C.llama_context_default_params().mla_attn
        n = len(self.log)
        m = self.C.llama_model_load_from_file(path.encode(), p)
        if not m:
            raise RuntimeError(f"ik could not load {path}:\n{''.join(self.log[n:])[-3000:]}")
        return m

    def context(self, model: int, cfg: IkConfig, n_max: int, callback: bool) -> int:
        p = self.C.llama_context_default_params()
        p.n_ctx = p.n_batch = p.n_ubatch = max(n_max, 32)
        p.n_threads = p.n_threads_batch = self.threads
        p.seed = 0
        p.fused_moe_up_gate = cfg.fmoe
        if callback:
            p.cb_eval = self._cb
        n = len(self.log)
        c = self.C.llama_init_from_model(model, p)
        if not c:
            raise RuntimeError(f"ik could not make a context:\n{''.join(self.log[n:])[-3000:]}")
        return c

    def make_batch(self, n_max: int, n_vocab: int, seed: int) -> None:
        C = self.C
        b = C.llama_batch_init(n_max, 0, 1)
        self.pool = [int(t) for t in np.random.default_rng(seed).integers(3, n_vocab, 4093)]
        for i in range(n_max):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = self.pool[i], i, 1, 1
            b.seq_id[i][0] = 0
        self.batch, self.calls = b, 0

    def decode(self, ctx: int, M: int, rotate: bool = False) -> float:
        """Seconds for one llama_decode of M tokens at positions 0..M-1 (empty KV cache). ``rotate``: the next
        M tokens of a random pool, so that successive calls route to other experts (no cache-hot experts)."""
        self.C.llama_kv_cache_clear(ctx)
        if rotate:
            off, pool, tok = self.calls * M, self.pool, self.batch.token
            for i in range(M):
                tok[i] = pool[(off + i) % len(pool)]
            self.calls += 1
        self.batch.n_tokens = M
        t0 = time.perf_counter()
        rc = self.C.llama_decode(ctx, self.batch)
        t = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        return t

    def free(self, ctx: Optional[int] = None, model: Optional[int] = None) -> None:
        if ctx:
            self.C.llama_free(ctx)
        if model:
            self.C.llama_free_model(model)

    # -------------------------------------------------------------- eval callback
    def _eval(self, t: int, ask: bool, ud: int) -> bool:
        try:
            tt = _GgmlTensor.from_address(t)
            name = tt.name.decode(errors="replace")
            if not self._layout_checked:
                if self.lib.ggml_get_name(t).decode(errors="replace") != name:
                    raise RuntimeError("struct ggml_tensor layout does not match this libggml")
                self._layout_checked = True
            if ask:
                return self.cb_wanted is None or name in self.cb_wanted
            ne = tuple(int(x) for x in tt.ne)
            self.cb_nodes.append((name, int(tt.op), ne))
            if tt.type == 0 and tt.data and (self.cb_wanted is None or name in self.cb_wanted):   # F32
                nb = tuple(int(x) for x in tt.nb)
                span = sum((n - 1) * s for n, s in zip(ne, nb)) + 4
                raw = np.frombuffer((ctypes.c_char * span).from_address(tt.data), np.uint8)
                a = np.lib.stride_tricks.as_strided(raw.view(np.float32) if nb[0] == 4 else raw,
                                                    shape=ne[::-1], strides=nb[::-1])
                self.cb_tensors[name] = np.array(a, np.float32).reshape(-1, ne[0])
            return True
        except Exception as e:   # an exception must not cross into C (False stops the graph)
            self.cb_tensors["__error__"] = np.array([0])
            self.log.append(f"eval callback: {e!r}\n")
            return True

    def capture(self, ctx: int, M: int, wanted: Optional[set]) -> Dict[str, np.ndarray]:
        self.cb_tensors, self.cb_nodes, self.cb_wanted = {}, [], wanted
        self.decode(ctx, M)
        if "__error__" in self.cb_tensors:
            raise RuntimeError("eval callback failed: " + "".join(self.log[-3:]))
        return self.cb_tensors


# ------------------------------------------------------------------------------------------------ reference
def gguf_tensors(path: str) -> Dict[str, Tuple[int, List[int], int]]:
    """{tensor name: (type id, ne, absolute offset of its data)} from a GGUF header, read here (gguf-py cannot open
    files with ik-only types)."""
    import struct

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    align = 32
    with open(path, "rb") as f:
        rd = lambda fmt: struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]  # noqa: E731
        rs = lambda: f.read(rd("Q")).decode(errors="replace")  # noqa: E731

        def value(vt: int):
            if vt == 8:
                return rs()
            if vt == 9:
                it, n = rd("I"), rd("Q")
                return [value(it) for _ in range(n)]
            return rd(scalar[vt])

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        rd("I")
        n_t, n_kv = rd("Q"), rd("Q")
        for _ in range(n_kv):
            key, v = rs(), value(rd("I"))
            align = int(v) if key == "general.alignment" else align
        info = []
        for _ in range(n_t):
            name = rs()
            ne = [rd("Q") for _ in range(rd("I"))]
            info.append((name, rd("I"), ne, rd("Q")))
        start = -(-f.tell() // align) * align
    return {name: (tid, ne, start + off) for name, tid, ne, off in info}


class Reference:
    """float64 MoE block of a quantized GGUF file: experts and router decoded by gguf.quants.dequantize, or for the
    types gguf-py does not know (ik's own) by ik's libggml (``dequantize_row_<type>``, one row a call)."""

    def __init__(self, path: str, sh: Shape, lib):
        import gguf

        tab, mm = gguf_tensors(path), np.memmap(path, np.uint8, "r")
        known = {int(t) for t in gguf.GGMLQuantizationType}
        lib.ggml_row_size.argtypes, lib.ggml_row_size.restype = [ctypes.c_int, ctypes.c_int64], ctypes.c_size_t
        lib.ggml_type_name.argtypes, lib.ggml_type_name.restype = [ctypes.c_int], ctypes.c_char_p

        def deq(name: str) -> np.ndarray:
            tid, ne, off = tab[name]
            K, n = ne[0], int(np.prod(ne[1:]))
            rb = int(lib.ggml_row_size(tid, K))
            raw = mm[off:off + n * rb].reshape(n, rb)
            if tid in known:
                y = gguf.quants.dequantize(np.asarray(raw), gguf.GGMLQuantizationType(tid)).astype(np.float32, copy=False)
            else:
                fn = getattr(lib, "dequantize_row_" + lib.ggml_type_name(tid).decode())
                fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
                y = np.empty((n, K), np.float32)
                for i in range(n):
                    row = np.ascontiguousarray(raw[i])
                    fn(row.ctypes.data, y[i].ctypes.data, K)
            return y.reshape(ne[::-1])

        E, H, I = sh.E, sh.H, sh.I
        self.w13 = np.empty((E, 2 * I, H), np.float32)   # rows [0, I) gate, [I, 2I) up (moe_cpu's order)
        self.w13[:, :I] = deq("blk.0.ffn_gate_exps.weight")
        self.w13[:, I:] = deq("blk.0.ffn_up_exps.weight")
        self.w2 = deq("blk.0.ffn_down_exps.weight")
        self.gate = deq("blk.0.ffn_gate_inp.weight").reshape(E, H)
        self.top_k, self.sh = sh.top_k, sh
        self.shared = None
        if sh.n_shared:   # float64 once (its 3 x 7168 x 2048 values are met on every reference call)
            self.shared = (np.concatenate([deq("blk.0.ffn_gate_shexp.weight"), deq("blk.0.ffn_up_shexp.weight")]
                                          ).astype(np.float64), deq("blk.0.ffn_down_shexp.weight").astype(np.float64))
            self.bias = deq("blk.0.exp_probs_b.bias").reshape(E)

    def routing(self, x: np.ndarray, grouped: bool = True):
        """The block's routing from float64 router logits; ``grouped=False``: plain top-k of the biased scores
        (ik's deepseek2 graph ignores the expert groups)."""
        import moe_cpu as mc

        logits = (x.astype(np.float64) @ self.gate.astype(np.float64).T).astype(np.float32)
        sh = self.sh
        if sh.arch != "deepseek2":
            return mc.select_experts(logits, self.top_k, renormalize=True)
        g = grouped and sh.n_group > 1
        return mc.select_experts(logits, self.top_k, renormalize=True, scoring_func="sigmoid",
                                 use_grouped_topk=g, num_expert_group=sh.n_group if g else None,
                                 topk_group=sh.topk_group if g else None, e_score_correction_bias=self.bias,
                                 routed_scaling_factor=sh.scale)

    def routed(self, x: np.ndarray, grouped: bool = True, chunk: int = 8) -> np.ndarray:
        from moe_cpu.reference import fused_experts_float64

        w, ids = self.routing(x, grouped)
        E, out = self.w13.shape[0], np.zeros((x.shape[0], self.w2.shape[1]))
        for e0 in range(0, E, chunk):       # a few experts at a time: float64 copies of all of them are ~5 GB
            e1 = min(E, e0 + chunk)
            emap = np.full(E, -1, np.int32)
            emap[e0:e1] = np.arange(e1 - e0, dtype=np.int32)
            out += fused_experts_float64(x, self.w13[e0:e1], self.w2[e0:e1], w, ids, "silu", expert_map=emap)
        return out

    def __call__(self, x: np.ndarray, grouped: bool = True) -> Tuple[np.ndarray, np.ndarray]:
        """(routed experts' output, the block's output: routed plus the shared expert's)."""
        routed = self.routed(x, grouped)
        if self.shared is None:
            return routed, routed
        w13, w2 = self.shared
        gu = x.astype(np.float64) @ w13.T
        g, u = gu[:, :w2.shape[1]], gu[:, w2.shape[1]:]
        return routed, routed + (g / (1 + np.exp(-g)) * u) @ w2.T


def rel_l2(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - ref) / np.linalg.norm(ref))


# ------------------------------------------------------------------------------------------------ host
def host_info(ik: Ik) -> Dict[str, object]:
    import moe_cpu as mc

    model = platform.processor()
    try:
        for ln in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if ln.startswith("Model name:"):
                model = ln.split(":", 1)[1].strip()
    except OSError:
        pass
    f = mc.cpu_features()
    return {"cpu": model, "nproc": os.cpu_count(), "loadavg_start": os.getloadavg(), "moe_cpu_isa": f["isa"],
            "moe_cpu_active": f["active"],
            "moe_cpu_kernels": f["kernels"], "MOE_CPU_ISA": os.environ.get("MOE_CPU_ISA", ""),
            "ik_version": ik.version, "ik_system_info": ik.system_info,
            "ik_model_defaults": ik.model_defaults(), "ik_context_defaults": ik.context_defaults()}


# ------------------------------------------------------------------------------------------------ one type
def bench_type(typ: str, args, sh: Shape, ik: Ik, configs: List[IkConfig], qfiles: Dict[str, str],
               Ms: List[int], bw_buf=None) -> Dict[str, object]:
    import moe_cpu as mc

    full, twin = qfiles["full"], qfiles["twin"]
    hdr = os.path.join(args.ik_dir, "include", "ggml.h")
    types_full, types_twin = gguf_types(full, hdr), gguf_types(twin, hdr)
    res: Dict[str, object] = {"type": typ, "file": full, "twin": twin,
                              "tensor_types": {k: v for k, v in types_full.items() if k.startswith("blk.")},
                              "twin_tensor_types": {k: v for k, v in types_twin.items() if "exps" in k}}
    ik.lib.ggml_row_size.argtypes, ik.lib.ggml_row_size.restype = [ctypes.c_int, ctypes.c_int64], ctypes.c_size_t
    nbytes = {name: int(ik.lib.ggml_row_size(tid, ne[0])) * int(np.prod(ne[1:]))
              for name, (tid, ne, _) in gguf_tensors(full).items()}
    res["gguf_expert_bytes"] = sum(v for k, v in nbytes.items() if "_exps." in k)
    res["gguf_shared_bytes"] = sum(v for k, v in nbytes.items() if "_shexp." in k)
    t0 = time.perf_counter()
    act_block = args.act_block if args.act_block == "auto" else None if args.act_block == "none" else int(args.act_block)
    layer = mc.MoELayer.from_pretrained(full, layer_idx=0, act_block=act_block)
    res["mc_load_s"] = time.perf_counter() - t0
    res["mc"] = {"w13": {"form": layer.w13.form, "kernel": layer.w13.kernel, "scheme": layer.w13.scheme},
                 "w2": {"form": layer.w2.form, "kernel": layer.w2.kernel, "scheme": layer.w2.scheme},
                 "act_blocks": list(layer.act_blocks), "nbytes": int(layer.w13.nbytes + layer.w2.nbytes),
                 "shared_nbytes": int(layer.shared_w13.nbytes + layer.shared_w2.nbytes) if layer.has_shared_expert else 0,
                 "routing": layer.router.describe()}
    mc.set_num_threads(args.threads)
    n_max = max(Ms)
    rng = np.random.default_rng(args.seed + 1)
    # a pool of inputs per M, used in turn, so that successive calls route to other experts (as ik's tokens)
    xs = {M: [rng.standard_normal((M, sh.H), dtype=np.float32) for _ in range(POOL)] for M in Ms}
    routes = {M: [layer.router.route(x) for x in xs[M]] for M in Ms}
    turn = {"mc": 0, "mc_exp": 0}

    # ik: a full and a twin model per model config, one timing context per (config)
    models: Dict[Tuple[bool, bool], Tuple[int, int]] = {}
    ctxs: Dict[IkConfig, Tuple[int, int]] = {}
    for c in configs:
        key = (c.rtr, c.muge)
        if key not in models:
            t0 = time.perf_counter()
            # muge on the 32-wide twin corrupts the heap in this wheel: its twin keeps up and gate apart
            models[key] = (ik.load(full, c), ik.load(twin, IkConfig(c.rtr, c.fmoe, False)))
            res.setdefault("ik_load_s", {})[f"rtr={int(c.rtr)},muge={int(c.muge)}"] = time.perf_counter() - t0
        mf, mt = models[key]
        ctxs[c] = (ik.context(mf, c, n_max, False), ik.context(mt, c, n_max, False))

    def mc_layer(M):
        x = xs[M][turn["mc"] % POOL]
        turn["mc"] += 1
        t0 = time.perf_counter()
        layer(x)
        return time.perf_counter() - t0

    def mc_experts(M):
        j = turn["mc_exp"] % POOL
        turn["mc_exp"] += 1
        (w, ids), x = routes[M][j], xs[M][j]
        t0 = time.perf_counter()
        mc.fused_experts(x, layer.w13, layer.w2, w, ids, activation="silu")
        return time.perf_counter() - t0

    # Both engines run OpenMP teams (two libgomp copies) whose idle threads spin for a while (~10 ms on this
    # kind of host) after each call and would steal the cores from the other engine. So: a pause whenever the
    # engine changes, then for calls under SHORT_S one untimed call (wakes the team) and INNER timed calls.
    # ik and moe_cpu alternate in every round, and their order (and that of the ik configs) flips each round.
    est: Dict[int, float] = {}
    for M in Ms:
        for _ in range(args.warmup):
            for c in configs:
                est[M] = max(est.get(M, 0.0), ik.decode(ctxs[c][0], M, True))
                ik.decode(ctxs[c][1], M, True)
            time.sleep(args.pause)
            est[M] = max(est[M], mc_layer(M))
            mc_experts(M)
            time.sleep(args.pause)
    T = {M: {"mc": [], "mc_exp": [], "bw": [], **{c.name(): {"full": [], "twin": []} for c in configs}} for M in Ms}

    def timed(fn, M):
        short = est[M] < SHORT_S
        if short:   # at least one untimed call, and 2 ms of them: one alone left the first timed calls after a
            end = time.perf_counter() + WARM_S   # pause 5-10% slow (moe_cpu's layer, timed first, and ik's first config)
            fn(M)
            while time.perf_counter() < end:
                fn(M)
        return [fn(M) for _ in range(INNER if short else 1)]

    for r in range(args.reps):
        for M in Ms:
            def run_ik():
                time.sleep(args.pause)
                for c in (configs if r % 2 == 0 else configs[::-1]):
                    T[M][c.name()]["full"] += timed(lambda m: ik.decode(ctxs[c][0], m, True), M)
                    T[M][c.name()]["twin"] += timed(lambda m: ik.decode(ctxs[c][1], m, True), M)

            def run_mc():
                time.sleep(args.pause)
                T[M]["mc"] += timed(mc_layer, M)
                T[M]["mc_exp"] += timed(mc_experts, M)

            def run_bw():
                if bw_buf is not None:
                    time.sleep(args.pause)
                    T[M]["bw"].append(bw_buf.read_gbs(args.threads, 2))

            for f in ((run_ik, run_mc, run_bw) if r % 2 == 0 else (run_bw, run_mc, run_ik)):
                f()
    for c in configs:
        ik.free(ctxs[c][0]), ik.free(ctxs[c][1])

    # errors: one capture decode per (config, M) on a context with the eval callback
    refs: List[Tuple[np.ndarray, bool, Tuple[np.ndarray, np.ndarray]]] = []   # (x, grouped, (routed, block)) cache
    t0 = time.perf_counter()
    reference = Reference(full, sh, ik.lib)
    res["ref_dequant_s"] = time.perf_counter() - t0

    def ref_of(x, grouped):   # (routed, block) float64 references
        for xx, gg, rr in refs:
            if gg == grouped and xx.shape == x.shape and np.array_equal(xx, x):
                return rr
        rr = reference(x, grouped)
        refs.append((x, grouped, rr))
        return rr

    in_name, out_names = sh.io_names
    # ik's deepseek2 graph takes a plain top-k of the biased scores (it ignores the expert groups): its error is
    # measured against the reference of that routing, moe_cpu's against the block's grouped routing
    ik_grouped = sh.n_group <= 1
    res["ik_routing"] = "grouped, as the file says" if ik_grouped else "plain top-k (ik ignores expert groups)"

    per_m: Dict[int, Dict[str, object]] = {}
    for M in Ms:
        d: Dict[str, object] = {"ik": {}}
        for ci, c in enumerate(configs):
            # muge merges up and gate when a context is made, once per model: give that one a fresh model
            model = ik.load(full, c) if c.muge else models[(c.rtr, c.muge)][0]
            ctx = ik.context(model, c, n_max, True)
            got = ik.capture(ctx, M, {in_name, *out_names})
            ik.free(ctx, model if c.muge else None)
            out_name = next((n for n in out_names if n in got), None)
            if in_name not in got or out_name is None:
                raise RuntimeError(f"ik's graph has no {in_name} / {out_names} (see --list-nodes); got {list(got)}")
            x, y = got[in_name], got[out_name]
            if x.shape != (M, sh.H) or y.shape != (M, sh.H):
                raise RuntimeError(f"captured {in_name} {x.shape}, {out_name} {y.shape}; expected ({M}, {sh.H})")
            ref = ref_of(x, ik_grouped)[1]
            full_t, twin_t = np.array(T[M][c.name()]["full"]), np.array(T[M][c.name()]["twin"])
            d["ik"][c.name()] = {"err": rel_l2(y, ref), "out_tensor": out_name,
                                 "ms": float(np.median(full_t - twin_t)) * 1e3,
                                 "full_ms": float(np.median(full_t)) * 1e3, "twin_ms": float(np.median(twin_t)) * 1e3,
                                 "ms_best": float(full_t.min() - twin_t.min()) * 1e3}
            if ci == 0:
                time.sleep(args.pause)
                routed_ref, block_ref = ref_of(x, True)
                d["mc_err"] = rel_l2(layer(x), block_ref)
                w, ids = reference.routing(x)
                d["mc_exp_err"] = rel_l2(mc.fused_experts(x, layer.w13, layer.w2, w, ids, activation="silu"), routed_ref)
        d["mc_ms"] = float(np.median(T[M]["mc"])) * 1e3
        d["mc_exp_ms"] = float(np.median(T[M]["mc_exp"])) * 1e3
        d["mc_ms_best"] = float(np.min(T[M]["mc"])) * 1e3
        best = min(d["ik"], key=lambda k: d["ik"][k]["ms"])
        d["ik_best"] = best
        d["ik_ms_best"] = min(v["ms_best"] for v in d["ik"].values())
        # weight bytes the experts touch (the expected number of distinct experts for M random routings), per
        # second of each engine's time: ik reads the GGUF blocks (or their repacked twins), moe_cpu its packing
        # (the shared expert always: its bytes count in the layer's and ik's MoE time, not in "mc exp")
        touched = (1 - (1 - sh.top_k / sh.E) ** M)
        b = d["ik"][best]["ms"] / 1e3
        d["ik_GBps"] = (res["gguf_expert_bytes"] * touched + res["gguf_shared_bytes"]) / b / 1e9 if b > 0 else float("nan")
        d["mc_GBps"] = (res["mc"]["nbytes"] * touched + res["mc"]["shared_nbytes"]) / (d["mc_ms"] / 1e3) / 1e9
        d["mc_exp_GBps"] = res["mc"]["nbytes"] * touched / (d["mc_exp_ms"] / 1e3) / 1e9
        d["read_GBps"] = float(np.median(T[M]["bw"])) if T[M]["bw"] else float("nan")
        d["read_GBps_range"] = [float(min(T[M]["bw"])), float(max(T[M]["bw"]))] if T[M]["bw"] else []
        per_m[M] = d
    res["M"] = per_m
    for mf, mt in models.values():
        ik.free(model=mf), ik.free(model=mt)
    del layer, reference
    return res


def print_type(res: Dict[str, object]) -> None:
    tt = res["tensor_types"]
    exps = "/".join(tt.get(f"blk.0.ffn_{n}_exps.weight", "?") for n in ("gate", "up", "down"))
    tw = res["twin_tensor_types"].get("blk.0.ffn_down_exps.weight", "?")
    m = res["mc"]
    shx = "/".join(tt.get(f"blk.0.ffn_{n}_shexp.weight", "?") for n in ("gate", "up", "down"))
    shx = f", shared expert {shx} ({res['gguf_shared_bytes'] / 2**20:.0f} MiB)" if res["gguf_shared_bytes"] else ""
    att = tt.get("blk.0.attn_q.weight") or tt.get("blk.0.attn_q_b.weight")
    print(f"\n== {res['type']} (load average after: {', '.join(f'{x:.1f}' for x in res['loadavg_after'])})"
          f": experts gate/up/down {exps} ({res['gguf_expert_bytes'] / 2**20:.0f} MiB){shx}, router "
          f"{tt.get('blk.0.ffn_gate_inp.weight')}, attention {att}; twin's down {tw}")
    print(f"   moe_cpu: w13 {m['w13']['form']} ({m['w13']['kernel']}), w2 {m['w2']['form']} ({m['w2']['kernel']}), "
          f"act_blocks {tuple(m['act_blocks'])}, {m['nbytes'] / 2**20:.0f} MiB packed"
          + (f" + shared {m['shared_nbytes'] / 2**20:.0f} MiB" if m["shared_nbytes"] else ""))
    print(f"   routing: moe_cpu {m['routing']}; ik {res['ik_routing']}")
    print(f"   {'M':>4} | {'ik ms':>8} | {'moe_cpu ms':>10} | {'ik/mc':>5} | {'mc exp ms':>9} | {'ik GB/s':>7} | "
          f"{'mc GB/s':>7} | {'ik err':>8} | {'mc err':>8} | {'best-of ik/mc':>17} | ik config")
    for M, d in res["M"].items():
        b = d["ik"][d["ik_best"]]
        print(f"   {M:>4} | {b['ms']:>8.3f} | {d['mc_ms']:>10.3f} | {b['ms'] / d['mc_ms']:>5.2f} | "
              f"{d['mc_exp_ms']:>9.3f} | {d['ik_GBps']:>7.1f} | {d['mc_GBps']:>7.1f} | "
              f"{b['err']:>8.2e} | {d['mc_err']:>8.2e} | "
              f"{d['ik_ms_best']:>6.2f}/{d['mc_ms_best']:<6.2f} {d['ik_ms_best'] / d['mc_ms_best']:4.2f} | {d['ik_best']}")
    for M, d in res["M"].items():
        if d["read_GBps_range"]:
            lo, hi = d["read_GBps_range"]
            print(f"   M={M:<4} read bandwidth in the same rounds {d['read_GBps']:.1f} GB/s (median; {lo:.1f}-{hi:.1f}): "
                  f"moe_cpu experts {d['mc_exp_GBps']:.1f} GB/s = {100 * d['mc_exp_GBps'] / d['read_GBps']:.0f}%, "
                  f"layer {100 * d['mc_GBps'] / d['read_GBps']:.0f}%; ik MoE {100 * d['ik_GBps'] / d['read_GBps']:.0f}%")
    for M, d in res["M"].items():
        print(f"   ik M={M:<4} per config, MoE ms = full - twin (err): " + "  ".join(
            f"{k} {v['ms']:.3f} = {v['full_ms']:.3f} - {v['twin_ms']:.3f} ({v['err']:.2e})"
            for k, v in d["ik"].items()))


# ------------------------------------------------------------------------------------------------ main
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=DEFAULT_TYPES, help=f"llama-quantize types (default {DEFAULT_TYPES})")
    ap.add_argument("--m", default="1,128,512", help="batch sizes M (default 1,128,512)")
    ap.add_argument("--threads", type=int, default=2, help="threads for both (default 2)")
    ap.add_argument("--reps", type=int, default=7, help="timed rounds (default 7)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up calls per engine and M (default 2)")
    ap.add_argument("--block", choices=sorted(BLOCKS), default="qwen3-30b-a3b",
                    help="the MoE block (default qwen3-30b-a3b; deepseek-v3: H 7168, FFN 2048, grouped sigmoid "
                         "top-8, a shared expert)")
    ap.add_argument("--experts", type=int, help="experts E (default: 128 for qwen3-30b-a3b, 32 for deepseek-v3, "
                    "cut from 256 to fit memory; a multiple of the 8 groups)")
    ap.add_argument("--small", action="store_true", help="tiny shape of the block (H 256, FFN 256, 8 or 16 "
                    "experts, top-2 or 4)")
    ap.add_argument("--ik-dir", default="/tmp/ikpeer", help="where the peer wheel lives (default /tmp/ikpeer)")
    ap.add_argument("--ik-lib", help="another libllama.so for the wheel's ctypes API (IK_LLAMA_CPP_LIB_PATH): e.g. "
                    "ik_llama.cpp at the wheel's commit built with -DGGML_NATIVE=ON (docs/performance.md)")
    ap.add_argument("--no-install", action="store_true", help="do not pip-install the peer, only print the command")
    ap.add_argument("--ik-configs", default=DEFAULT_CONFIGS,
                    help=f"ik option sets to try, ';'-separated (rtr, fmoe, muge; default {DEFAULT_CONFIGS!r})")
    ap.add_argument("--pause", type=float, default=0.02,
                    help="seconds idle whenever the engine changes, for the other's idle threads to stop (default 0.02)")
    ap.add_argument("--act-block", default="auto", choices=("auto", "none", "32", "64", "128", "256"),
                    help="moe_cpu's activation blocks (default auto: 32 on every GGUF type; 256 is ggml's Q8_K, "
                         "the block of ik's run-time repack)")
    ap.add_argument("--work-dir", default="/tmp/ik_peer_models", help="GGUF cache (default /tmp/ik_peer_models)")
    ap.add_argument("--base-dtype", choices=("f16", "f32"), default="f16", help="experts in the base file")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-bw", action="store_true", help="leave out the read-bandwidth probe of each round")
    ap.add_argument("--out", help="write all results as JSON here")
    ap.add_argument("--prepare-only", action="store_true", help="write and quantize the GGUF files, then exit")
    ap.add_argument("--list-nodes", action="store_true",
                    help="print ik's graph nodes for the first type and M, then exit")
    ap.add_argument("--verbose", action="store_true", help="show ik's log")
    args = ap.parse_args(argv)

    sh = BLOCKS[args.block][1 if args.small else 0]
    if args.experts is not None:
        if args.experts < sh.top_k or (sh.n_group and args.experts % sh.n_group):
            ap.error(f"--experts {args.experts}: needs at least top-k {sh.top_k} experts"
                     + (f" in whole groups of {sh.n_group}" if sh.n_group else ""))
        sh = replace(sh, E=args.experts)
    try:
        Ms = [int(m) for m in args.m.split(",") if m]
    except ValueError:
        ap.error(f"--m {args.m!r}: expected comma-separated batch sizes")
    if not Ms or any(m < 1 for m in Ms):
        ap.error(f"--m {args.m}: batch sizes must be >= 1")
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    bad = [t for t in types if t not in TYPES]
    if bad or not types:
        ap.error(f"--types: unknown {bad[0] if bad else args.types!r}; the GGUF types both engines read: "
                 f"{', '.join(TYPES)}")
    if args.threads < 1 or args.reps < 1 or args.warmup < 0:
        ap.error("--threads and --reps must be >= 1, --warmup >= 0")
    try:
        configs = [IkConfig.parse(s) for s in args.ik_configs.split(";") if s.strip()]
    except ValueError as e:
        ap.error(str(e))
    if not configs:
        ap.error("--ik-configs: no option set")
    if args.ik_lib and not os.path.isfile(args.ik_lib):
        ap.error(f"--ik-lib {args.ik_lib!r} is not a file")
    try:
        import gguf  # noqa: F401  (writes the models, reads them back for the reference)
    except ImportError:
        ap.error("needs gguf-py (pip install gguf)")
    if not ensure_ik(args.ik_dir, not args.no_install):
        ap.error(f"no ik_llama.cpp peer in {args.ik_dir} (pip install --no-deps --target {args.ik_dir} {IK_PACKAGE}; "
                 f"without --no-install this script runs that itself)")
    if args.ik_lib:
        os.environ["IK_LLAMA_CPP_LIB_PATH"] = os.path.abspath(args.ik_lib)
    ik = Ik(args.ik_dir, args.threads, args.verbose)
    import moe_cpu as mc   # after the peer is set up; moe_cpu itself never sees it

    host = host_info(ik)
    print(f"host: {host['cpu']} ({host['nproc']} CPUs; load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}); "
          f"threads {args.threads}")
    print(f"moe_cpu: isa {host['moe_cpu_isa']} (MOE_CPU_ISA={host['MOE_CPU_ISA'] or '-'}), active "
          f"{','.join(host['moe_cpu_active'])}; kernels int4_w4a8 {host['moe_cpu_kernels']['int4_w4a8']}, "
          f"int8_w8a8 {host['moe_cpu_kernels']['int8_w8a8']}")
    lib = os.environ.get("IK_LLAMA_CPP_LIB_PATH")
    print(f"ik_llama.cpp ({'library ' + lib + ', through the wheel ' if lib else 'wheel '}{IK_PACKAGE}): "
          f"{host['ik_system_info']}")
    print(f"ik model defaults: {host['ik_model_defaults']}")
    print(f"ik context defaults: {host['ik_context_defaults']}")
    print(f"ik configs tried: {[c.name() for c in configs]} (use_mmap=0, n_ctx=n_batch=n_ubatch={max(max(Ms), 32)}, "
          f"threads {args.threads}; other options at the defaults above)")
    print(f"shape: {asdict(sh)}; M {Ms}; reps {args.reps}", flush=True)

    os.makedirs(args.work_dir, exist_ok=True)
    bases = {}
    for kind, I in (("full", sh.I), ("twin", sh.I_twin)):
        p = os.path.join(args.work_dir, f"base_{sh.tag(I)}_s{args.seed}_{args.base_dtype}.gguf")
        if not os.path.exists(p):
            t0 = time.perf_counter()
            write_base(p, sh, I, args.seed, args.base_dtype)
            print(f"wrote {p} ({os.path.getsize(p) / 2**20:.0f} MiB, {time.perf_counter() - t0:.0f} s)", flush=True)
        bases[kind] = p

    qbin = ik.quantize_bin()
    bw_buf = None if args.no_bw else mc._core.ReadBuffer(1 << 30)
    results = {"host": host, "shape": asdict(sh), "threads": args.threads, "reps": args.reps, "M": Ms,
               "configs": [c.name() for c in configs], "types": {}, "quantize_notes": {}, "failed": {}}
    for typ in types:
        qfiles, notes = {}, []
        try:
            for kind, base in bases.items():
                q = base.replace("base_", "q_").replace(f"_{args.base_dtype}.gguf", f"_{args.base_dtype}_{typ}.gguf")
                if not os.path.exists(q):
                    t0 = time.perf_counter()
                    quantize(qbin, base, q, typ, args.threads, notes)
                    print(f"quantized {os.path.basename(q)} ({os.path.getsize(q) / 2**20:.0f} MiB, "
                          f"{time.perf_counter() - t0:.0f} s)", flush=True)
                qfiles[kind] = q
            results["quantize_notes"][typ] = notes
            if args.prepare_only:
                continue
            if args.list_nodes:
                c = configs[0]
                m = ik.load(qfiles["full"], c)
                ctx = ik.context(m, c, max(Ms), True)
                ik.make_batch(max(Ms), sh.n_vocab, args.seed)
                ik.capture(ctx, Ms[0], None)
                for name, op, ne in ik.cb_nodes:
                    print(f"   {name:32s} op {op:3d} ne {list(ne)}")
                return
            if ik.batch is None:
                ik.make_batch(max(Ms), sh.n_vocab, args.seed)
            t0 = time.perf_counter()
            res = bench_type(typ, args, sh, ik, configs, qfiles, Ms, bw_buf)
            res["wall_s"] = time.perf_counter() - t0
            res["loadavg_after"] = os.getloadavg()
            results["types"][typ] = res
            print_type(res)
            sys.stdout.flush()
        except Exception as e:   # report and go on with the next type
            results["failed"][typ] = repr(e)
            print(f"\n== {typ}: FAILED: {e}", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1, default=str)

    print("\nsummary: ms per call (ik MoE = full - twin, best config) / moe_cpu layer(x); ratio ik/moe_cpu")
    print(f"   {'type':7} " + " ".join(f"| M={M:<4} ik   mc    ratio " for M in Ms))
    for typ, res in results["types"].items():
        cells = []
        for M in Ms:
            d = res["M"][M]
            b = d["ik"][d["ik_best"]]["ms"]
            cells.append(f"| {b:8.2f} {d['mc_ms']:8.2f} {b / d['mc_ms']:5.2f} ")
        print(f"   {typ:7} " + " ".join(cells))
    print("   the same from each engine's best round (best-of; see 'What it times'):")
    for typ, res in results["types"].items():
        print(f"   {typ:7} " + " ".join(
            f"| {res['M'][M]['ik_ms_best']:8.2f} {res['M'][M]['mc_ms_best']:8.2f} "
            f"{res['M'][M]['ik_ms_best'] / res['M'][M]['mc_ms_best']:5.2f} " for M in Ms))
    if bw_buf is not None:
        print("   experts' share of the read bandwidth measured in the same rounds (moe_cpu fused_experts / ik MoE):")
        for typ, res in results["types"].items():
            print(f"   {typ:7} " + " ".join(
                f"| M={M:<4} {100 * d['mc_exp_GBps'] / d['read_GBps']:3.0f}% / {100 * d['ik_GBps'] / d['read_GBps']:3.0f}% "
                f"of {d['read_GBps']:.1f} GB/s " for M, d in res["M"].items()))
    for typ, err in results["failed"].items():
        print(f"   {typ}: failed: {err}")


if __name__ == "__main__":
    main()
