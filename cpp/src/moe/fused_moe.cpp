// fused_moe.cpp — orchestration of the fused MoE pass: route rows by expert, quantize activations,
// GEMM1 (+bias, activation), quantize again, GEMM2 (+bias, router weight), then sum the top-k rows
// of each token in fp32 in the order j = 0..k-1 and round once to the output dtype.
// Each expert's rows are computed by one thread, so the result is independent of the thread count.
#include "moe_cpu/fused_moe.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "common/numeric.h"
#include "common/parallel.h"
#include "dispatch/registry.h"
#include "moe/activations.h"
#include "moe_cpu/errors.h"

namespace moe_cpu {
namespace {

float load(const void* x, DType t, int64_t i) {
  return t == DType::kF32 ? static_cast<const float*>(x)[i] : bf16_to_float(static_cast<const uint16_t*>(x)[i]);
}
void store(void* out, DType t, int64_t i, float v) {
  if (t == DType::kF32) static_cast<float*>(out)[i] = v;
  else static_cast<uint16_t*>(out)[i] = float_to_bf16(v);
}

// Activations of `rows` fp32 rows [rows, K], prepared for the scheme of the next GEMM.
struct PreparedActs {
  std::vector<int8_t> q;
  std::vector<float> s;
  std::vector<uint16_t> b;
  ActRows view;
};
void prepare(Scheme scheme, const float* x, int64_t rows, int64_t K, PreparedActs& p, const char* what,
             int64_t expert) {
  p.view = ActRows{rows, K, nullptr, nullptr, nullptr};
  if (is_int_scheme(scheme)) {
    p.q.resize(size_t(rows * K));
    p.s.resize(size_t(rows));
    for (int64_t r = 0; r < rows; ++r)
      if (!quantize_row_int8(x + r * K, K, p.q.data() + r * K, p.s.data() + r))
        throw ValueError(msg("non-finite ", what, " in expert ", expert,
                             " cannot be quantized to int8 (check the inputs and weights for overflow)"));
    p.view.q = p.q.data();
    p.view.scale = p.s.data();
  } else {
    p.b.resize(size_t(rows * K));
    for (int64_t i = 0; i < rows * K; ++i) p.b[size_t(i)] = float_to_bf16(x[i]);
    p.view.bf16 = p.b.data();
  }
}

int64_t id_at(const FusedMoeArgs& a, int64_t s) {
  return a.ids_int64 ? static_cast<const int64_t*>(a.topk_ids)[s] : static_cast<const int32_t*>(a.topk_ids)[s];
}

// Local expert of each slot (-1 = skipped), after range checks and the expert map.
std::vector<int32_t> local_ids(const FusedMoeArgs& a, int64_t E) {
  const int64_t n = a.M * a.k, Eg = a.expert_map ? a.num_global_experts : E;
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int64_t s = 0; s < n; ++s) {
    const int64_t id = id_at(a, s);
    if (id >= Eg)
      throw ValueError(msg("topk_ids[", s / a.k, ", ", s % a.k, "] = ", id, " is out of range for ", Eg,
                           a.expert_map ? " global experts (the length of expert_map)" : " experts",
                           " (ids must be < num_experts, or < 0 to skip)"));
    out[size_t(s)] = id < 0 ? -1 : int32_t(a.expert_map ? a.expert_map[id] : id);
  }
  return out;
}

void check_args(const FusedMoeArgs& a) {
  const PackedExperts &w13 = *a.w13, &w2 = *a.w2;
  if (w13.scheme != w2.scheme)
    throw ValueError(msg("w13 is packed as ", scheme_name(w13.scheme), " but w2 as ", scheme_name(w2.scheme),
                         "; both must use the same scheme"));
  if (w13.num_experts != w2.num_experts)
    throw ValueError(msg("w13 has ", w13.num_experts, " experts but w2 has ", w2.num_experts));
  if (w13.in_features != a.H)
    throw ValueError(msg("w13 in_features = ", w13.in_features, " does not match hidden_states H = ", a.H));
  if (w2.out_features != a.H)
    throw ValueError(msg("w2 out_features = ", w2.out_features, " does not match hidden_states H = ", a.H));
  if (w13.out_features != 2 * w2.in_features)
    throw ValueError(msg("w13 out_features = ", w13.out_features, " must be 2 * w2 in_features = 2 * ",
                         w2.in_features, " (w13 is [E, 2I, H], w2 is [E, H, I])"));
  if (a.k < 1) throw ValueError(msg("topk_ids has k = ", a.k, " columns; k must be >= 1"));
  const int64_t Eg = a.expert_map ? a.num_global_experts : w13.num_experts;
  if (a.k > Eg) throw ValueError(msg("k = ", a.k, " is larger than the number of experts ", Eg));
  if (a.expert_map)
    for (int64_t i = 0; i < a.num_global_experts; ++i)
      if (a.expert_map[i] < -1 || a.expert_map[i] >= w13.num_experts)
        throw ValueError(msg("expert_map[", i, "] = ", a.expert_map[i], " must be -1 or a local expert id < ",
                             w13.num_experts));
  for (int64_t i = 0; i < a.M * a.k; ++i)
    if (!std::isfinite(a.topk_weights[i]))
      throw ValueError(msg("topk_weights[", i / a.k, ", ", i % a.k, "] = ", a.topk_weights[i], " is not finite"));
  for (int64_t i = 0; i < a.M * a.H; ++i)
    if (!std::isfinite(load(a.x, a.dtype, i)))
      throw ValueError(msg("hidden_states[", i / a.H, ", ", i % a.H, "] is not finite (",
                           load(a.x, a.dtype, i), ")"));
}

}  // namespace

void fused_experts(const FusedMoeArgs& a) {
  check_args(a);
  const PackedExperts &w13 = *a.w13, &w2 = *a.w2;
  const int64_t E = w13.num_experts, H = a.H, I = w2.in_features, M = a.M, k = a.k;
  if (M == 0) return;
  const std::vector<int32_t> ids = local_ids(a, E);
  const AlignedRows rows = moe_align_block_size(ids.data(), M * k, E, 1);
  // Start of each expert's run in rows.sorted_ids (block 1: no padding).
  std::vector<int64_t> begin(static_cast<size_t>(E + 1), 0);
  for (int32_t e : rows.expert_ids) ++begin[size_t(e) + 1];
  for (int64_t e = 0; e < E; ++e) begin[size_t(e + 1)] += begin[size_t(e)];

  std::vector<float> y(static_cast<size_t>(M * k * H), 0.f);  // per-slot expert outputs
  parallel_for(E, [&](int64_t e) {
    const int64_t r0 = begin[size_t(e)], R = begin[size_t(e + 1)] - r0;
    if (R == 0) return;
    const int32_t* slots = rows.sorted_ids.data() + r0;
    std::vector<float> xin(static_cast<size_t>(R * H)), c1(size_t(R * 2 * I)), act(size_t(R * I)), c2(size_t(R * H));
    for (int64_t r = 0; r < R; ++r) {
      const int64_t m = slots[r] / k;
      const float wr = a.apply_router_weight_on_input ? a.topk_weights[slots[r]] : 1.f;
      for (int64_t h = 0; h < H; ++h) xin[size_t(r * H + h)] = load(a.x, a.dtype, m * H + h) * wr;
    }
    PreparedActs p;
    prepare(w13.scheme, xin.data(), R, H, p, "hidden state", e);
    w13.kernel->gemm(w13, e, p.view, c1.data(), 2 * I);
    if (a.w13_bias)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t n = 0; n < 2 * I; ++n) c1[size_t(r * 2 * I + n)] += a.w13_bias[e * 2 * I + n];
    for (int64_t r = 0; r < R; ++r) apply_activation(a.activation, c1.data() + r * 2 * I, I, act.data() + r * I);
    prepare(w2.scheme, act.data(), R, I, p, "activation output", e);
    w2.kernel->gemm(w2, e, p.view, c2.data(), H);
    for (int64_t r = 0; r < R; ++r) {
      const float wr = a.apply_router_weight_on_input ? 1.f : a.topk_weights[slots[r]];
      float* dst = y.data() + int64_t(slots[r]) * H;
      for (int64_t h = 0; h < H; ++h)
        dst[h] = (c2[size_t(r * H + h)] + (a.w2_bias ? a.w2_bias[e * H + h] : 0.f)) * wr;
    }
  });
  parallel_for(M, [&](int64_t m) {
    for (int64_t h = 0; h < H; ++h) {
      float acc = 0.f;
      for (int64_t j = 0; j < k; ++j)
        if (ids[size_t(m * k + j)] >= 0) acc += y[size_t((m * k + j) * H + h)];
      store(a.out, a.dtype, m * H + h, acc);
    }
  });
}

void shared_expert(const void* x, DType dtype, int64_t M, int64_t H, const PackedExperts& w13,
                   const PackedExperts& w2, const void* fused_out, double routed_scaling_factor, void* out) {
  if (w13.num_experts != 1 || w2.num_experts != 1)
    throw ValueError(msg("shared expert weights must have num_experts == 1 (got w13: ", w13.num_experts,
                         ", w2: ", w2.num_experts, ")"));
  if (!std::isfinite(routed_scaling_factor))
    throw ValueError(msg("routed_scaling_factor = ", routed_scaling_factor, " is not finite"));
  if (M == 0) return;
  std::vector<float> shared(static_cast<size_t>(M * H));
  std::vector<int32_t> ids(static_cast<size_t>(M), 0);
  std::vector<float> ones(static_cast<size_t>(M), 1.f);
  FusedMoeArgs a;
  a.x = x, a.dtype = dtype, a.M = M, a.H = H, a.w13 = &w13, a.w2 = &w2;
  a.topk_weights = ones.data(), a.topk_ids = ids.data(), a.k = 1;
  // Computed in fp32 (the output of a k=1 pass is the expert's fp32 row, unrounded).
  FusedMoeArgs f32 = a;
  std::vector<float> xf;
  if (dtype == DType::kBf16) {
    xf.resize(size_t(M * H));
    for (int64_t i = 0; i < M * H; ++i) xf[size_t(i)] = load(x, dtype, i);
    f32.x = xf.data();
  }
  f32.dtype = DType::kF32;
  f32.out = shared.data();
  fused_experts(f32);
  const float scale = float(routed_scaling_factor);
  for (int64_t i = 0; i < M * H; ++i)
    store(out, dtype, i, load(fused_out, dtype, i) * scale + shared[size_t(i)]);
}

}  // namespace moe_cpu
