"""RoutingMethodType and the MoE configs; vLLM: ``vllm/model_executor/layers/fused_moe/config.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from ._np_dtypes import DTypeLike, _canonical_dtype
from .activation import MoEActivation, _as_activation
from .quant_utils import QuantKey, _int4_w4a8_group_key, kInt4W4A8StaticChannelSym


class RoutingMethodType(IntEnum):
    """How router logits become top-k weights (vLLM's member names and integer values).

    The values follow vLLM's ``fused_moe/config.py``, which keeps them in step
    with FlashInfer's TRT-LLM MoE runner (0-9) and adds values from 100 on for
    methods that are never passed to FlashInfer.
    """

    Default = 0
    """Softmax over all experts, then top-k (no renormalization)."""
    Renormalize = 1
    """Top-k of the logits, then softmax over the k selected."""
    DeepSeekV3 = 2
    """Sigmoid, correction bias, grouped top-k (DeepSeek-V3)."""
    Llama4 = 3
    """Top-1, then sigmoid (Llama 4)."""
    RenormalizeNaive = 4
    """Softmax, top-k, then divide by the sum of the k weights."""
    TopK = 5
    """Top-k only, no softmax."""
    SigmoidRenorm = 6
    """Sigmoid, top-k, renormalize by the sum of the k weights."""
    MiniMax2 = 7
    """Sigmoid plus bias, top-k, scaled sum normalization (MiniMax)."""
    Sigmoid = 8
    """Sigmoid, then top-k, no renormalization."""
    Unspecified = 9
    """No named method."""
    DeepseekV4 = 100
    """sqrt-softplus scores with bias and renormalization (DeepSeek-V4)."""
    Custom = 101
    """A model-specific routing function."""
    Simulated = 102
    """Synthetic routing, for testing and benchmarks."""


@dataclass
class FusedMoEParallelConfig:
    """How the MoE layer is split across workers (vLLM's field names).

    moe_cpu itself does no communication: a caller that shards the layer
    passes each worker its own weights (and an ``expert_map`` under expert
    parallelism) and combines the partial outputs itself.

    Attributes:
        tp_size, tp_rank: tensor parallelism (intermediate dim split).
        pcp_size, pcp_rank: prefill context parallelism.
        dp_size, dp_rank: data parallelism.
        ep_size, ep_rank: expert parallelism (experts split).
        sp_size: sequence parallelism.
        use_ep: whether experts are split (``ep_size > 1`` implies it).
        all2all_backend: name of the token dispatch backend (informational).
        enable_eplb: expert-parallel load balancing (not supported by moe_cpu).
    """

    tp_size: int = 1
    pcp_size: int = 1
    dp_size: int = 1
    ep_size: int = 1
    tp_rank: int = 0
    pcp_rank: int = 0
    dp_rank: int = 0
    ep_rank: int = 0
    sp_size: int = 1
    use_ep: bool = False
    all2all_backend: str = "allgather_reducescatter"
    enable_eplb: bool = False

    @property
    def is_sequence_parallel(self) -> bool:
        """True when ``sp_size > 1``."""
        return self.sp_size > 1

    @classmethod
    def make_no_parallel(cls) -> FusedMoEParallelConfig:
        """A single-worker configuration: every size 1, every rank 0, no EP."""
        return cls()


@dataclass
class FusedMoEConfig:
    """Shape and behaviour of one MoE layer (vLLM's field names, the subset moe_cpu uses).

    Attributes:
        num_experts: global number of experts (the width of the router logits).
        experts_per_token: top-k.
        hidden_dim: H, the model dimension.
        intermediate_size: I of the whole layer; each tensor-parallel worker
            holds ``intermediate_size_per_partition = intermediate_size // tp_size``.
        num_local_experts: experts held by this worker; defaults to
            ``num_experts // ep_size``.
        activation: the activation between the GEMMs (a member or its string).
        routing_method: how logits become weights (a member or its int value).
        moe_parallel_config: the parallel layout; defaults to no parallelism.
        in_dtype: dtype of the hidden states and of the output
            (``np.float32`` or ``"bfloat16"`` for moe_cpu).
        router_logits_dtype: dtype of the router logits; defaults to ``in_dtype``.
        has_bias: whether the experts carry biases (passed through
            :class:`FusedMoEQuantConfig` ``w1_bias``/``w2_bias``).
        is_lora_enabled: LoRA on the experts (not supported by moe_cpu).
        device: always ``"cpu"``.
        intermediate_size_per_partition: derived, see ``intermediate_size``.

    Raises:
        ValueError: from ``__post_init__`` when sizes are inconsistent.
    """

    num_experts: int
    experts_per_token: int
    hidden_dim: int
    intermediate_size: int
    num_local_experts: int | None = None
    activation: MoEActivation = MoEActivation.SILU
    routing_method: RoutingMethodType = RoutingMethodType.Default
    moe_parallel_config: FusedMoEParallelConfig = field(default_factory=FusedMoEParallelConfig)
    in_dtype: DTypeLike = np.float32
    router_logits_dtype: DTypeLike | None = None
    has_bias: bool = False
    is_lora_enabled: bool = False
    device: str = "cpu"
    intermediate_size_per_partition: int = field(default=-1)

    def __post_init__(self) -> None:
        for name in ("num_experts", "experts_per_token", "hidden_dim", "intermediate_size"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
            setattr(self, name, int(value))
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"experts_per_token={self.experts_per_token} exceeds num_experts={self.num_experts}"
            )
        self.activation = _as_activation(self.activation, "activation")
        try:
            self.routing_method = RoutingMethodType(self.routing_method)
        except ValueError:
            raise ValueError(f"routing_method={self.routing_method!r} is not a RoutingMethodType") from None
        parallel = self.moe_parallel_config
        if not isinstance(parallel, FusedMoEParallelConfig):
            raise TypeError(
                f"moe_parallel_config must be a FusedMoEParallelConfig, got {type(parallel).__name__}"
            )
        if parallel.tp_size < 1 or self.intermediate_size % parallel.tp_size != 0:
            raise ValueError(
                f"intermediate_size={self.intermediate_size} must be divisible by "
                f"moe_parallel_config.tp_size={parallel.tp_size}"
            )
        per_partition = self.intermediate_size // parallel.tp_size
        if self.intermediate_size_per_partition not in (-1, per_partition):
            raise ValueError(
                f"intermediate_size_per_partition={self.intermediate_size_per_partition} does not equal "
                f"intermediate_size // tp_size = {per_partition}; leave it unset"
            )
        self.intermediate_size_per_partition = per_partition
        if self.num_local_experts is None:
            if parallel.ep_size < 1 or self.num_experts % parallel.ep_size != 0:
                raise ValueError(
                    f"num_experts={self.num_experts} is not divisible by ep_size={parallel.ep_size}; "
                    "pass num_local_experts explicitly"
                )
            self.num_local_experts = self.num_experts // parallel.ep_size
        self.in_dtype = _canonical_dtype(self.in_dtype)
        self.router_logits_dtype = (
            self.in_dtype if self.router_logits_dtype is None else _canonical_dtype(self.router_logits_dtype)
        )

    @property
    def is_act_and_mul(self) -> bool:
        """True for gated activations (GEMM1 produces gate and up, ``2*I`` rows)."""
        return self.activation.is_gated

    @property
    def tp_size(self) -> int:
        """Tensor-parallel size of ``moe_parallel_config``."""
        return self.moe_parallel_config.tp_size

    @property
    def dp_size(self) -> int:
        """Data-parallel size of ``moe_parallel_config``."""
        return self.moe_parallel_config.dp_size

    @property
    def ep_size(self) -> int:
        """Expert-parallel size of ``moe_parallel_config``."""
        return self.moe_parallel_config.ep_size

    @property
    def tp_rank(self) -> int:
        """Tensor-parallel rank of ``moe_parallel_config``."""
        return self.moe_parallel_config.tp_rank

    @property
    def dp_rank(self) -> int:
        """Data-parallel rank of ``moe_parallel_config``."""
        return self.moe_parallel_config.dp_rank

    @property
    def ep_rank(self) -> int:
        """Expert-parallel rank of ``moe_parallel_config``."""
        return self.moe_parallel_config.ep_rank

    @property
    def use_ep(self) -> bool:
        """Whether experts are split across workers."""
        return self.moe_parallel_config.use_ep


@dataclass
class FusedMoEQuantConfig:
    """Quantization of one MoE layer, in the terms vLLM's experts classes read.

    vLLM keeps four quantization descriptors (``_a1``, ``_a2``, ``_w1``,
    ``_w2``); this class keeps the facts derived from them that an INT4 W4A8
    backend reads, under the same property names.

    Attributes:
        weight_key: the :class:`QuantKey` of the expert weights, or None.
        activation_key: the :class:`QuantKey` of the inputs; None means the
            inputs arrive unquantized (W4A8 quantizes them inside the kernel).
        block_shape: ``[row, col]`` of a weight quantization block:
            ``[1, g]`` group-wise, ``[-1, 1]`` per channel, None for per channel too.
        per_act_token_quant: activations quantized per token.
        per_out_ch_quant: weights quantized per output channel.
        w1_bias: optional float32 ``[E, 2*I]`` bias of GEMM1.
        w2_bias: optional float32 ``[E, H]`` bias of GEMM2.

    Raises:
        ValueError: ``per_act_token_quant`` together with a ``block_shape``
            (as in vLLM), or a malformed ``block_shape``.
    """

    weight_key: QuantKey | None = None
    activation_key: QuantKey | None = None
    block_shape: list[int] | None = None
    per_act_token_quant: bool = False
    per_out_ch_quant: bool = False
    w1_bias: np.ndarray | None = field(default=None, compare=False)
    w2_bias: np.ndarray | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.block_shape is not None:
            try:
                row, col = (int(v) for v in self.block_shape)
            except (TypeError, ValueError):
                raise ValueError(
                    f"block_shape must be a [row, col] pair of ints, got {self.block_shape!r}"
                ) from None
            self.block_shape = [row, col]
        if self.per_act_token_quant and self.block_shape is not None:
            raise ValueError("per_act_token_quant cannot be combined with a block_shape")
        for name in ("weight_key", "activation_key"):
            key = getattr(self, name)
            if key is not None and not isinstance(key, QuantKey):
                raise TypeError(f"{name} must be a QuantKey or None, got {type(key).__name__}")

    @property
    def is_per_act_token(self) -> bool:
        """True when activations are quantized per token (``per_act_token_quant``)."""
        return self.per_act_token_quant

    @property
    def is_block_quantized(self) -> bool:
        """True when a ``block_shape`` is set."""
        return self.block_shape is not None

    @property
    def quant_dtype(self) -> np.dtype | str | None:
        """dtype of the quantized inputs, None when inputs are unquantized."""
        return None if self.activation_key is None else self.activation_key.dtype

    @property
    def weight_quant_dtype(self) -> np.dtype | str | None:
        """dtype of the quantized weights, None when unknown."""
        return None if self.weight_key is None else self.weight_key.dtype

    @property
    def is_quantized(self) -> bool:
        """True when the inputs are quantized before the experts (never for W4A8)."""
        return self.quant_dtype is not None

    @property
    def group_size(self) -> int:
        """The INT4 group size these settings describe: ``block_shape[1]``, or -1 per channel.

        Per channel (-1) when ``per_act_token_quant`` is set, when
        ``block_shape`` is None or when it is ``[-1, 1]``.
        """
        if self.per_act_token_quant or self.block_shape is None or self.block_shape == [-1, 1]:
            return -1
        return self.block_shape[1]


def make_w4a8_int8_moe_quant_config(
    block_shape: tuple[int, int] | list[int] | None = None,
    w1_bias: np.ndarray | None = None,
    w2_bias: np.ndarray | None = None,
) -> FusedMoEQuantConfig:
    """Build the :class:`FusedMoEQuantConfig` of an INT4 W4A8 layer.

    Args:
        block_shape: ``(1, g)`` for group-wise weights, ``(-1, 1)`` or None
            for per-channel weights (vLLM's convention).
        w1_bias: optional float32 ``[E, 2*I]`` bias of GEMM1.
        w2_bias: optional float32 ``[E, H]`` bias of GEMM2.

    Returns:
        A config whose ``weight_key`` is the key a compressed-tensors W4A8
        checkpoint of that layout produces (bfloat16 scales per group, float32
        per channel) and whose ``activation_key`` is None (inputs are quantized
        dynamically inside the kernel).
    """
    if block_shape is None or list(block_shape) == [-1, 1]:
        weight_key = kInt4W4A8StaticChannelSym
        shape: list[int] | None = [-1, 1]
    else:
        row, col = (int(v) for v in block_shape)
        weight_key = _int4_w4a8_group_key(col)
        shape = [row, col]
    return FusedMoEQuantConfig(
        weight_key=weight_key,
        activation_key=None,
        block_shape=shape,
        w1_bias=w1_bias,
        w2_bias=w2_bias,
    )
