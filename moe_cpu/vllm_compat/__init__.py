"""A vLLM-compatible surface for moe_cpu that needs no PyTorch.

This package mirrors the small part of vLLM's fused-MoE interface that a CPU
INT4 W4A8 expert backend touches, so code written against vLLM's
``CPUExpertsInt4`` can run on moe_cpu with NumPy arrays and
:class:`moe_cpu.PackedExperts` weights. Each module sits beside one vLLM
module (paths under ``vllm/model_executor/layers/``):

* ``activation``: :class:`MoEActivation`, :func:`to_moe_cpu_activation`
  (``fused_moe/activation.py``);
* ``modular_kernel``: :class:`FusedMoEActivationFormat`
  (``fused_moe/modular_kernel.py``);
* ``quant_utils``: :class:`GroupShape`, :class:`ScaleDesc`,
  :class:`QuantKey` and the INT4 W4A8 keys (``kInt4W4A8Static*Sym``)
  (``quantization/utils/quant_utils.py``);
* ``config``: :class:`RoutingMethodType`, :class:`FusedMoEParallelConfig`,
  :class:`FusedMoEConfig`, :class:`FusedMoEQuantConfig` and
  :func:`make_w4a8_int8_moe_quant_config` (``fused_moe/config.py``; vLLM's
  field names, only the fields moe_cpu uses);
* ``cpu_int4_moe``: :class:`CPUExpertsInt4`, the monolithic expert class:
  capability checks, routing with :func:`moe_cpu.select_experts` and
  computation with :func:`moe_cpu.fused_experts`
  (``fused_moe/experts/cpu_int4_moe.py``);
* ``_np_dtypes``: NumPy stand-ins for ``torch.dtype`` (no vLLM counterpart).

Enum member names and values are vLLM's. Dtypes are NumPy dtypes.
``"bfloat16"`` (or ``ml_dtypes.bfloat16``) names bfloat16. Where moe_cpu
behaves differently from vLLM, the docstring says so, and
``docs/vllm_compat.md`` lists every difference.

The compute functions are looked up on the ``moe_cpu`` package when they are
called, so importing this package never depends on the native core.
"""

from __future__ import annotations

from ._np_dtypes import DTypeLike  # noqa: F401  (a module-level name before the split)
from .activation import MoEActivation, to_moe_cpu_activation
from .config import (
    FusedMoEConfig,
    FusedMoEParallelConfig,
    FusedMoEQuantConfig,
    RoutingMethodType,
    make_w4a8_int8_moe_quant_config,
)
from .cpu_int4_moe import CPUExpertsInt4
from .modular_kernel import FusedMoEActivationFormat
from .quant_utils import (
    GroupShape,
    QuantKey,
    ScaleDesc,
    kInt4W4A8StaticChannelSym,
    kInt4W4A8StaticGroup32Sym,
    kInt4W4A8StaticGroup64Sym,
    kInt4W4A8StaticGroup128Sym,
    kInt4W4A8StaticGroupSym,
)

__all__ = [
    "MoEActivation",
    "RoutingMethodType",
    "FusedMoEActivationFormat",
    "GroupShape",
    "ScaleDesc",
    "QuantKey",
    "kInt4W4A8StaticGroup32Sym",
    "kInt4W4A8StaticGroup64Sym",
    "kInt4W4A8StaticGroup128Sym",
    "kInt4W4A8StaticGroupSym",
    "kInt4W4A8StaticChannelSym",
    "FusedMoEParallelConfig",
    "FusedMoEConfig",
    "FusedMoEQuantConfig",
    "make_w4a8_int8_moe_quant_config",
    "to_moe_cpu_activation",
    "CPUExpertsInt4",
]
