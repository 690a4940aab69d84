"""FusedMoEActivationFormat; vLLM: ``vllm/model_executor/layers/fused_moe/modular_kernel.py``."""

from __future__ import annotations

from enum import Enum


class FusedMoEActivationFormat(Enum):
    """Layout of the activations handed to the experts.

    ``Standard`` is ``[num_tokens, hidden_dim]``, the only format moe_cpu uses;
    ``BatchedExperts`` (``[num_experts, max_tokens, hidden_dim]``) exists for
    name compatibility.
    """

    Standard = "standard"
    BatchedExperts = "batched_experts"
