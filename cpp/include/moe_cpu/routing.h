// routing.h — select_experts (vLLM semantics, DESIGN.md section 5). Weights float32, ids int32.
#pragma once
#include <cstdint>
#include <string>

namespace moe_cpu {

struct RoutingArgs {
  int64_t top_k = 1;
  bool renormalize = false;
  bool sigmoid = false;            // scoring_func: false = softmax
  bool grouped = false;
  int64_t num_expert_group = 0, topk_group = 0;
  const float* correction_bias = nullptr;  // [E] or null
  double routed_scaling_factor = 1.0;
};

// logits [M,E] float32 -> weights [M,top_k], ids [M,top_k]; columns by descending selection
// score, ties to the lower index. Throws ValueError on bad arguments or non-finite logits.
void select_experts(const float* logits, int64_t M, int64_t E, const RoutingArgs& args,
                    float* weights, int32_t* ids);

}  // namespace moe_cpu
