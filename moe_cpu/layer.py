"""MoELayer: one Mixture-of-Experts layer (router, routed experts, optional shared expert).

The layer owns its weights and routing configuration and chains the moe_cpu calls::

    logits  = x @ gate.T                          (float32; bf16 inputs are widened first)
    w, ids  = select_experts(logits, top_k, ...)  (weights include routed_scaling_factor)
    out     = fused_experts(x, w13, w2, w, ids, activation, biases)
    out    += SiLU-FFN_shared(x)                  (only with a shared expert; Qwen2-MoE multiplies
                                                   it by sigmoid(x @ shared_expert_gate) per token)

The whole chain runs in C++ without the GIL (``_core.moe_layer``); ``layer.submit(x, stream)`` queues the same
call on a ``moe_cpu.Stream``, so it gives the same bits. ``MoELayer.from_float`` quantizes float32 weights;
``layer.reference(x)`` evaluates the same layer in float64 NumPy for accuracy checks.
"""
from __future__ import annotations

import json
import os
from typing import Optional, Tuple

import numpy as np

from . import _core, api, reference
from ._core import PackedExperts
from ._dlpack import accepts_dlpack
from .router import Router, check_f32, round_like, widen

_LAYER_FORMAT = "moe_cpu.layer"   # layer.json "format" written by MoELayer.save

__all__ = ["MoELayer"]


# ---------------------------------------------------------------------------------------- checks
def _pair_ok(w13: PackedExperts, w2: PackedExperts) -> bool:
    """fused_experts' pairs: one scheme, or int4 / int8 in any pair with the same activations (A8 or A16)."""
    return w13.scheme == w2.scheme or any(w13.scheme in t and w2.scheme in t for t in (api.A8_SCHEMES, api.A16_SCHEMES))


def _packed(w: object, name: str) -> PackedExperts:
    if not isinstance(w, PackedExperts):
        raise TypeError(f"{name} must be a PackedExperts (see moe_cpu.quantize_experts / pack_*), "
                        f"got {type(w).__name__}")
    return w


def quantize(w: object, name: str, ndim: int, **q: object) -> PackedExperts:
    """``quantize_experts`` of a float32 array of ``ndim`` dims (2: one expert); errors name the argument."""
    if not isinstance(w, np.ndarray) or w.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-D float32 array, got {getattr(w, 'shape', type(w).__name__)}")
    try:
        return api.quantize_experts(np.ascontiguousarray(w if ndim == 3 else w[None]), **q)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{name}: {e}") from None


def quantize_shared(shared_w13: object, shared_w2: object, **q: object) -> Tuple[Optional[PackedExperts], ...]:
    """The shared expert's float32 ``[2Is, H]`` / ``[H, Is]`` quantized (or (None, None))."""
    if (shared_w13 is None) != (shared_w2 is None):
        raise ValueError("shared_w13 and shared_w2 must be given together (or neither)")
    if shared_w13 is None:
        return None, None
    return quantize(shared_w13, "shared_w13", 2, **q), quantize(shared_w2, "shared_w2", 2, **q)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _of_router(name: str) -> property:
    return property(lambda self: getattr(self.router, name), doc=f"The router's ``{name}`` (``MoELayer.router``).")


# ----------------------------------------------------------------------------------------- layer
class MoELayer:
    """A Mixture-of-Experts layer on packed weights.

    Args:
        gate: router weight, float32 ``[E, H]`` (logits = x @ gate.T).
        w13: PackedExperts ``[E, 2I, H]`` (rows [0, I) gate, [I, 2I) up; interleaved for "swigluoai").
        w2: PackedExperts ``[E, H, I]`` of the same scheme (or int4_w4a8 / int8_w8a8 in any pair).
        top_k: experts per token, in [1, E].
        w13_bias, w2_bias: optional float32 ``[E, 2I]`` / ``[E, H]`` expert biases.
        shared_w13, shared_w2: optional shared expert, PackedExperts ``[1, 2Is, H]`` / ``[1, H, Is]``
            (both or neither; any scheme, the same for both). It always uses SiLU (``shared_expert``).
        shared_expert_gate: optional float32 ``[H]`` (Qwen2-MoE): the shared expert's output is
            multiplied per token by ``sigmoid(x @ shared_expert_gate)`` (needs a shared expert).
        renormalize, scoring_func, use_grouped_topk, num_expert_group, topk_group,
        e_score_correction_bias (float32 ``[E]``), routed_scaling_factor: routing, as in
            ``moe_cpu.select_experts``.
        activation: one of ``moe_cpu.ACTIVATIONS``.

    ``routed_scaling_factor`` multiplies the routed output only, before the shared expert is added
    (DeepSeek-V3: ``out = factor * routed + shared``). ``select_experts`` already folds the factor
    into the router weights, so the shared expert is added with ``shared_expert(...,
    routed_scaling_factor=1.0)``.

    The router, its settings and the shared-expert gate live in ``layer.router`` (``moe_cpu.router.Router``);
    the layer shows them as read-only attributes of the same names.
    """

    gate, gate_bias, top_k, shared_expert_gate = (_of_router(n) for n in ("gate", "gate_bias", "top_k",
                                                                           "shared_expert_gate"))
    renormalize, scoring_func, use_grouped_topk, num_expert_group, topk_group = (
        _of_router(n) for n in ("renormalize", "scoring_func", "use_grouped_topk", "num_expert_group", "topk_group"))
    e_score_correction_bias, routed_scaling_factor = (_of_router(n) for n in ("e_score_correction_bias",
                                                                             "routed_scaling_factor"))

    def __init__(self, gate: np.ndarray, w13: PackedExperts, w2: PackedExperts, *, top_k: int,
                 w13_bias: Optional[np.ndarray] = None, w2_bias: Optional[np.ndarray] = None,
                 shared_w13: Optional[PackedExperts] = None, shared_w2: Optional[PackedExperts] = None,
                 renormalize: bool = False, scoring_func: str = "softmax", use_grouped_topk: bool = False,
                 num_expert_group: Optional[int] = None, topk_group: Optional[int] = None,
                 e_score_correction_bias: Optional[np.ndarray] = None, routed_scaling_factor: float = 1.0,
                 activation: str = "silu", gate_bias: Optional[np.ndarray] = None,
                 shared_expert_gate: Optional[np.ndarray] = None) -> None:
        self.w13, self.w2 = _packed(w13, "w13"), _packed(w2, "w2")
        if not _pair_ok(w13, w2):
            raise ValueError(f"w13 is packed as {w13.scheme} but w2 as {w2.scheme}; both must use the same scheme, "
                             "or int4_w4a8 / int8_w8a8 (int4_w4a16 / int8_w8a16) in any pair")
        E, H = w13.num_experts, w13.in_features
        if w13.out_features % 2:
            raise ValueError(f"w13.out_features = {w13.out_features} must be even (2 * I: gate and up)")
        I = w13.out_features // 2
        if (w2.num_experts, w2.out_features, w2.in_features) != (E, H, I):
            raise ValueError(f"w2 is [{w2.num_experts}, {w2.out_features}, {w2.in_features}] but "
                             f"[E={E}, H={H}, I={I}] was expected from w13 [{E}, {2 * I}, {H}]")
        if not isinstance(gate, np.ndarray):
            raise TypeError(f"gate must be a numpy float32 array [E, H], got {type(gate).__name__}")
        check_f32(gate, "gate", (E, H))
        self.w13_bias = check_f32(w13_bias, "w13_bias", (E, 2 * I))
        self.w2_bias = check_f32(w2_bias, "w2_bias", (E, H))

        if (shared_w13 is None) != (shared_w2 is None):
            raise ValueError("shared_w13 and shared_w2 must be given together (or neither)")
        self.shared_w13, self.shared_w2 = shared_w13, shared_w2
        if shared_w13 is not None:
            s13, s2 = _packed(shared_w13, "shared_w13"), _packed(shared_w2, "shared_w2")
            if not _pair_ok(s13, s2):
                raise ValueError(f"shared_w13 is packed as {s13.scheme} but shared_w2 as {s2.scheme}")
            if s13.num_experts != 1 or s2.num_experts != 1:
                raise ValueError(f"the shared expert must have num_experts == 1, got shared_w13 "
                                 f"{s13.num_experts} and shared_w2 {s2.num_experts}")
            Is = s13.out_features // 2
            if s13.out_features % 2 or s13.in_features != H or (s2.out_features, s2.in_features) != (H, Is):
                raise ValueError(f"shared_w13 [1, {s13.out_features}, {s13.in_features}] and shared_w2 "
                                 f"[1, {s2.out_features}, {s2.in_features}] must be [1, 2Is, H={H}] and [1, H={H}, Is]")
        if shared_expert_gate is not None and shared_w13 is None:
            raise ValueError("shared_expert_gate is given but the layer has no shared expert (shared_w13 / shared_w2)")

        self.router = Router(gate, top_k=top_k, gate_bias=gate_bias, renormalize=renormalize,
                             scoring_func=scoring_func, use_grouped_topk=use_grouped_topk,
                             num_expert_group=num_expert_group, topk_group=topk_group,
                             e_score_correction_bias=e_score_correction_bias,
                             routed_scaling_factor=routed_scaling_factor, shared_expert_gate=shared_expert_gate)
        if activation not in api.ACTIVATIONS:
            raise ValueError(f"activation = {activation!r} must be one of {api.ACTIVATIONS}")
        self.activation = activation
        r = self.router   # the C++ plan of __call__ / submit: the layer's weights are fixed from here on
        self._plan = _core.LayerPlan(r.gate, r.gate_bias, r.top_k, r.renormalize, r.scoring_func, r.use_grouped_topk,
                                     r.num_expert_group or 0, r.topk_group or 0, r.e_score_correction_bias,
                                     r.routed_scaling_factor, w13, w2, self.w13_bias, self.w2_bias,
                                     api._act_name(activation), shared_w13, shared_w2, r.shared_expert_gate)

    # ------------------------------------------------------------------ construction from float
    @classmethod
    def from_float(cls, gate: np.ndarray, w13: np.ndarray, w2: np.ndarray, *, top_k: int,
                   scheme: str = "int4_w4a8", group_size: Optional[int] = None,
                   block_size: Tuple[int, int] = (128, 128), w13_bias: Optional[np.ndarray] = None,
                   w2_bias: Optional[np.ndarray] = None, shared_w13: Optional[np.ndarray] = None,
                   shared_w2: Optional[np.ndarray] = None, renormalize: bool = False,
                   scoring_func: str = "softmax", use_grouped_topk: bool = False,
                   num_expert_group: Optional[int] = None, topk_group: Optional[int] = None,
                   e_score_correction_bias: Optional[np.ndarray] = None,
                   routed_scaling_factor: float = 1.0, activation: str = "silu",
                   gate_bias: Optional[np.ndarray] = None,
                   shared_expert_gate: Optional[np.ndarray] = None) -> "MoELayer":
        """Quantize float32 weights with ``moe_cpu.quantize_experts`` and build the layer.

        Args:
            gate: float32 ``[E, H]``. w13: float32 ``[E, 2I, H]``. w2: float32 ``[E, H, I]``.
            scheme, group_size, block_size: as in ``quantize_experts`` (int4 default group 128,
                int8 default per channel; the group size must divide H and I).
            shared_w13, shared_w2: optional shared expert, float32 ``[2Is, H]`` and ``[H, Is]``,
                quantized with the same scheme and group size (which must then divide Is too).
            The other arguments are passed to ``MoELayer(...)`` unchanged.
        """
        q = dict(scheme=scheme, group_size=group_size, block_size=block_size)
        shared = quantize_shared(shared_w13, shared_w2, **q)
        return cls(gate, quantize(w13, "w13", 3, **q), quantize(w2, "w2", 3, **q), top_k=top_k, w13_bias=w13_bias, w2_bias=w2_bias,
                   shared_w13=shared[0], shared_w2=shared[1], renormalize=renormalize,
                   scoring_func=scoring_func, use_grouped_topk=use_grouped_topk,
                   num_expert_group=num_expert_group, topk_group=topk_group,
                   e_score_correction_bias=e_score_correction_bias,
                   routed_scaling_factor=routed_scaling_factor, activation=activation, gate_bias=gate_bias,
                   shared_expert_gate=shared_expert_gate)

    # ------------------------------------------------------------------ checkpoints and packed files
    @classmethod
    def from_pretrained(cls, path: "str | os.PathLike[str]", layer_idx: int, scheme: Optional[str] = None,
                        **loader_kwargs: object) -> "MoELayer":
        """Layer ``layer_idx`` of a checkpoint (safetensors directory or file, or GGUF), via
        ``moe_cpu.loaders.load_layer`` (which documents formats, model families and ``scheme``).
        An expert-parallel layer is ``moe_cpu.distributed.EPMoELayer.from_pretrained(..., comm=comm)``."""
        if "comm" in loader_kwargs:
            raise TypeError("MoELayer.from_pretrained takes no comm=; an expert-parallel layer is "
                            "moe_cpu.distributed.EPMoELayer.from_pretrained(path, layer_idx, scheme, comm=comm)")
        from .loaders import load_layer

        return cls.from_weights(load_layer(path, layer_idx, scheme, **loader_kwargs))

    @classmethod
    def from_weights(cls, weights: "LayerWeights") -> "MoELayer":
        """The layer of a loader's ``LayerWeights`` (``moe_cpu.loaders.load_layer``): its packed
        weights, router, biases, shared expert (and Qwen2-MoE's shared-expert gate) and the routing of
        its ``config``."""
        from .loaders import LayerWeights

        if not isinstance(weights, LayerWeights):
            raise TypeError(f"weights must be a moe_cpu.loaders.LayerWeights, got {type(weights).__name__}")
        if weights.experts is not None:
            raise ValueError("these weights hold a subset of the experts (load_layer(..., experts=...)); use "
                             "moe_cpu.distributed.EPMoELayer for expert parallelism")
        w, c = weights, weights.config
        return cls(w.gate, w.w13, w.w2, top_k=c.top_k, gate_bias=w.gate_bias, w13_bias=w.w13_bias,
                   w2_bias=w.w2_bias, shared_w13=w.shared_w13, shared_w2=w.shared_w2,
                   shared_expert_gate=w.shared_expert_gate, e_score_correction_bias=w.e_score_correction_bias,
                   activation=c.activation, **c.routing_kwargs())

    def save(self, directory: "str | os.PathLike[str]") -> None:
        """Write the layer to a directory: packed weights (``*.moe``, mapped back without a copy by
        :meth:`load`), the router and biases as ``.npy``, and the routing settings in ``layer.json``."""
        d = os.fspath(directory)
        os.makedirs(d, exist_ok=True)
        packed = {"w13": self.w13, "w2": self.w2, "shared_w13": self.shared_w13, "shared_w2": self.shared_w2}
        arrays = {"gate": self.gate, "gate_bias": self.gate_bias, "w13_bias": self.w13_bias, "w2_bias": self.w2_bias,
                  "e_score_correction_bias": self.e_score_correction_bias,
                  "shared_expert_gate": self.shared_expert_gate}
        for name, p in packed.items():
            if p is not None:
                p.save(os.path.join(d, f"{name}.moe"))
        for name, a in arrays.items():
            if a is not None:
                np.save(os.path.join(d, f"{name}.npy"), a)
        # version 2 may hold shared_expert_gate, which a version-1 reader would drop silently
        meta = {"format": _LAYER_FORMAT, "version": 2, "activation": self.activation, "top_k": self.top_k,
                "packed": sorted(k for k, p in packed.items() if p is not None),
                "arrays": sorted(k for k, a in arrays.items() if a is not None),
                **{k: v for k, v in self.router.routing_kwargs().items() if k != "e_score_correction_bias"}}
        with open(os.path.join(d, "layer.json"), "w") as f:
            json.dump(meta, f, indent=1)

    @classmethod
    def load(cls, directory: "str | os.PathLike[str]", mmap: bool = True) -> "MoELayer":
        """A layer written by :meth:`save`; packed weights are mapped read-only (``mmap=True``)."""
        d = os.fspath(directory)
        try:
            with open(os.path.join(d, "layer.json")) as f:
                meta = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"directory = {d!r} holds no readable layer.json ({e})") from None
        if meta.get("format") != _LAYER_FORMAT or meta.get("version") not in (1, 2):
            raise ValueError(f"{d!r}/layer.json is not a moe_cpu layer (format {meta.get('format')!r}, "
                             f"version {meta.get('version')!r})")
        packed = {k: api.load_packed(os.path.join(d, f"{k}.moe"), mmap=mmap) for k in meta["packed"]}
        arrays = {k: np.load(os.path.join(d, f"{k}.npy")) for k in meta["arrays"]}
        routing = {k: meta[k] for k in ("renormalize", "scoring_func", "use_grouped_topk", "num_expert_group",
                                        "topk_group", "routed_scaling_factor")}
        return cls(arrays["gate"], packed["w13"], packed["w2"], top_k=meta["top_k"], activation=meta["activation"],
                   gate_bias=arrays.get("gate_bias"), w13_bias=arrays.get("w13_bias"), w2_bias=arrays.get("w2_bias"),
                   e_score_correction_bias=arrays.get("e_score_correction_bias"),
                   shared_w13=packed.get("shared_w13"), shared_w2=packed.get("shared_w2"),
                   shared_expert_gate=arrays.get("shared_expert_gate"), **routing)

    # ------------------------------------------------------------------ shapes
    @property
    def num_experts(self) -> int:
        """E, the number of routed experts."""
        return self.w13.num_experts

    @property
    def hidden_size(self) -> int:
        """H, the model dimension."""
        return self.w13.in_features

    @property
    def intermediate_size(self) -> int:
        """I, the routed experts' intermediate dimension."""
        return self.w2.in_features

    @property
    def scheme(self) -> str:
        """The routed experts' weight scheme (one of ``moe_cpu.SCHEMES``)."""
        return self.w13.scheme

    @property
    def act_blocks(self) -> Tuple[Optional[int], Optional[int]]:
        """A8 activation blocks of (w13, w2): an int (one int8 scale per that many channels of a token) or None
        (one per token; also for A16 / fp8 / bf16). docs/numerics.md, "Activation blocks"."""
        return self.w13.act_block, self.w2.act_block

    @property
    def has_shared_expert(self) -> bool:
        """True when a shared expert is added to every token's output."""
        return self.shared_w13 is not None

    @property
    def nbytes(self) -> int:
        """Packed weight bytes: routed experts plus the shared expert (router and biases excluded)."""
        n = self.w13.nbytes + self.w2.nbytes
        if self.has_shared_expert:
            n += self.shared_w13.nbytes + self.shared_w2.nbytes
        return n

    # ------------------------------------------------------------------ forward
    @accepts_dlpack("x")
    def router_logits(self, x: np.ndarray) -> np.ndarray:
        """float32 ``[M, E]`` = x @ gate.T (+ gate_bias). bf16 inputs are widened to float32 values here."""
        return self.router.logits(x)

    @accepts_dlpack("x")
    def route(self, x: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """``(topk_weights float32 [M, k], topk_ids int32 [M, k])`` from ``moe_cpu.select_experts``;
        the weights include ``routed_scaling_factor``."""
        return self.router.route(x)

    @accepts_dlpack("x", bf16_from="x")
    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Run the layer on x ``[M, H]`` (float32 or bfloat16; NumPy, or a torch / JAX CPU tensor through
        DLPack, which gives the result in that library); returns ``[M, H]`` of x's dtype.

        The router matmul runs in float32 (bf16 inputs are widened to their float32 values); the
        experts take x as is. Routed output (scaled by ``routed_scaling_factor`` through the router
        weights) plus, when present, the SiLU shared expert added unscaled, rounded once to x's dtype.
        """
        return api._wrap_out(_core.moe_layer(self._plan, api._bf16_bits(self.router.check_x(x))), x)

    @accepts_dlpack("x", bf16_from="x")
    def submit(self, x: np.ndarray, stream: "Stream") -> "PendingExperts":
        """Queue the whole layer (router, experts, shared expert) on a :class:`moe_cpu.Stream`; returns at once
        with a :class:`moe_cpu.stream.PendingExperts` whose ``wait()`` gives what ``layer(x)`` gives, bit for bit.
        Shape / dtype / non-finite errors of x raise here (nothing is queued); errors of the run (a non-finite
        bias of a routed expert) raise from ``wait()``. The task holds x and the layer until it has run."""
        from .stream import Stream

        if not isinstance(stream, Stream):
            raise TypeError(f"stream must be a moe_cpu.Stream, got {type(stream).__name__}")
        return stream._submit_layer(self._plan, self.router.check_x(x))

    @accepts_dlpack("x", "topk_weights", "topk_ids", bf16_from="x")
    def run_experts(self, x: np.ndarray, topk_weights: np.ndarray, topk_ids: np.ndarray) -> np.ndarray:
        """The layer after routing: ``fused_experts`` on the given routing (float32 ``[M, k]`` weights that
        already include ``routed_scaling_factor``; int32 / int64 ids) plus the shared expert, as ``__call__``.
        Lets a caller route elsewhere (e.g. a model's own router, moe_cpu.integrations.transformers)."""
        x, weights, ids = self.router.check_x(x), topk_weights, topk_ids
        if self.shared_expert_gate is not None:
            return self._call_gated_shared(x, weights, ids)
        out = api.fused_experts(x, self.w13, self.w2, weights, ids, activation=self.activation,
                                w13_bias=self.w13_bias, w2_bias=self.w2_bias)
        if self.has_shared_expert:   # factor already applied by select_experts
            out = api.shared_expert(x, self.shared_w13, self.shared_w2, out, 1.0, inplace=True)
        return out

    @accepts_dlpack("x")
    def shared_gate(self, x: np.ndarray) -> np.ndarray:
        """float32 ``[M]``: Qwen2-MoE's per-token shared-expert weight ``sigmoid(x @ shared_expert_gate)``."""
        return self.router.shared_gate(x)

    def _call_gated_shared(self, x: np.ndarray, weights: np.ndarray, ids: np.ndarray) -> np.ndarray:
        # The shared expert runs as a one-expert fused_experts whose top-k weight is the gate; both
        # parts come back in fp32 (x widened: the kernels see the same values) and the sum is rounded
        # once to x's dtype.
        xf = widen(x)
        out = api.fused_experts(xf, self.w13, self.w2, weights, ids, activation=self.activation,
                                w13_bias=self.w13_bias, w2_bias=self.w2_bias)
        M = x.shape[0]
        out += api.fused_experts(xf, self.shared_w13, self.shared_w2, self.shared_gate(x)[:, None],
                                 np.zeros((M, 1), np.int32))
        return round_like(out, x)

    @accepts_dlpack("x")
    def reference(self, x: np.ndarray) -> np.ndarray:
        """float64 ``[M, H]``: the same layer in NumPy (``moe_cpu.reference``) for accuracy checks.

        Routes with ``reference.select_experts_ref`` on the same float32 logits and computes every
        expert in float64 with the dequantized weights (``unpack()``): the weight quantization is
        included, the kernels' activation quantization / bf16 rounding is not. The shared expert
        (SiLU FFN of its dequantized weights) is added in float64 too.
        """
        x = self.router.check_x(x)
        weights, ids = reference.select_experts_ref(self.router.logits(x), self.top_k, **self.router.routing_kwargs())
        out = reference.fused_experts_float64(x, self.w13.unpack(), self.w2.unpack(), weights, ids,
                                              activation=self.activation, w13_bias=self.w13_bias,
                                              w2_bias=self.w2_bias)
        if self.has_shared_expert:
            M = x.shape[0]
            g = np.ones((M, 1), np.float32) if self.shared_expert_gate is None else self.shared_gate(x)[:, None]
            out += reference.fused_experts_float64(x, self.shared_w13.unpack(), self.shared_w2.unpack(),
                                                   g, np.zeros((M, 1), np.int32))
        return out

    # ------------------------------------------------------------------ display
    def __repr__(self) -> str:
        def desc(w: PackedExperts) -> str:
            quant = {"fp8_w8a16": f"block {w.block_size}", "bf16": ""}.get(w.scheme, f"group {w.group_size}").replace("group -1", "per channel")
            if w.form not in ("int4", "int8", "fp8", "bf16"):
                quant += f", {w.form}"
            if w.scheme in api.A8_SCHEMES:
                quant += ", activations per token" if w.act_block is None else f", activation blocks of {w.act_block}"
            return f"{w.scheme}{' (' + quant + ')' if quant else ''}, kernel {w.kernel}"

        w13, w2 = self.w13, self.w2
        same = (w13.scheme, w13.form, w13.group_size, w13.act_block) == (w2.scheme, w2.form, w2.group_size, w2.act_block)
        weights = desc(w13) if same else f"w13 {desc(w13)}; w2 {desc(w2)}"
        biases = ", with biases" if self.w13_bias is not None or self.w2_bias is not None else ""
        lines = [f"MoELayer(E={self.num_experts}, H={self.hidden_size}, I={self.intermediate_size}, "
                 f"top_k={self.top_k}, activation={self.activation})",
                 f"  weights: {weights}, {_mib(self.nbytes)}{biases}",
                 f"  routing: {self.router.describe()}"]
        if self.has_shared_expert:
            gated = ", sigmoid-gated per token" if self.shared_expert_gate is not None else ""
            lines.append(f"  shared expert: Is={self.shared_w2.in_features}, {self.shared_w13.scheme}, "
                         f"{_mib(self.shared_w13.nbytes + self.shared_w2.nbytes)}{gated}")
        return "\n".join(lines)
