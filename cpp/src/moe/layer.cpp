// layer.cpp — the router GEMM (kernels/router_dots.h: one summation order on every ISA) and the layer's chain of
// calls.
#include "moe_cpu/layer.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "common/numeric.h"
#include "common/parallel.h"
#include "moe_cpu/cpu_features.h"
#include "moe_cpu/errors.h"

#define MOE_ROUTER_DOTS_DECL                                                                                    \
  void router_dots(const float*, int64_t, int64_t, const float*, int64_t, int64_t, int64_t, int64_t, float*);     \
  void router_dots(const float*, int64_t, int64_t, const uint16_t*, int64_t, int64_t, int64_t, int64_t, float*);
namespace moe_cpu::kernels {
namespace portable {
MOE_ROUTER_DOTS_DECL
}
#if defined(__x86_64__)
namespace avx2 {
MOE_ROUTER_DOTS_DECL
}
namespace avx512 {
MOE_ROUTER_DOTS_DECL
}
#endif
}  // namespace moe_cpu::kernels
#undef MOE_ROUTER_DOTS_DECL

namespace moe_cpu {
namespace {

constexpr int64_t kRows = 4, kExpertsPerTask = 16;

template <class W>
using DotsFn = void (*)(const float*, int64_t, int64_t, const W*, int64_t, int64_t, int64_t, int64_t, float*);

template <class W>
DotsFn<W> dots_fn() {  // one source (kernels/router_dots.h), the widest vectors the active ISA level has
#if defined(__x86_64__)
  const uint64_t f = active_features();
  if (f & kFeatAvx512) return kernels::avx512::router_dots;
  if (f & kFeatAvx2) return kernels::avx2::router_dots;
#endif
  return kernels::portable::router_dots;
}

// out[m * E + e] = x[m] . w[e] (w: E rows of H, fp32 or bf16 bits), in tasks of kRows rows x kExpertsPerTask experts.
template <class W>
void dots(const void* x, DType dt, int64_t M, int64_t H, const W* w, int64_t E, float* out) {
  const DotsFn<W> fn = dots_fn<W>();
  const int64_t row_blocks = (M + kRows - 1) / kRows, e_blocks = (E + kExpertsPerTask - 1) / kExpertsPerTask;
  parallel_for(row_blocks * e_blocks, [&](int64_t t) {
    const int64_t m0 = t / e_blocks * kRows, n = std::min(kRows, M - m0);
    const int64_t e0 = t % e_blocks * kExpertsPerTask, e1 = std::min(E, e0 + kExpertsPerTask);
    if (dt == DType::kF32) return fn(static_cast<const float*>(x) + m0 * H, n, H, w, H, e0, e1, E, out + m0 * E);
    float xf[kRows * 1024];  // bf16 rows widened exactly, on the stack when they fit
    std::vector<float> big;
    float* rows = xf;
    if (n * H > kRows * 1024) big.resize(size_t(n * H)), rows = big.data();
    const uint16_t* b = static_cast<const uint16_t*>(x) + m0 * H;
    for (int64_t i = 0; i < n * H; ++i) rows[i] = bf16_to_float(b[i]);
    fn(rows, n, H, w, H, e0, e1, E, out + m0 * E);
  });
}

}  // namespace

void check_moe_layer(const MoeLayerArgs& l) {  // fused_experts' own check of x, before the router sees it
  check_finite_hidden_states(l.experts.x, l.experts.dtype, l.experts.M, l.experts.H);
}

bool gate_as_bf16(const float* gate, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = float_to_bits(gate[i]);
    if (b & 0xffffu) return false;
    out[i] = uint16_t(b >> 16);
  }
  return true;
}

void router_logits(const void* x, DType dtype, int64_t M, int64_t H, const float* gate, int64_t E,
                   const float* bias, float* logits, const uint16_t* gate_bf16) {
  if (M == 0) return;
  if (gate_bf16) dots(x, dtype, M, H, gate_bf16, E, logits);
  else dots(x, dtype, M, H, gate, E, logits);
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
  router_logits(x.x, x.dtype, M, H, a.gate, E, a.gate_bias, logits.data(), a.gate_bf16);
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
    for (int64_t i = 0; i < M * H; ++i) xf[size_t(i)] = bf16_to_float(static_cast<const uint16_t*>(x.x)[i]);
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
