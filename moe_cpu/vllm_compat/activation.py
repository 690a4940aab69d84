"""MoEActivation; vLLM: ``vllm/model_executor/layers/fused_moe/activation.py``."""

from __future__ import annotations

from enum import Enum


class MoEActivation(Enum):
    """The activation applied between the two expert GEMMs (vLLM's names and values).

    Gated members take the ``[..., 2*I]`` output of GEMM1 (gate and up) and
    return ``[..., I]``; ``*_NO_MUL`` members keep the width. The gated members
    that moe_cpu computes map to its activation strings through
    :attr:`moe_cpu_name` (or :func:`to_moe_cpu_activation`): ``silu``, ``gelu``, ``gelu_tanh``,
    ``swigluoai`` (gpt-oss, gate and up interleaved), ``swigluoai_uninterleave``
    (the same math on the two halves) and ``swiglustep``.
    """

    SILU = "silu"
    GELU = "gelu"
    GELU_TANH = "gelu_tanh"
    RELU2 = "relu2"
    SWIGLUOAI = "swigluoai"
    SITU = "situ"
    SWIGLUOAI_UNINTERLEAVE = "swigluoai_uninterleave"
    SWIGLUSTEP = "swiglustep"

    SILU_NO_MUL = "silu_no_mul"
    GELU_NO_MUL = "gelu_no_mul"
    GELU_TANH_NO_MUL = "gelu_tanh_no_mul"
    RELU2_NO_MUL = "relu2_no_mul"

    @property
    def is_gated(self) -> bool:
        """True when the activation consumes a gate half and an up half (no ``_no_mul`` suffix)."""
        return not self.value.endswith("_no_mul")

    @property
    def moe_cpu_name(self) -> str:
        """moe_cpu's ``activation=`` string for this member (what :func:`moe_cpu.fused_experts` reads).

        Raises:
            ValueError: moe_cpu has no kernel for this activation.
        """
        return to_moe_cpu_activation(self)

    def without_mul(self) -> MoEActivation:
        """The non-gated counterpart (``SILU`` -> ``SILU_NO_MUL``), or ``self`` if there is none."""
        return _WITHOUT_MUL.get(self, self)

    @classmethod
    def from_str(cls, s: str) -> MoEActivation:
        """Parse an activation from its string value (``"gelu_pytorch_tanh"`` is read as ``gelu_tanh``).

        Raises:
            ValueError: the string names no member.
        """
        value = _ACTIVATION_ALIASES.get(s, s)
        for member in cls:
            if member.value == value:
                return member
        valid = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"unknown MoE activation {s!r}; valid activations: {valid}")


_ACTIVATION_ALIASES: dict[str, str] = {"gelu_pytorch_tanh": "gelu_tanh"}

_WITHOUT_MUL: dict[MoEActivation, MoEActivation] = {
    MoEActivation.SILU: MoEActivation.SILU_NO_MUL,
    MoEActivation.GELU: MoEActivation.GELU_NO_MUL,
    MoEActivation.GELU_TANH: MoEActivation.GELU_TANH_NO_MUL,
    MoEActivation.RELU2: MoEActivation.RELU2_NO_MUL,
}

# The vLLM activations that moe_cpu computes, and moe_cpu's name for each.
_MOE_CPU_ACTIVATIONS: dict[MoEActivation, str] = {
    MoEActivation.SILU: "silu",
    MoEActivation.GELU: "gelu",
    MoEActivation.GELU_TANH: "gelu_tanh",
    MoEActivation.SWIGLUOAI: "swigluoai",
    MoEActivation.SWIGLUOAI_UNINTERLEAVE: "swigluoai_uninterleave",
    MoEActivation.SWIGLUSTEP: "swiglustep",
}


def to_moe_cpu_activation(activation: MoEActivation | str) -> str:
    """Return the ``activation=`` string that :func:`moe_cpu.fused_experts` takes for ``activation``.

    Args:
        activation: a :class:`MoEActivation` or its string value.

    Returns:
        One of ``"silu"``, ``"gelu"``, ``"gelu_tanh"``, ``"swigluoai"``,
        ``"swigluoai_uninterleave"``, ``"swiglustep"``. The math of each is
        DESIGN.md section 5.

    Raises:
        ValueError: moe_cpu has no kernel for this activation (``relu2``,
            ``situ`` and the ``*_no_mul`` forms).
    """
    act = _as_activation(activation, "activation")
    try:
        return _MOE_CPU_ACTIVATIONS[act]
    except KeyError:
        supported = ", ".join(m.name for m in _MOE_CPU_ACTIVATIONS)
        raise ValueError(
            f"activation {act.name} ({act.value!r}) has no moe_cpu kernel; "
            f"supported: {supported}"
        ) from None


def _as_activation(activation: MoEActivation | str, arg_name: str) -> MoEActivation:
    """Accept a :class:`MoEActivation` or its string value; raise a clear error otherwise."""
    if isinstance(activation, MoEActivation):
        return activation
    if isinstance(activation, str):
        return MoEActivation.from_str(activation)
    raise TypeError(
        f"{arg_name} must be a MoEActivation or its string value, got {type(activation).__name__}"
    )
