"""CPUExpertsInt4; vLLM: ``vllm/model_executor/layers/fused_moe/experts/cpu_int4_moe.py``."""

from __future__ import annotations

import importlib
import platform
from types import ModuleType
from typing import Any

import numpy as np

from ._np_dtypes import DTypeLike, _dtype_name
from .activation import MoEActivation, _as_activation
from .config import FusedMoEConfig, FusedMoEParallelConfig, FusedMoEQuantConfig, RoutingMethodType
from .modular_kernel import FusedMoEActivationFormat
from .quant_utils import (
    QuantKey,
    kInt4W4A8StaticChannelSym,
    kInt4W4A8StaticGroup32Sym,
    kInt4W4A8StaticGroup64Sym,
    kInt4W4A8StaticGroup128Sym,
    kInt4W4A8StaticGroupSym,
)

_SUPPORTED_W_A: tuple[tuple[QuantKey, QuantKey | None], ...] = (
    (kInt4W4A8StaticChannelSym, None),
    (kInt4W4A8StaticGroup128Sym, None),
    (kInt4W4A8StaticGroup64Sym, None),
    (kInt4W4A8StaticGroup32Sym, None),
    (kInt4W4A8StaticGroupSym, None),
)

_SUPPORTED_ROUTING = (
    RoutingMethodType.Default,
    RoutingMethodType.Renormalize,
    RoutingMethodType.RenormalizeNaive,
)

_RENORMALIZING_ROUTING = (RoutingMethodType.Renormalize, RoutingMethodType.RenormalizeNaive)

_SUPPORTED_ACTIVATIONS = (MoEActivation.SILU, MoEActivation.SWIGLUOAI, MoEActivation.SWIGLUSTEP)


def _core() -> ModuleType:
    """The ``moe_cpu`` package, imported when first needed (keeps import order free)."""
    return importlib.import_module("..", __package__)  # the parent of moe_cpu.vllm_compat


def _not_supported(what: str) -> tuple[bool, str]:
    return False, f"kernel does not support {what}"


def _is_float32_or_bf16(dtype: np.dtype | str | None) -> bool:
    return _dtype_name(dtype) in ("float32", "bfloat16")


class CPUExpertsInt4:
    """INT4-weight, INT8-activation (W4A8) monolithic MoE experts on the CPU.

    The drop-in counterpart of vLLM's ``CPUExpertsInt4``: :meth:`apply` takes
    router logits, routes with :func:`moe_cpu.select_experts` and computes the
    experts with :func:`moe_cpu.fused_experts` on ``int4_w4a8``
    :class:`moe_cpu.PackedExperts`, quantizing the activations per row inside
    the kernel. Unlike vLLM's class it runs on x86-64 and AArch64 alike,
    supports expert parallelism through ``expert_map``, passes expert biases
    from the quant config, and computes ``swiglustep`` and gpt-oss
    ``swigluoai`` exactly as DESIGN.md section 5 defines them.

    Args:
        moe_config: the layer's :class:`FusedMoEConfig`.
        quant_config: the layer's :class:`FusedMoEQuantConfig` (see
            :func:`make_w4a8_int8_moe_quant_config`).
    """

    def __init__(self, moe_config: FusedMoEConfig, quant_config: FusedMoEQuantConfig) -> None:
        if not isinstance(moe_config, FusedMoEConfig):
            raise TypeError(f"moe_config must be a FusedMoEConfig, got {type(moe_config).__name__}")
        if not isinstance(quant_config, FusedMoEQuantConfig):
            raise TypeError(
                f"quant_config must be a FusedMoEQuantConfig, got {type(quant_config).__name__}"
            )
        self.moe_config = moe_config
        self.quant_config = quant_config

    # -- properties of the class -------------------------------------------

    @property
    def expects_unquantized_inputs(self) -> bool:
        """True: the kernel quantizes the float inputs itself (dynamic per-row int8)."""
        return True

    @staticmethod
    def activation_format() -> FusedMoEActivationFormat:
        """The input layout :meth:`apply` takes: ``Standard`` (``[num_tokens, hidden_dim]``)."""
        return FusedMoEActivationFormat.Standard

    @staticmethod
    def is_monolithic() -> bool:
        """True: :meth:`apply` takes router logits and does the routing itself."""
        return True

    def supports_expert_map(self) -> bool:
        """True: ``expert_map`` (global id -> local id or -1) is honoured (vLLM's class returns False)."""
        return True

    @staticmethod
    def supports_lora() -> bool:
        """False: LoRA adapters on the experts are not supported."""
        return False

    # -- capability checks ----------------------------------------------------

    @staticmethod
    def _supports_current_device() -> bool:
        """True on any CPU.

        The kernel is chosen at pack time from the CPU's features (AVX-512,
        AVX2, NEON, ...), with a portable reference kernel as the fallback, so
        every machine that imports moe_cpu can run it; x86-64 and AArch64 are
        the tested targets. vLLM's class accepts only Arm CPUs.
        """
        return True

    @staticmethod
    def _supports_no_act_and_mul() -> bool:
        """False: a gated activation (gate and up halves) is required."""
        return False

    @staticmethod
    def _supports_activation(activation: MoEActivation) -> bool:
        """True for SILU, SWIGLUOAI and SWIGLUSTEP (the set vLLM's class accepts)."""
        return activation in _SUPPORTED_ACTIVATIONS

    @staticmethod
    def _supports_parallel_config(moe_parallel_config: FusedMoEParallelConfig) -> bool:
        """True for every consistent parallel layout, expert parallelism included.

        Expert parallelism works through ``expert_map`` (vLLM's class requires
        ``ep_size == 1``). Tensor, data and sequence parallelism need nothing
        from the kernel: each worker computes its own shard and the caller
        combines the results. Rejected: sizes below 1, ranks outside
        ``[0, size)``, ``ep_size > 1`` without ``use_ep``, and EPLB.
        """
        cfg = moe_parallel_config
        pairs = (
            (cfg.tp_size, cfg.tp_rank),
            (cfg.pcp_size, cfg.pcp_rank),
            (cfg.dp_size, cfg.dp_rank),
            (cfg.ep_size, cfg.ep_rank),
        )
        if cfg.sp_size < 1 or any(size < 1 or not 0 <= rank < size for size, rank in pairs):
            return False
        if cfg.ep_size > 1 and not cfg.use_ep:
            return False
        return not cfg.enable_eplb

    @staticmethod
    def _supports_quant_scheme(weight_key: QuantKey | None, activation_key: QuantKey | None) -> bool:
        """True for INT4 W4A8 weights with unquantized inputs.

        Accepted ``(weight_key, activation_key)`` pairs: the group keys
        ``kInt4W4A8StaticGroup{32,64,128}Sym``, the generic
        ``kInt4W4A8StaticGroupSym`` and the per-channel
        ``kInt4W4A8StaticChannelSym``, each with ``activation_key=None``.
        """
        return (weight_key, activation_key) in _SUPPORTED_W_A

    @staticmethod
    def _supports_routing_method(
        routing_method: RoutingMethodType,
        weight_key: QuantKey | None,
        activation_key: QuantKey | None,
    ) -> bool:
        """True for Default, Renormalize and RenormalizeNaive (softmax routing)."""
        return routing_method in _SUPPORTED_ROUTING

    @staticmethod
    def _supports_router_logits_dtype(
        router_logits_dtype: DTypeLike | None,
        routing_method: RoutingMethodType,
    ) -> bool:
        """True: any float dtype is accepted; logits are routed in float32."""
        return True

    @staticmethod
    def _supports_shape(hidden_dim: int) -> bool:
        """True: any hidden size (group divisibility is checked in :meth:`is_supported_config`)."""
        return True

    @staticmethod
    def _supports_batch_invariance() -> bool:
        """True: each row is quantized and reduced on its own, in a fixed order.

        A token's output does not depend on the other tokens of the batch
        (nor on the thread count), which the tests check bit for bit.
        """
        return True

    @staticmethod
    def is_supported_config(
        cls: type[CPUExpertsInt4],
        moe_config: FusedMoEConfig,
        weight_key: QuantKey | None,
        activation_key: QuantKey | None,
        activation_format: FusedMoEActivationFormat,
    ) -> tuple[bool, str | None]:
        """Say whether ``cls`` can run a layer, and why not when it cannot.

        Called as in vLLM's kernel oracle,
        ``cls.is_supported_config(cls, moe_config, weight_key, activation_key, activation_format)``.
        The checks run in vLLM's order (device, act-and-mul, activation,
        quantization scheme, parallel config, routing method, router logits
        dtype, shape, activation format, LoRA), after a check of the
        input dtype and followed by one that the group size divides both
        GEMM reduction dimensions.

        Returns:
            ``(True, None)``, or ``(False, reason)`` where reason starts with
            ``"kernel does not support"``.
        """
        if not _is_float32_or_bf16(moe_config.in_dtype):
            return _not_supported(f"{_dtype_name(moe_config.in_dtype)} input/output dtype")
        if not cls._supports_current_device():
            return _not_supported(f"current device {platform.machine() or 'unknown'}")
        if not (moe_config.is_act_and_mul or cls._supports_no_act_and_mul()):
            return _not_supported("no act_and_mul MLP layer")
        if not cls._supports_activation(moe_config.activation):
            return _not_supported(f"{moe_config.activation} activation")
        if not cls._supports_quant_scheme(weight_key, activation_key):
            return _not_supported(f"quantization scheme {weight_key}x{activation_key}")
        if not cls._supports_parallel_config(moe_config.moe_parallel_config):
            return _not_supported(f"parallel config {moe_config.moe_parallel_config}")
        if not cls._supports_routing_method(moe_config.routing_method, weight_key, activation_key):
            return _not_supported(f"routing method {moe_config.routing_method!r}")
        if not cls._supports_router_logits_dtype(moe_config.router_logits_dtype, moe_config.routing_method):
            return _not_supported(f"router logits dtype {_dtype_name(moe_config.router_logits_dtype)}")
        if not cls._supports_shape(moe_config.hidden_dim):
            return _not_supported(f"hidden dim {moe_config.hidden_dim}")
        if activation_format != cls.activation_format():
            fmt = getattr(activation_format, "value", activation_format)
            return _not_supported(f"{fmt} activation format")
        if moe_config.is_lora_enabled and not cls.supports_lora():
            return _not_supported("LoRA")
        if weight_key is not None and weight_key.scale.group_shape.is_per_group():
            group_size = weight_key.scale.group_shape.col
            for name, dim in (
                ("hidden_dim", moe_config.hidden_dim),
                ("intermediate_size_per_partition", moe_config.intermediate_size_per_partition),
            ):
                if dim % group_size != 0:
                    return _not_supported(
                        f"{name}={dim} with group size {group_size} (it must be a multiple of the group size)"
                    )
        return True, None

    # -- computation ------------------------------------------------------------

    @staticmethod
    def _activation_kind(activation: MoEActivation) -> int:
        """The ``activation_kind`` integer of vLLM's ``dynamic_4bit_int_moe`` kernel.

        SWIGLUSTEP -> 0, SWIGLUOAI -> 1, SILU -> 2, as vLLM maps them. This is
        only what :func:`moe_cpu.dynamic_4bit_int_moe` takes; :meth:`apply`
        does not use it (it computes the activation by name, see the class
        docstring).

        Raises:
            ValueError: any other activation.
        """
        if activation == MoEActivation.SWIGLUSTEP:
            return 0
        if activation == MoEActivation.SWIGLUOAI:
            return 1
        if activation == MoEActivation.SILU:
            return 2
        name = activation.name if isinstance(activation, MoEActivation) else repr(activation)
        raise ValueError(
            f"activation {name} has no dynamic_4bit_int_moe activation_kind "
            "(only SWIGLUSTEP -> 0, SWIGLUOAI -> 1, SILU -> 2)"
        )

    def _expected_group_size(self) -> int:
        """Group size the quant config asks for: ``block_shape[1]``, or -1 for per channel."""
        return self.quant_config.group_size

    def _check_apply_inputs(
        self,
        hidden_states: np.ndarray,
        w1: Any,
        w2: Any,
        router_logits: np.ndarray,
        global_num_experts: int,
        expert_map: np.ndarray | None,
        e_score_correction_bias: np.ndarray | None,
    ) -> None:
        """Validate the arguments of :meth:`apply` and raise errors that name the argument."""
        cfg = self.moe_config
        if not isinstance(hidden_states, np.ndarray):
            raise TypeError(f"hidden_states must be a numpy.ndarray, got {type(hidden_states).__name__}")
        if hidden_states.ndim != 2:
            raise ValueError(
                f"hidden_states must be 2-D [num_tokens, hidden_dim], got shape {hidden_states.shape}"
            )
        num_tokens, hidden = hidden_states.shape
        if hidden != cfg.hidden_dim:
            raise ValueError(
                f"hidden_states has {hidden} columns but moe_config.hidden_dim is {cfg.hidden_dim}"
            )
        if not isinstance(router_logits, np.ndarray):
            raise TypeError(f"router_logits must be a numpy.ndarray, got {type(router_logits).__name__}")
        if isinstance(global_num_experts, bool) or not isinstance(global_num_experts, (int, np.integer)):
            raise TypeError(f"global_num_experts must be an int, got {type(global_num_experts).__name__}")
        if global_num_experts < 1:
            raise ValueError(f"global_num_experts must be >= 1, got {global_num_experts}")
        if router_logits.shape != (num_tokens, global_num_experts):
            raise ValueError(
                f"router_logits has shape {router_logits.shape}, expected "
                f"({num_tokens}, {global_num_experts}) = (hidden_states rows, global_num_experts)"
            )
        if not np.issubdtype(router_logits.dtype, np.floating) and router_logits.dtype.name != "bfloat16":
            raise TypeError(f"router_logits must hold floats, got dtype {router_logits.dtype}")

        inter = cfg.intermediate_size_per_partition
        group = self._expected_group_size()
        for name, w, (n, k) in (("w1", w1, (2 * inter, cfg.hidden_dim)), ("w2", w2, (cfg.hidden_dim, inter))):
            scheme = getattr(w, "scheme", None)
            if scheme is None or not hasattr(w, "num_experts"):
                raise TypeError(
                    f"{name} must be a moe_cpu.PackedExperts (int4_w4a8), got {type(w).__name__}; "
                    "pack weights with moe_cpu.quantize_experts(w, 'int4_w4a8') or moe_cpu.pack_int4"
                )
            if scheme == "int4_w4a16":   # vLLM's CPU int4 MoE is W4A8 only: no silent change of activations
                raise ValueError(f"{name} is packed as 'int4_w4a16'; CPUExpertsInt4 is vLLM's W4A8 (int8 "
                                 "activations per token) and needs 'int4_w4a8': pack with scheme='int4_w4a8', or "
                                 "run W4A16 weights with moe_cpu.fused_experts")
            if scheme != "int4_w4a8":
                raise ValueError(f"{name} is packed as {scheme!r}; CPUExpertsInt4 needs 'int4_w4a8'")
            if (w.out_features, w.in_features) != (n, k):
                raise ValueError(
                    f"{name} has [N, K] = [{w.out_features}, {w.in_features}] per expert, expected "
                    f"[{n}, {k}] from moe_config (hidden_dim={cfg.hidden_dim}, "
                    f"intermediate_size_per_partition={inter})"
                )
            if w.group_size != group:
                raise ValueError(
                    f"{name} was packed with group_size={w.group_size} but quant_config asks for "
                    f"{group} (block_shape={self.quant_config.block_shape}, "
                    f"per_act_token_quant={self.quant_config.per_act_token_quant})"
                )
        if w1.num_experts != w2.num_experts:
            raise ValueError(f"w1 holds {w1.num_experts} experts but w2 holds {w2.num_experts}")

        if expert_map is None:
            if w1.num_experts != global_num_experts:
                raise ValueError(
                    f"w1 holds {w1.num_experts} experts but global_num_experts is {global_num_experts}; "
                    "pass an expert_map when the weights hold only this worker's experts"
                )
        else:
            if not isinstance(expert_map, np.ndarray):
                raise TypeError(
                    f"expert_map must be a numpy.ndarray or None, got {type(expert_map).__name__}"
                )
            if expert_map.shape != (global_num_experts,):
                raise ValueError(
                    f"expert_map has shape {expert_map.shape}, "
                    f"expected ({global_num_experts},) = (global_num_experts,)"
                )
            if not np.issubdtype(expert_map.dtype, np.integer):
                raise TypeError(f"expert_map must hold integers, got dtype {expert_map.dtype}")
        if e_score_correction_bias is not None:
            if not isinstance(e_score_correction_bias, np.ndarray):
                raise TypeError(
                    "e_score_correction_bias must be a numpy.ndarray or None, "
                    f"got {type(e_score_correction_bias).__name__}"
                )
            if e_score_correction_bias.shape != (global_num_experts,):
                raise ValueError(
                    f"e_score_correction_bias has shape {e_score_correction_bias.shape}, "
                    f"expected ({global_num_experts},) = (global_num_experts,)"
                )

    def apply(
        self,
        hidden_states: np.ndarray,
        w1: Any,
        w2: Any,
        router_logits: np.ndarray,
        activation: MoEActivation,
        global_num_experts: int,
        expert_map: np.ndarray | None,
        a1q_scale: np.ndarray | None,
        apply_router_weight_on_input: bool,
        num_expert_group: int | None = None,
        e_score_correction_bias: np.ndarray | None = None,
        routed_scaling_factor: float | None = None,
        topk_group: int | None = None,
    ) -> np.ndarray:
        """Route the tokens and run the INT4 W4A8 experts (the monolithic forward pass).

        Routing follows vLLM's class: softmax scoring, renormalization when
        ``moe_config.routing_method`` is Renormalize or RenormalizeNaive,
        grouped top-k when ``num_expert_group`` is given, top-k
        ``moe_config.experts_per_token``. The experts are then computed by
        :func:`moe_cpu.fused_experts` with the activation DESIGN.md section 5
        defines for its name (SILU -> ``silu``, SWIGLUSTEP -> ``swiglustep``,
        SWIGLUOAI -> gpt-oss ``swigluoai`` with gate and up interleaved).

        Args:
            hidden_states: float32 or bfloat16 ``[M, hidden_dim]``.
            w1: ``int4_w4a8`` PackedExperts ``[E_local, 2*I, hidden_dim]``
                (gate rows then up rows; interleaved for SWIGLUOAI).
            w2: ``int4_w4a8`` PackedExperts ``[E_local, hidden_dim, I]``.
            router_logits: ``[M, global_num_experts]`` of any float dtype; converted
                to C-contiguous float32 for routing (exact for bf16 and fp16).
            activation: SILU, SWIGLUOAI or SWIGLUSTEP (member or string value).
            global_num_experts: number of experts across all workers.
            expert_map: None, or integers ``[global_num_experts]`` (converted to
                int32) mapping a global expert id to this worker's local id, or
                -1 for experts held elsewhere (they contribute nothing here).
            a1q_scale: must be None; inputs are quantized dynamically per row.
            apply_router_weight_on_input: scale each input row by its router
                weight before the experts instead of scaling the outputs.
            num_expert_group: number of expert groups for grouped top-k.
            e_score_correction_bias: float ``[global_num_experts]`` bias added to
                the scores for selection only (converted to float32).
            routed_scaling_factor: multiplies the routing weights (None -> 1.0).
            topk_group: number of groups kept by grouped top-k.

        Returns:
            ``[M, hidden_dim]`` of the dtype of ``hidden_states``.

        Raises:
            TypeError, ValueError: an argument has the wrong type, shape or
                value; the message names it.
        """
        core = _core()
        act = _as_activation(activation, "activation")
        if not self._supports_activation(act):
            raise ValueError(
                f"activation={act.name} is not supported by CPUExpertsInt4 "
                "(supported: SILU, SWIGLUOAI, SWIGLUSTEP)"
            )
        routing = self.moe_config.routing_method
        if not self._supports_routing_method(routing, self.quant_config.weight_key, None):
            raise ValueError(
                f"moe_config.routing_method={routing.name} is not supported by CPUExpertsInt4 "
                "(supported: Default, Renormalize, RenormalizeNaive)"
            )
        if topk_group is not None and num_expert_group is None:
            raise ValueError(
                f"topk_group={topk_group} is given but num_expert_group is None; "
                "grouped top-k needs both"
            )
        if a1q_scale is not None:
            raise ValueError(
                "a1q_scale must be None: CPUExpertsInt4 quantizes the inputs itself, per row, at run time"
            )
        self._check_apply_inputs(
            hidden_states, w1, w2, router_logits, global_num_experts, expert_map, e_score_correction_bias
        )

        logits = np.ascontiguousarray(router_logits, dtype=np.float32)
        bias = (
            None
            if e_score_correction_bias is None
            else np.ascontiguousarray(e_score_correction_bias, dtype=np.float32)
        )
        local_map = None if expert_map is None else np.ascontiguousarray(expert_map, dtype=np.int32)

        topk_weights, topk_ids = core.select_experts(
            logits,
            self.moe_config.experts_per_token,
            renormalize=routing in _RENORMALIZING_ROUTING,
            scoring_func="softmax",
            use_grouped_topk=num_expert_group is not None,
            num_expert_group=num_expert_group,
            topk_group=topk_group,
            e_score_correction_bias=bias,
            routed_scaling_factor=1.0 if routed_scaling_factor is None else float(routed_scaling_factor),
        )
        return core.fused_experts(
            hidden_states,
            w1,
            w2,
            topk_weights,
            topk_ids,
            activation=act.moe_cpu_name,
            apply_router_weight_on_input=bool(apply_router_weight_on_input),
            w13_bias=self.quant_config.w1_bias,
            w2_bias=self.quant_config.w2_bias,
            expert_map=local_map,
        )
