"""Load one MoE layer from Hugging Face safetensors checkpoints (with config.json).

Supported expert weights:
- compressed-tensors ``pack-quantized`` (int32 ``weight_packed`` [N, ceil(K/8)], 8 nibbles per int32,
  lowest nibble first, stored = q + 8; ``weight_shape``; ``weight_scale``) and ``int-quantized``
  (int8 ``weight``) with 4-bit (int4_w4a8) or 8-bit (int8_w8a8) symmetric weights, per group,
  per channel or per tensor (broadcast to per channel); a config group without ``input_activations`` is
  weight-only and loads as int4_w4a16 / int8_w8a16;
- DeepSeek-V3 block FP8: float8_e4m3fn ``weight`` + float32 ``weight_scale_inv`` and
  ``quantization_config.weight_block_size`` (fp8_w8a16);
- unquantized F32 / BF16 / F16, quantized on load to ``scheme`` (bf16 when None: BF16 is exact,
  F16 and F32 are rounded to nearest even).
Naming: ``model.layers.L.mlp.experts.N.{gate,up,down}_proj`` (Qwen, DeepSeek), Mixtral's
``block_sparse_moe.experts.N.{w1,w3,w2}``, gpt-oss' fused ``mlp.experts.gate_up_proj`` [E, H, 2I]
(interleaved gate/up) and ``down_proj`` [E, I, H] with biases and ``mlp.router.{weight,bias}``, or
  the release's MXFP4 ``*_blocks`` / ``*_scales`` (int4 with the MXFP4 codebook, lossless);
- GPTQ (``quant_method`` gptq, 4-bit; ``qweight`` int32 [K/8, N] packed along K, ``qzeros`` int32
  [G, N/8] packed along N, lowest nibble first, float16 ``scales`` [G, N], ``g_idx`` [K]; zero points
  stored minus one in ``checkpoint_format`` gptq (v1), as they are in gptq_v2; ``desc_act`` act-order)
  and AWQ (``quant_method`` awq, GEMM version: ``qweight`` int32 [K, N/8] and ``qzeros`` [G, N/8]
  packed along N in AWQ's nibble order 0 2 4 6 1 3 5 7, float16 ``scales`` [G, N]): int4 with zero
  points, losslessly (symmetric int4 when every zero point is 8), run as int4_w4a16 (weight-only; so is
  MXFP4).
"""
from __future__ import annotations

import glob
import json
import os
import re
import struct
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..forms import MXFP4_VALUES, mxfp4_scales
from ._common import (LayerWeights, Part, Source, bf16_bits_to_f32, build_pair,
                      check_expert_ids, resolve_scheme)
from .config import config_from_hf

__all__ = ["load_safetensors_layer"]

FLOAT = ("F32", "BF16", "F16")
try:                                # safetensors returns BF16 as ml_dtypes.bfloat16 when it can
    import ml_dtypes  # noqa: F401
    _HAVE_ML_DTYPES = True
except ImportError:
    _HAVE_ML_DTYPES = False


class _Checkpoint:
    """Tensor name -> file index over safetensors files; reads whole tensors or one leading index."""

    def __init__(self, files: Sequence[str]):
        try:
            from safetensors import safe_open
        except ImportError:
            raise ImportError("loading .safetensors checkpoints needs the 'safetensors' package "
                              "(pip install safetensors)") from None
        self.files = list(files)
        self._open: Dict[str, Any] = {}
        self._where: Dict[str, str] = {}
        for f in self.files:
            try:
                h = safe_open(f, framework="numpy")
            except Exception as err:   # safetensors raises its own error types
                raise ValueError(f"{f}: not a readable safetensors file ({err})") from None
            self._open[f] = h
            for k in h.keys():
                self._where[k] = f
        self._headers: Dict[str, Tuple[int, dict]] = {}

    def has(self, name: str) -> bool:
        return name in self._where

    def keys(self) -> List[str]:
        return list(self._where)

    def info(self, name: str, what: str = "") -> Tuple[str, Tuple[int, ...]]:
        """(safetensors dtype string, shape); a missing tensor raises ValueError naming it."""
        if name not in self._where:
            where = self.files[0] if len(self.files) == 1 else os.path.dirname(self.files[0])
            raise ValueError(f"missing tensor {name}{' (' + what + ')' if what else ''} in {where}")
        sl = self._open[self._where[name]].get_slice(name)
        return sl.get_dtype(), tuple(sl.get_shape())

    def read(self, name: str, shape: Tuple[int, ...], dtypes: Sequence[str], index: Optional[int] = None,
             what: str = "") -> np.ndarray:
        """Check dtype and shape (of the whole tensor), then read it (or its [index] slice)."""
        dt, shp = self.info(name, what)
        if dt not in dtypes:
            raise ValueError(f"tensor {name}: dtype {dt} but one of {list(dtypes)} was expected")
        if shp != tuple(shape):
            raise ValueError(f"tensor {name}: shape {list(shp)} but {list(shape)} was expected"
                             f"{' (' + what + ')' if what else ''}")
        if dt.startswith("F8") or (dt == "BF16" and not _HAVE_ML_DTYPES):   # no NumPy dtype: map the bytes
            return self._raw(name, shp, index, np.uint8 if dt.startswith("F8") else np.uint16)
        if index is None:
            return self._open[self._where[name]].get_tensor(name)
        return self._open[self._where[name]].get_slice(name)[index:index + 1][0]

    def _raw(self, name: str, shape: Tuple[int, ...], index: Optional[int], dtype: Any) -> np.ndarray:
        """Read through the safetensors layout: u64 header size, JSON header, data (offsets per tensor)."""
        f = self._where[name]
        if f not in self._headers:
            with open(f, "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                self._headers[f] = (8 + n, json.loads(fh.read(n)))
        base, header = self._headers[f]
        begin, end = header[name]["data_offsets"]
        a = np.memmap(f, dtype, "r", offset=base + begin, shape=(int(np.prod(shape)),)).reshape(shape)
        return np.array(a if index is None else a[index])


def _to_f32(a: np.ndarray) -> np.ndarray:
    """float32 / bfloat16 (ml_dtypes, or uint16 bits) / float16 -> float32 (exact)."""
    if a.dtype.name in ("bfloat16", "uint16"):
        return bf16_bits_to_f32(a.view(np.uint16))
    return np.ascontiguousarray(a, dtype=np.float32)


def _files(path: Any) -> Tuple[List[str], str]:
    """(safetensors files, config.json path) for a directory, one file, or a list of files."""
    if isinstance(path, (list, tuple)):
        files = [os.fspath(p) for p in path]
        if not files:
            raise ValueError("load_layer: empty list of safetensors files")
    elif os.path.isdir(path):
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.isfile(index):
            with open(index) as fh:
                wm = json.load(fh).get("weight_map")
            if not isinstance(wm, dict):
                raise ValueError(f"{index}: key 'weight_map' is missing")
            files = [os.path.join(path, f) for f in sorted(set(wm.values()))]
        else:
            files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise ValueError(f"{path}: no .safetensors files in this directory")
    else:
        files = [os.fspath(path)]
    for f in files:
        if not os.path.isfile(f):
            raise ValueError(f"{f}: no such safetensors file")
    return files, os.path.join(os.path.dirname(os.path.abspath(files[0])), "config.json")


# ------------------------------------------------------------------------- compressed-tensors
def _target_matches(target: str, module: str) -> bool:
    if target == "Linear":
        return True
    if target.startswith("re:"):
        return re.match(target[3:], module) is not None
    return module == target or module.endswith("." + target)


def _ct_args(qc: Dict[str, Any], module: str) -> Tuple[Dict[str, Any], str, bool]:
    """(weights args, format, weight-only) of the compressed-tensors config group that targets ``module``;
    weight-only: the group has no input_activations (W4A16 / W8A16), so it loads as the A16 scheme."""
    groups = qc.get("config_groups")
    if not isinstance(groups, dict):
        raise ValueError("config.json: quantization_config key 'config_groups' is missing")
    for gname, grp in groups.items():
        if any(_target_matches(t, module) for t in grp.get("targets", [])):
            w = grp.get("weights")
            if not w:
                raise ValueError(f"config.json: config group {gname!r} has no 'weights' arguments")
            if w.get("type", "int") != "int" or w.get("num_bits") not in (4, 8):
                raise ValueError(f"config.json: config group {gname!r} weights are {w.get('type')} "
                                 f"{w.get('num_bits')}-bit; only int 4-bit and 8-bit are supported")
            if not w.get("symmetric", True):
                raise ValueError(f"config.json: config group {gname!r} is asymmetric (zero points); "
                                 "only symmetric weights are supported")
            act = grp.get("input_activations")
            if act and not (act.get("dynamic") and act.get("strategy") == "token" and act.get("num_bits") == 8):
                raise ValueError(f"config.json: config group {gname!r} input_activations must be dynamic "
                                 "per-token 8-bit (static activation scales are not supported)")
            fmt = grp.get("format") or qc.get("format")
            return w, fmt, not act
    raise ValueError(f"config.json: no compressed-tensors config group targets {module}")


def _ct_group(w: Dict[str, Any], module: str) -> int:
    strat = w.get("strategy")
    if strat == "group":
        g = w.get("group_size")
        if not isinstance(g, int) or g <= 0:
            raise ValueError(f"config.json: strategy 'group' needs a positive group_size (for {module})")
        return g
    if strat in ("channel", "tensor"):
        return -1
    raise ValueError(f"config.json: weights strategy {strat!r} is not supported for {module} "
                     "(expected group, channel or tensor)")


def _unpack_int32(packed: np.ndarray, bits: int, K: int) -> np.ndarray:
    """compressed-tensors pack_to_int32 inverse: value i of word j is bits [bits*i, bits*(i+1)) of it,
    element j * (32 // bits) + i; stored unsigned with offset 2^(bits-1). -> int8 [N, K]."""
    pf = 32 // bits
    u = packed.view(np.uint32)[:, :, None] >> (np.arange(pf, dtype=np.uint32) * bits)
    vals = (u & ((1 << bits) - 1)).astype(np.int16).reshape(packed.shape[0], -1)[:, :K]
    return (vals - (1 << (bits - 1))).astype(np.int8)


# ------------------------------------------------------------------------------- GPTQ / AWQ
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)   # nibble i of an AWQ int32 holds column 8c + AWQ_ORDER[i]


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """int32 [R, C] -> uint8 [R, C, 8]: nibble i is bits [4i, 4i + 4)."""
    return ((packed.view(np.uint32)[:, :, None] >> (np.arange(8, dtype=np.uint32) * 4)) & 15).astype(np.uint8)


def _unpack_cols(packed: np.ndarray, n: int, awq: bool) -> np.ndarray:
    """int32 [R, ceil(n/8)] packed along columns -> uint8 [R, n]."""
    nib = _nibbles(packed)
    if awq:
        out = np.empty_like(nib)
        out[:, :, list(AWQ_ORDER)] = nib
        nib = out
    return nib.reshape(packed.shape[0], -1)[:, :n]


def _int4_config(qc: Dict[str, Any], name: str, K: int) -> Tuple[str, int, bool]:
    """(method "gptq" / "awq", group size or -1, GPTQ v1 zero points) from quantization_config."""
    meth = qc.get("quant_method")
    if meth not in ("gptq", "awq"):
        raise ValueError(f"tensor {name}: found, but config.json quantization_config quant_method is {meth!r} "
                         "(expected 'gptq' or 'awq')")
    bits = qc.get("bits", qc.get("w_bit"))
    if bits != 4:
        raise ValueError(f"tensor {name}: config.json quantization_config bits = {bits!r}; only 4-bit {meth} "
                         "checkpoints are supported")
    g = qc.get("group_size", qc.get("q_group_size", 128))
    if not isinstance(g, int) or not (g == -1 or g > 0):
        raise ValueError(f"tensor {name}: config.json quantization_config group_size = {g!r} must be a positive "
                         "int or -1")
    if g > 0 and K % g:
        raise ValueError(f"tensor {name}: group_size = {g} does not divide the input features K = {K}")
    v1 = False
    if meth == "awq":
        ver = str(qc.get("version", "gemm")).lower()
        if ver != "gemm":
            raise ValueError(f"tensor {name}: AWQ version {ver!r} is not supported (only the GEMM layout)")
        if not qc.get("zero_point", True):
            raise ValueError(f"tensor {name}: AWQ without zero points (zero_point false) is not supported")
    else:
        fmt = qc.get("checkpoint_format", "gptq")
        if fmt not in ("gptq", "gptq_v2"):
            raise ValueError(f"tensor {name}: GPTQ checkpoint_format {fmt!r} is not supported (gptq or gptq_v2)")
        v1 = fmt == "gptq"
    return meth, g, v1


def _check_g_idx(gi: np.ndarray, name: str, G: int, g: int) -> np.ndarray:
    """A GPTQ g_idx [K] must map exactly g input channels to each of the G groups."""
    gi = gi.astype(np.int64)
    if gi.min() < 0 or gi.max() >= G:
        k = int(np.argmax((gi < 0) | (gi >= G)))
        raise ValueError(f"tensor {name}: entry {k} = {gi[k]} is not a group index in [0, {G})")
    counts = np.bincount(gi, minlength=G)
    if (counts != g).any():
        bad = int(np.argmax(counts != g))
        raise ValueError(f"tensor {name}: not a valid group map: group {bad} has {counts[bad]} input channels "
                         f"(expected group_size = {g})")
    return gi.astype(np.int32)


# ------------------------------------------------------------------------------- sources
class _Layer:
    """The tensors of one layer: builds a Source per projection."""

    def __init__(self, ck: _Checkpoint, cfg: Dict[str, Any]):
        self.ck, self.qc = ck, cfg.get("quantization_config") or {}

    def source(self, label: str, module, N: int, K: int) -> Source:
        """Source for modules ``module(e)`` holding [N, K] weights; kind from expert 0's tensors."""
        ck, m0 = self.ck, module(0)
        if ck.has(m0 + ".qweight"):
            return self.gptq_awq(label, module, N, K)
        if ck.has(m0 + ".weight_packed") or (ck.has(m0 + ".weight") and ck.info(m0 + ".weight")[0] == "I8"):
            packed = ck.has(m0 + ".weight_packed")
            w, fmt, weight_only = _ct_args(self.qc, m0)
            want = ("pack-quantized",) if packed else ("int-quantized", "naive-quantized")
            if fmt not in want:
                raise ValueError(f"tensor {m0 + ('.weight_packed' if packed else '.weight')}: found, but "
                                 f"config.json format is {fmt!r} (expected {' or '.join(want)})")
            if ck.has(m0 + ".weight_g_idx") or ck.has(m0 + ".weight_zero_point"):
                raise ValueError(f"{m0}: weight_g_idx / weight_zero_point (activation ordering or zero points) "
                                 "are not supported")
            bits, g = w["num_bits"], _ct_group(w, m0)
            tensor_scale = w.get("strategy") == "tensor"
            native = "int4_w4a8" if bits == 4 else "int8_w8a8"

            def read(e: int) -> Part:
                m = module(e)
                if packed:
                    pf = 32 // bits
                    p = ck.read(m + ".weight_packed", (N, -(-K // pf)), ["I32"], what=label)
                    shp = ck.read(m + ".weight_shape", (2,), ["I32", "I64"])
                    if [int(v) for v in shp] != [N, K]:
                        raise ValueError(f"tensor {m}.weight_shape: {[int(v) for v in shp]} but "
                                         f"[{N}, {K}] was expected")
                    q = _unpack_int32(p, bits, K)
                else:
                    q = ck.read(m + ".weight", (N, K), ["I8"], what=label)
                    if bits == 4 and (q.min() < -8 or q.max() > 7):
                        raise ValueError(f"tensor {m}.weight: 4-bit values must be in [-8, 7], "
                                         f"got [{q.min()}, {q.max()}]")
                sname = m + ".weight_scale"
                dt, shp = ck.info(sname, label)
                G = 1 if g == -1 else K // g
                if tensor_scale and int(np.prod(shp)) == 1:    # one scale: broadcast per channel
                    s = np.full((N, 1), _to_f32(ck.read(sname, shp, FLOAT)).reshape(-1)[0], np.float32)
                else:
                    want = (N,) if g == -1 and len(shp) == 1 else (N, G)
                    s = _to_f32(ck.read(sname, want, FLOAT, what=label)).reshape(N, G)
                return Part("int", q, s)
            return Source(label, N, native, g, read, a16=weight_only)

        if ck.has(m0 + ".weight_scale_inv"):   # DeepSeek-V3 block fp8
            blk = self.qc.get("weight_block_size")
            if not (isinstance(blk, (list, tuple)) and len(blk) == 2):
                raise ValueError(f"config.json: quantization_config key 'weight_block_size' is missing or not "
                                 f"[bn, bk] (needed for {m0}.weight_scale_inv)")
            bn, bk = int(blk[0]), int(blk[1])

            def read(e: int) -> Part:
                m = module(e)
                q = ck.read(m + ".weight", (N, K), ["F8_E4M3"], what=label)
                s = _to_f32(ck.read(m + ".weight_scale_inv", (-(-N // bn), -(-K // bk)), ["F32", "BF16"]))
                return Part("fp8", q, s, bn)
            return Source(label, N, "fp8_w8a16", (bn, bk), read)

        def read(e: int) -> Part:
            return Part("float", _to_f32(ck.read(module(e) + ".weight", (N, K), FLOAT, what=label)))
        if ck.has(m0 + ".weight"):
            dt = ck.info(m0 + ".weight")[0]
            if dt not in FLOAT:
                raise ValueError(f"tensor {m0}.weight: dtype {dt} but one of {list(FLOAT)} (or compressed-tensors "
                                 "int8 / DeepSeek F8_E4M3 with weight_scale_inv) was expected")
        return Source(label, N, "float", -1, read)   # a missing tensor raises on read

    def gptq_awq(self, label: str, module, N: int, K: int) -> Source:
        """GPTQ or AWQ int4 [N, K] per module: uint8 codes, zero points and scales (and g_idx)."""
        ck, m0 = self.ck, module(0)
        meth, g, v1 = _int4_config(self.qc, m0 + ".qweight", K)
        G = 1 if g == -1 else K // g
        awq = meth == "awq"
        # per channel (one group) has no order to keep: its g_idx (all 0) is not read
        act = not awq and g != -1 and (bool(self.qc.get("desc_act")) or ck.has(m0 + ".g_idx"))
        if awq and ck.has(m0 + ".g_idx"):
            raise ValueError(f"tensor {m0}.g_idx: AWQ checkpoints have no act-order")

        def read(e: int) -> Part:
            m = module(e)
            if awq:
                qw = ck.read(m + ".qweight", (K, -(-N // 8)), ["I32"], what=label)
                q = np.ascontiguousarray(_unpack_cols(qw, N, True).T)
            else:
                qw = ck.read(m + ".qweight", (-(-K // 8), N), ["I32"], what=label)
                q = np.ascontiguousarray(_nibbles(qw).transpose(1, 0, 2).reshape(N, -1)[:, :K])
            z = _unpack_cols(ck.read(m + ".qzeros", (G, -(-N // 8)), ["I32"], what=label), N, awq)
            if v1:   # GPTQ v1 stores zero - 1
                z = (z + 1) & 15
            s = _to_f32(ck.read(m + ".scales", (G, N), ("F16", "F32", "BF16"), what=label))
            gi = None
            if act:   # a missing g_idx raises naming the tensor
                gi = _check_g_idx(ck.read(m + ".g_idx", (K,), ["I32", "I64"], what=label), m + ".g_idx", G, g)
            return Part("int", q, np.ascontiguousarray(s.T), zeros=np.ascontiguousarray(z.T), g_idx=gi)
        return Source(label, N, "int4_w4a8", g, read, zeros=True, act_order=act, a16=True)

    def fused(self, label: str, name: str, rows: int, K: int, E: int) -> Source:
        """gpt-oss: one [E, K, rows] tensor, transposed per expert to [rows, K]."""
        def read(e: int) -> Part:
            return Part("float", np.ascontiguousarray(_to_f32(self.ck.read(name, (E, K, rows), FLOAT, e, label)).T))
        return Source(label, rows, "float", -1, read)

    def mxfp4(self, label: str, name: str, rows: int, K: int, E: int) -> Source:
        """gpt-oss MXFP4: ``name_blocks`` uint8 [E, rows, K/32, 16] (two e2m1 codes per byte, the low
        nibble first) and ``name_scales`` uint8 [E, rows, K/32] (e8m0; 0xFF, NaN, raises), read per
        expert as [rows, K] codes of the MXFP4 codebook with scales 2^(e - 128), losslessly."""
        if K % 32:
            raise ValueError(f"tensor {name}_blocks: MXFP4 needs the input dimension to be a multiple of 32, got {K}")

        def read(e: int) -> Part:
            b = self.ck.read(name + "_blocks", (E, rows, K // 32, 16), ["U8"], e, label)
            sc = self.ck.read(name + "_scales", (E, rows, K // 32), ["U8"], e, label)
            if (sc == 255).any():    # e8m0 0xFF is NaN (OCP MX): no weight to load
                r, g = np.argwhere(sc == 255)[0]
                raise ValueError(f"tensor {name}_scales: expert {e}, row {r}, block {g} holds 0xFF, which is NaN "
                                 "in e8m0 (OCP MX); the checkpoint is damaged")
            q = np.empty((rows, K // 32, 32), np.uint8)
            q[..., 0::2], q[..., 1::2] = b & 15, b >> 4
            return Part("int", q.reshape(rows, K), mxfp4_scales(sc), codebook=MXFP4_VALUES)
        return Source(label, rows, "int4_w4a8", 32, read, codebook=MXFP4_VALUES, a16=True)

    def vector(self, name: str, shape: Tuple[int, ...]) -> np.ndarray:
        return np.ascontiguousarray(_to_f32(self.ck.read(name, shape, FLOAT)).reshape(shape))


def _find_base(ck: _Checkpoint, L: int) -> str:
    """The layer's MoE module prefix, e.g. 'model.layers.3.mlp.'."""
    keys = ck.keys()
    for pre in ("model.layers.", "model.language_model.layers.", "language_model.model.layers."):
        for mlp in ("mlp.", "block_sparse_moe."):
            base = f"{pre}{L}.{mlp}"
            if any(k.startswith(base + "experts.") for k in keys):
                return base
    raise ValueError(f"no MoE experts for layer {L}: no tensor 'model.layers.{L}.mlp.experts.*' "
                     f"(or 'block_sparse_moe.experts.*') in the checkpoint")


def load_safetensors_layer(path: Any, layer_idx: int, scheme: Optional[str] = None,
                           group_size: Optional[int] = None,
                           block_size: Tuple[int, int] = (128, 128),
                    experts: Optional[Sequence[int]] = None, act_block: object = "auto") -> LayerWeights:
    """Load layer ``layer_idx`` of a safetensors checkpoint (see ``moe_cpu.loaders.load_layer``)."""
    files, cfg_path = _files(path)
    if not os.path.isfile(cfg_path):
        raise ValueError(f"{os.path.dirname(cfg_path)}: config.json is missing (it must be next to the "
                         "safetensors files)")
    try:
        with open(cfg_path) as fh:
            cfg = json.load(fh)
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{cfg_path}: not a readable JSON file ({err})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{cfg_path}: expected a JSON object")
    if isinstance(cfg.get("text_config"), dict):    # multimodal wrappers keep the LM in text_config
        cfg = {"quantization_config": cfg.get("quantization_config"), **cfg["text_config"]}
    conf = config_from_hf(cfg, layer_idx, cfg_path)
    E, H, I = conf.num_experts, conf.hidden_size, conf.intermediate_size
    ck = _Checkpoint(files)
    lay = _Layer(ck, cfg)
    base = _find_base(ck, layer_idx)
    ex = base + "experts."
    w13_bias = w2_bias = gate_bias = None
    mxfp4 = ck.has(ex + "gate_up_proj_blocks")
    if mxfp4 or ck.has(ex + "gate_up_proj"):       # gpt-oss: fused, interleaved
        fused = ex + "gate_up_proj" + ("_blocks" if mxfp4 else "")
        if conf.model_type != "gpt_oss":
            raise ValueError(f"tensor {fused}: fused expert tensors are only supported for gpt_oss "
                             f"(interleaved gate/up), not {conf.model_type}")
        if mxfp4:   # the release layout: [E, out, in / 32, 16] blocks + e8m0 scales
            qm = (cfg.get("quantization_config") or {}).get("quant_method", "mxfp4")
            if qm != "mxfp4":
                raise ValueError(f"tensor {fused}: found, but config.json quant_method is {qm!r} (expected 'mxfp4')")
            w13_src = [lay.mxfp4(ex + "gate_up_proj", ex + "gate_up_proj", 2 * I, H, E)]
            w2_src = [lay.mxfp4(ex + "down_proj", ex + "down_proj", H, I, E)]
        else:       # bf16 / f16 / f32: [E, in, out]
            w13_src = [lay.fused(ex + "gate_up_proj", ex + "gate_up_proj", 2 * I, H, E)]
            w2_src = [lay.fused(ex + "down_proj", ex + "down_proj", H, I, E)]
        if ck.has(ex + "gate_up_proj_bias") or ck.has(ex + "down_proj_bias"):
            w13_bias = lay.vector(ex + "gate_up_proj_bias", (E, 2 * I))
            w2_bias = lay.vector(ex + "down_proj_bias", (E, H))
        router = base + "router."
    else:
        names = ("gate_proj", "up_proj", "down_proj") if any(
            k.startswith(ex) and ".gate_proj." in k for k in ck.keys()) else ("w1", "w3", "w2")
        mod = lambda p: (lambda e: f"{ex}{e}.{p}")  # noqa: E731
        w13_src = [lay.source(f"{ex}*.{names[0]}", mod(names[0]), I, H),
                   lay.source(f"{ex}*.{names[1]}", mod(names[1]), I, H)]
        w2_src = [lay.source(f"{ex}*.{names[2]}", mod(names[2]), H, I)]
        router = base + "gate."
    what = f"layer {layer_idx} routed experts"
    sch = resolve_scheme(w13_src + w2_src, scheme, what)
    ids = check_expert_ids(experts, E)
    w13, w2, folded = build_pair(w13_src, w2_src, E, H, I, (sch, sch), (f"w13 ({w13_src[0].name}, ...)",
                                 f"w2 ({w2_src[0].name})"), group_size, block_size, ids, act_block)
    if folded and w13_bias is not None:
        raise ValueError(f"{w2_src[0].name}: act-order with expert biases is not supported")
    gate = lay.vector(router + "weight", (E, H))
    if ck.has(router + "bias"):
        gate_bias = lay.vector(router + "bias", (E,))

    bias = None
    if ck.has(base + "gate.e_score_correction_bias"):
        bias = lay.vector(base + "gate.e_score_correction_bias", (E,))
    elif cfg.get("topk_method") == "noaux_tc":
        raise ValueError(f"missing tensor {base}gate.e_score_correction_bias (topk_method noaux_tc needs it)")

    shared = [None, None]
    shared_gate = None
    sbase = next((base + s for s in ("shared_experts.", "shared_expert.")
                  if any(ck.has(f"{base}{s}gate_proj.{t}") for t in ("weight", "weight_packed", "qweight"))), None)
    if sbase is None and conf.shared_intermediate_size:
        raise ValueError(f"missing tensor {base}shared_experts.gate_proj.weight (or shared_expert.*): "
                         f"config.json declares a shared expert")
    if sbase is not None:
        t = sbase + "gate_proj." + ("weight" if ck.has(sbase + "gate_proj.weight") else "weight_packed")
        if not conf.shared_intermediate_size and ck.has(sbase + "gate_proj.qweight"):
            raise ValueError(f"tensor {sbase}gate_proj.qweight: config.json must give the shared expert's "
                             "intermediate size (shared_expert_intermediate_size or n_shared_experts)")
        Is = conf.shared_intermediate_size or ck.info(t)[1][0]
        conf.shared_intermediate_size = Is
        smod = lambda p: (lambda e: f"{sbase}{p}")  # noqa: E731
        s13 = [lay.source(f"{sbase}gate_proj", smod("gate_proj"), Is, H),
               lay.source(f"{sbase}up_proj", smod("up_proj"), Is, H)]
        s2 = [lay.source(f"{sbase}down_proj", smod("down_proj"), H, Is)]
        ssch = resolve_scheme(s13 + s2, scheme, f"layer {layer_idx} shared expert")
        shared = list(build_pair(s13, s2, 1, H, Is, (ssch, ssch), (f"shared_w13 ({sbase}gate_proj, up_proj)",
                                 f"shared_w2 ({sbase}down_proj)"), group_size, block_size, act_block=act_block)[:2])
        if ck.has(base + "shared_expert_gate.weight"):
            shared_gate = lay.vector(base + "shared_expert_gate.weight", (1, H)).reshape(H)
    return LayerWeights(w13=w13, w2=w2, gate=gate, config=conf, w13_bias=w13_bias, w2_bias=w2_bias,
                        shared_w13=shared[0], shared_w2=shared[1], e_score_correction_bias=bias,
                        gate_bias=gate_bias, shared_expert_gate=shared_gate,
                        source=f"safetensors {w13_src[0].native} -> {sch} ({os.path.dirname(cfg_path)})")
