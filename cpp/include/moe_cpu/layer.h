// layer.h — a whole MoE layer in C++ (router, routed experts, shared expert): what MoELayer.__call__ and
// Stream.submit_layer run, so a layer on a stream computes the same bits as the blocking call.
#pragma once
#include <cstdint>

#include "moe_cpu/fused_moe.h"
#include "moe_cpu/routing.h"

namespace moe_cpu {

// logits[m, e] = sum_k x[m, k] * gate[e, k] (+ bias[e]) in fp32 (x float32 or bf16 bits, widened exactly).
// Every dot product is summed in one fixed order (16 lane sums over k, then a fixed tree), whatever M, the
// thread count or the ISA tier: the router's logits are batch-invariant. gate_bf16 (or null): gate's values as bf16
// bits (gate_as_bf16), read instead of gate: the same bits, half the bytes.
void router_logits(const void* x, DType dtype, int64_t M, int64_t H, const float* gate, int64_t E,
                   const float* bias, float* logits, const uint16_t* gate_bf16 = nullptr);
// out[i] = the bf16 bits of gate[i] for i < n when every gate[i] is a bf16 (its low 16 bits zero, as a router from a
// bf16 checkpoint): true; else false (out then partly written).
bool gate_as_bf16(const float* gate, int64_t n, uint16_t* out);
// g[m] = sigmoid(x[m] . w) (Qwen2-MoE's shared-expert gate): the dot as router_logits, the sigmoid in double.
void shared_gate(const void* x, DType dtype, int64_t M, int64_t H, const float* w, float* g);

struct MoeLayerArgs {
  FusedMoeArgs experts;    // x, dtype, M, H, w13, w2, biases, activation, out (the routing is filled in here)
  const float* gate = nullptr;       // [E, H]
  const uint16_t* gate_bf16 = nullptr;  // [E, H] or null: gate's values as bf16 bits, when each is one (the router reads these)
  const float* gate_bias = nullptr;  // [E] or null
  RoutingArgs routing;
  const PackedExperts* shared_w13 = nullptr;  // [1, 2Is, H] or null
  const PackedExperts* shared_w2 = nullptr;   // [1, H, Is]
  const float* shared_gate = nullptr;         // [H] or null (needs a shared expert)
};

// out = experts(x, select_experts(router_logits(x))) (+ the shared expert, gated per token when shared_gate
// is set). Without a gate the routed output is rounded to x's dtype and the shared expert added with one more
// rounding (shared_expert); with a gate both parts are summed in fp32 and rounded once.
void moe_layer(const MoeLayerArgs& a);
// What moe_layer checks before it computes (x finite: the ValueError of fused_experts), alone.
void check_moe_layer(const MoeLayerArgs& a);

}  // namespace moe_cpu
