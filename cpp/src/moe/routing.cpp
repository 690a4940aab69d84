// routing.cpp — select_experts: plain top-k (softmax of logits, or sigmoid) and grouped top-k
// with an optional score-correction bias, as in vLLM (DESIGN.md section 5).
#include "moe_cpu/routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/parallel.h"
#include "moe_cpu/errors.h"

namespace moe_cpu {
namespace {

void check(const float* logits, int64_t M, int64_t E, const RoutingArgs& a) {
  if (E < 1) throw ValueError(msg("router_logits has ", E, " experts; need at least 1"));
  if (a.top_k < 1 || a.top_k > E)
    throw ValueError(msg("top_k = ", a.top_k, " must be in [1, num_experts = ", E, "]"));
  if (!std::isfinite(a.routed_scaling_factor))
    throw ValueError(msg("routed_scaling_factor = ", a.routed_scaling_factor, " is not finite"));
  if (a.grouped) {
    const int64_t G = a.num_expert_group, T = a.topk_group;
    if (G < 1 || E % G != 0)
      throw ValueError(msg("num_expert_group = ", G, " must be >= 1 and divide num_experts = ", E));
    if (T < 1 || T > G) throw ValueError(msg("topk_group = ", T, " must be in [1, num_expert_group = ", G, "]"));
    if (a.top_k > T * (E / G))
      throw ValueError(msg("top_k = ", a.top_k, " exceeds the ", T * (E / G), " experts in the ", T,
                           " kept groups (topk_group * num_experts / num_expert_group)"));
    if (a.correction_bias && E / G < 2)
      throw ValueError(msg("e_score_correction_bias needs at least 2 experts per group (got ", E / G, ")"));
  }
  for (int64_t i = 0; i < M * E; ++i)
    if (!std::isfinite(logits[i]))
      throw ValueError(msg("router_logits[", i / E, ", ", i % E, "] = ", logits[i], " is not finite"));
  if (a.correction_bias)
    for (int64_t e = 0; e < E; ++e)
      if (!std::isfinite(a.correction_bias[e]))
        throw ValueError(msg("e_score_correction_bias[", e, "] = ", a.correction_bias[e], " is not finite"));
}

// Indices of the n largest of key[0..len), by descending key, ties to the lower index.
std::vector<int32_t> top_n(const std::vector<float>& key, int64_t n) {
  std::vector<int32_t> idx(key.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t x, int32_t y) {
    return key[size_t(x)] > key[size_t(y)] || (key[size_t(x)] == key[size_t(y)] && x < y);
  });
  idx.resize(size_t(n));
  return idx;
}

void route_row(const float* l, int64_t E, const RoutingArgs& a, float* w, int32_t* ids) {
  const int64_t k = a.top_k;
  std::vector<float> score(static_cast<size_t>(E));
  if (!a.sigmoid && !a.grouped && !a.correction_bias) {
    // vLLM's plain path: select by raw logits; weights are softmax probabilities.
    std::vector<float> key(l, l + E);
    const std::vector<int32_t> sel = top_n(key, k);
    const float mx = *std::max_element(l, l + E);
    double z = 0;
    for (int64_t e = 0; e < E; ++e) z += std::exp(double(l[e]) - mx);
    double zk = 0;
    for (int32_t e : sel) zk += std::exp(double(l[e]) - mx);
    const double denom = a.renormalize ? zk : z;
    for (int64_t j = 0; j < k; ++j) {
      ids[j] = sel[size_t(j)];
      w[j] = float(std::exp(double(l[sel[size_t(j)]]) - mx) / denom * a.routed_scaling_factor);
    }
    return;
  }
  if (a.sigmoid) {
    for (int64_t e = 0; e < E; ++e) score[size_t(e)] = float(1.0 / (1.0 + std::exp(-double(l[e]))));
  } else {
    const float mx = *std::max_element(l, l + E);
    double z = 0;
    for (int64_t e = 0; e < E; ++e) z += std::exp(double(l[e]) - mx);
    for (int64_t e = 0; e < E; ++e) score[size_t(e)] = float(std::exp(double(l[e]) - mx) / z);
  }
  std::vector<float> key = score;  // selection key: biased scores
  if (a.correction_bias)
    for (int64_t e = 0; e < E; ++e) key[size_t(e)] += a.correction_bias[e];
  if (a.grouped) {
    const int64_t G = a.num_expert_group, per = E / G;
    std::vector<float> gscore(static_cast<size_t>(G));
    for (int64_t g = 0; g < G; ++g) {
      std::vector<float> part(key.begin() + g * per, key.begin() + (g + 1) * per);
      std::sort(part.begin(), part.end(), std::greater<float>());
      gscore[size_t(g)] = a.correction_bias ? part[0] + part[1] : part[0];
    }
    std::vector<bool> keep(static_cast<size_t>(G), false);
    for (int32_t g : top_n(gscore, a.topk_group)) keep[size_t(g)] = true;
    for (int64_t e = 0; e < E; ++e)
      if (!keep[size_t(e / per)]) key[size_t(e)] = -INFINITY;
  }
  const std::vector<int32_t> sel = top_n(key, k);
  double sum = 0;
  for (int32_t e : sel) sum += score[size_t(e)];
  for (int64_t j = 0; j < k; ++j) {
    ids[j] = sel[size_t(j)];
    double v = score[size_t(sel[size_t(j)])];
    if (a.renormalize) v = sum > 0 ? v / sum : 0.0;
    w[j] = float(v * a.routed_scaling_factor);
  }
}

}  // namespace

void select_experts(const float* logits, int64_t M, int64_t E, const RoutingArgs& a, float* weights,
                    int32_t* ids) {
  check(logits, M, E, a);
  parallel_for(M, [&](int64_t m) {
    route_row(logits + m * E, E, a, weights + m * a.top_k, ids + m * a.top_k);
  });
}

}  // namespace moe_cpu
