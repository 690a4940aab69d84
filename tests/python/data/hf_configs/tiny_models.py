"""The tiny random models of five MoE families, as transformers configures them (shared by
make_configs.py and test_hf_models.py)."""

FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral", "deepseek_v3", "gpt_oss")

_BASE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=128, intermediate_size=96, max_position_embeddings=128)
_FAMILY = {
    "qwen3_moe": dict(moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                      head_dim=16),
    "qwen2_moe": dict(moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                      shared_expert_intermediate_size=48),
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2, head_dim=16),
    "deepseek_v3": dict(moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=3, n_group=4,
                        topk_group=2, n_shared_experts=1, first_k_dense_replace=0, routed_scaling_factor=2.5,
                        kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                        v_head_dim=16, head_dim=8),
    "gpt_oss": dict(num_local_experts=8, num_experts_per_tok=2, head_dim=16,
                    layer_types=["full_attention", "sliding_attention"]),
}


def config_kwargs(family):
    return {**_BASE, **_FAMILY[family]}
