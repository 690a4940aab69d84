// layer.cpp — the router GEMM (portable, one summation order everywhere) and the layer's chain of calls.
#include "moe_cpu/layer.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "common/numeric.h"
#include "common/parallel.h"
#include "moe_cpu/errors.h"

namespace moe_cpu {
namespace {

constexpr int64_t kLanes = 16, kRows = 4, kExpertsPerTask = 16;
typedef float v16 __attribute__((vector_size(64)));  // lowered to the baseline ISA's vectors (SSE2, NEON)

// The rows [m0, m0 + n) of x as fp32, zero-padded to Hp (a multiple of kLanes).
void widen_rows(const void* x, DType dt, int64_t H, int64_t Hp, int64_t m0, int64_t n, float* xf) {
  for (int64_t r = 0; r < n; ++r) {
    float* d = xf + r * Hp;
    if (dt == DType::kF32) {
      std::memcpy(d, static_cast<const float*>(x) + (m0 + r) * H, size_t(H) * 4);
    } else {
      const uint16_t* s = static_cast<const uint16_t*>(x) + (m0 + r) * H;
      for (int64_t k = 0; k < H; ++k) d[k] = bf16_to_float(s[k]);
    }
    std::memset(d + H, 0, size_t(Hp - H) * 4);
  }
}

inline float reduce(v16 v) {  // fixed tree: 16 -> 8 -> 4 -> 2 -> 1
  float t[16];
  std::memcpy(t, &v, 64);
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) t[i] += t[i + w];
  return t[0];
}

// dots[r * E + e] for rows r < n of xf (stride Hp) and experts [e0, e1) of gate (rows of H, read in lanes
// of 16: the tail of each gate row is read up to Hp through a zero-padded copy).
template <int n>
void dot_block(const float* xf, int64_t Hp, const float* gate, int64_t H, int64_t e0, int64_t e1,
               int64_t E, float* dots) {
  std::vector<float> tail(size_t(kLanes), 0.f);
  const int64_t Hm = H / kLanes * kLanes;
  for (int64_t e = e0; e < e1; ++e) {
    const float* g = gate + e * H;
    std::memset(tail.data(), 0, kLanes * 4);
    std::memcpy(tail.data(), g + Hm, size_t(H - Hm) * 4);
    v16 acc[n] = {};
    for (int64_t k = 0; k < Hp; k += kLanes) {
      v16 gv;
      std::memcpy(&gv, k < Hm ? g + k : tail.data(), 64);
      for (int r = 0; r < n; ++r) {
        v16 xv;
        std::memcpy(&xv, xf + r * Hp + k, 64);
        acc[r] += xv * gv;
      }
    }
    for (int r = 0; r < n; ++r) dots[r * E + e] = reduce(acc[r]);
  }
}

void dots(const void* x, DType dt, int64_t M, int64_t H, const float* w, int64_t E, float* out) {
  const int64_t Hp = (H + kLanes - 1) / kLanes * kLanes;
  const int64_t row_blocks = (M + kRows - 1) / kRows, e_blocks = (E + kExpertsPerTask - 1) / kExpertsPerTask;
  parallel_for(row_blocks * e_blocks, [&](int64_t t) {
    const int64_t m0 = t / e_blocks * kRows, n = std::min(kRows, M - m0);
    const int64_t e0 = t % e_blocks * kExpertsPerTask, e1 = std::min(E, e0 + kExpertsPerTask);
    std::vector<float> xf(size_t(n * Hp));
    widen_rows(x, dt, H, Hp, m0, n, xf.data());
    float* o = out + m0 * E;
    switch (n) {
      case 1: dot_block<1>(xf.data(), Hp, w, H, e0, e1, E, o); break;
      case 2: dot_block<2>(xf.data(), Hp, w, H, e0, e1, E, o); break;
      case 3: dot_block<3>(xf.data(), Hp, w, H, e0, e1, E, o); break;
      default: dot_block<4>(xf.data(), Hp, w, H, e0, e1, E, o); break;
    }
  });
}

float load_x(const void* x, DType t, int64_t i) {
  return t == DType::kF32 ? static_cast<const float*>(x)[i] : bf16_to_float(static_cast<const uint16_t*>(x)[i]);
}

}  // namespace

void check_moe_layer(const MoeLayerArgs& l) {  // fused_experts' own check of x, before the router sees it
  const FusedMoeArgs& a = l.experts;
  for (int64_t i = 0; i < a.M * a.H; ++i)
    if (!std::isfinite(load_x(a.x, a.dtype, i)))
      throw ValueError(msg("hidden_states[", i / a.H, ", ", i % a.H, "] is not finite (", load_x(a.x, a.dtype, i), ")"));
}

void router_logits(const void* x, DType dtype, int64_t M, int64_t H, const float* gate, int64_t E,
                   const float* bias, float* logits) {
  if (M == 0) return;
  dots(x, dtype, M, H, gate, E, logits);
  if (bias)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t e = 0; e < E; ++e) logits[m * E + e] += bias[e];
}

void shared_gate(const void* x, DType dtype, int64_t M, int64_t H, const float* w, float* g) {
  if (M == 0) return;
  dots(x, dtype, M, H, w, 1, g);
  for (int64_t m = 0; m < M; ++m) g[m] = float(1.0 / (1.0 + std::exp(-double(g[m]))));
}

void moe_layer(const MoeLayerArgs& a) {
  const FusedMoeArgs& x = a.experts;
  const int64_t M = x.M, H = x.H, E = x.w13->num_experts, k = a.routing.top_k;
  check_moe_layer(a);
  if (M == 0) return;
  std::vector<float> logits(size_t(M * E)), w(size_t(M * k));
  std::vector<int32_t> ids(size_t(M * k));
  router_logits(x.x, x.dtype, M, H, a.gate, E, a.gate_bias, logits.data());
  select_experts(logits.data(), M, E, a.routing, w.data(), ids.data());
  FusedMoeArgs r = x;
  r.topk_weights = w.data(), r.topk_ids = ids.data(), r.ids_int64 = false, r.k = k;
  r.expert_map = nullptr, r.num_global_experts = 0, r.apply_router_weight_on_input = false;
  if (!a.shared_gate) {
    fused_experts(r);
    if (a.shared_w13) shared_expert(x.x, x.dtype, M, H, *a.shared_w13, *a.shared_w2, x.out, 1.0, x.out);
    return;
  }
  // Gated shared expert: both parts in fp32 on the widened x, summed, rounded once.
  std::vector<float> xf, routed(static_cast<size_t>(M * H)), shared(static_cast<size_t>(M * H)), g(static_cast<size_t>(M));
  const float* xs = static_cast<const float*>(x.x);
  if (x.dtype != DType::kF32) {
    xf.resize(size_t(M * H));
    for (int64_t i = 0; i < M * H; ++i) xf[size_t(i)] = load_x(x.x, x.dtype, i);
    xs = xf.data();
  }
  shared_gate(xs, DType::kF32, M, H, a.shared_gate, g.data());
  r.x = xs, r.dtype = DType::kF32, r.out = routed.data();
  fused_experts(r);
  std::vector<int32_t> zeros(static_cast<size_t>(M), 0);
  FusedMoeArgs s;
  s.x = xs, s.dtype = DType::kF32, s.M = M, s.H = H, s.w13 = a.shared_w13, s.w2 = a.shared_w2;
  s.topk_weights = g.data(), s.topk_ids = zeros.data(), s.k = 1, s.out = shared.data();
  fused_experts(s);
  for (int64_t i = 0; i < M * H; ++i) {
    const float v = routed[size_t(i)] + shared[size_t(i)];
    if (x.dtype == DType::kF32) static_cast<float*>(x.out)[i] = v;
    else static_cast<uint16_t*>(x.out)[i] = float_to_bf16(v);
  }
}

}  // namespace moe_cpu
