// fused_moe.h — the fused MoE forward pass and the shared expert (DESIGN.md section 5).
#pragma once
#include <cstdint>
#include <vector>

#include "moe_cpu/packed_experts.h"
#include "moe_cpu/threads.h"
#include "moe_cpu/types.h"

namespace moe_cpu {

struct FusedMoeArgs {
  const void* x = nullptr;          // [M,H] float32 or bf16 bits
  DType dtype = DType::kF32;        // of x and out
  int64_t M = 0, H = 0;
  const PackedExperts* w13 = nullptr;  // [E, 2I, H]
  const PackedExperts* w2 = nullptr;   // [E, H, I]
  const float* topk_weights = nullptr; // [M,k]
  const void* topk_ids = nullptr;      // [M,k] int32 or int64
  bool ids_int64 = false;
  int64_t k = 0;
  Activation activation = Activation::kSilu;
  bool apply_router_weight_on_input = false;
  const float* w13_bias = nullptr;  // [E,2I] or null
  const float* w2_bias = nullptr;   // [E,H] or null
  const int32_t* expert_map = nullptr;  // [num_global_experts] or null
  int64_t num_global_experts = 0;
  void* out = nullptr;              // [M,H] of `dtype`, may alias x
  bool out_f32 = false;             // write fp32 whatever `dtype` is (used by shared_expert)
};

// ValueError unless w13 and w2 may run together: the same scheme, or two int schemes with the same
// activations (A8 with A8, A16 with A16). `what` names the caller in the message.
void check_scheme_pair(const PackedExperts& w13, const PackedExperts& w2, const char* what);

// Validates ids / weights / expert_map values (ValueError) and computes out.
void fused_experts(const FusedMoeArgs& a);
// The checks fused_experts runs before computing (pairs, shapes, ids, non-finite inputs), alone: ValueError.
void check_fused_experts(const FusedMoeArgs& a);
// ValueError naming the first non-finite value of hidden states x [M, H] (float32 or bf16 bits).
void check_finite_hidden_states(const void* x, DType dtype, int64_t M, int64_t H);

// out = fused_out * routed_scaling_factor + silu(x w13_g^T) * (x w13_u^T) w2^T, one rounding.
// w13/w2 have num_experts == 1. fused_out and out are [M,H] of `dtype`; out may alias either input.
void shared_expert(const void* x, DType dtype, int64_t M, int64_t H, const PackedExperts& w13,
                   const PackedExperts& w2, const void* fused_out, double routed_scaling_factor,
                   void* out);

// Rows grouped by expert (SGLang's moe_align_block_size): slots s = m*k + j with id >= 0, in
// ascending expert then ascending slot, each expert's run padded to a multiple of block_size with
// the value M*k. expert_ids[b] is the expert of block b. ids must be in [-1, E).
struct AlignedRows {
  std::vector<int32_t> sorted_ids, expert_ids;
  int64_t num_tokens_post_pad = 0;
};
AlignedRows moe_align_block_size(const int32_t* topk_ids, int64_t numel, int64_t num_experts,
                                 int64_t block_size);

// Bound on fused_experts' per-call scratch in bytes (default 96 MiB). Tokens are processed in equal
// chunks that fit it (at least one token per chunk); larger chunks reuse each expert's weights
// over more rows. With the SIMD kernels results do not depend on it (each token's numbers are computed
// independently); the Eigen reference's float GEMMs may change in the last bits.
void set_scratch_limit(int64_t bytes);
int64_t get_scratch_limit();

}  // namespace moe_cpu
