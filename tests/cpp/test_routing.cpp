// test_routing.cpp — select_experts against hand-computed cases, and moe_align_block_size.
#include <gtest/gtest.h>

#include <cmath>

#include "moe_cpu/errors.h"
#include "moe_cpu/fused_moe.h"
#include "moe_cpu/routing.h"

namespace moe_cpu {
namespace {

TEST(SelectExperts, SoftmaxTopKWithoutRenormalize) {
  const float l[4] = {1.f, 2.f, 3.f, 0.f};
  RoutingArgs a;
  a.top_k = 2;
  float w[2];
  int32_t ids[2];
  select_experts(l, 1, 4, a, w, ids);
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + 1.0;
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 1);
  EXPECT_FLOAT_EQ(w[0], float(std::exp(3.0) / z));
  EXPECT_FLOAT_EQ(w[1], float(std::exp(2.0) / z));
}

TEST(SelectExperts, RenormalizeAndScalingFactor) {
  const float l[4] = {1.f, 2.f, 3.f, 0.f};
  RoutingArgs a;
  a.top_k = 2, a.renormalize = true, a.routed_scaling_factor = 2.5;
  float w[2];
  int32_t ids[2];
  select_experts(l, 1, 4, a, w, ids);
  const double e = std::exp(1.0);  // softmax over {3, 2}: 1/(1+e^-1) and e^-1/(1+e^-1)
  EXPECT_FLOAT_EQ(w[0], float(2.5 * e / (e + 1)));
  EXPECT_FLOAT_EQ(w[1], float(2.5 * 1 / (e + 1)));
}

TEST(SelectExperts, TiesGoToTheLowerIndex) {
  const float l[5] = {0.5f, 1.f, 1.f, 0.5f, 1.f};
  RoutingArgs a;
  a.top_k = 3;
  float w[3];
  int32_t ids[3];
  select_experts(l, 1, 5, a, w, ids);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  EXPECT_EQ(ids[2], 4);
}

TEST(SelectExperts, SigmoidRenormalized) {
  const float l[3] = {0.f, 2.f, -1.f};
  RoutingArgs a;
  a.top_k = 2, a.sigmoid = true, a.renormalize = true;
  float w[2];
  int32_t ids[2];
  select_experts(l, 1, 3, a, w, ids);
  const double s1 = 1 / (1 + std::exp(-2.0)), s0 = 0.5;
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 0);
  EXPECT_FLOAT_EQ(w[0], float(s1 / (s0 + s1)));
}

TEST(SelectExperts, GroupedWithCorrectionBias) {
  // 8 experts, 4 groups of 2, keep 2 groups, top 2. Sigmoid scores; the bias moves the choice.
  const float l[8] = {0.f, 0.f, 1.f, 1.f, 3.f, -3.f, 2.f, 2.f};
  const float bias[8] = {2.f, 2.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  RoutingArgs a;
  a.top_k = 2, a.sigmoid = true, a.grouped = true, a.num_expert_group = 4, a.topk_group = 2;
  a.correction_bias = bias, a.routed_scaling_factor = 1.0;
  float w[2];
  int32_t ids[2];
  select_experts(l, 1, 8, a, w, ids);
  // Group scores (sum of top 2 biased): g0 = 2*(0.5+2) = 5, g1 = 2*0.731, g2 = 0.953+0.047 = 1, g3 = 2*0.881.
  // Keep g0 and g3; top 2 by biased score: experts 0, 1 (2.5 each); weights are the unbiased 0.5.
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 1);
  EXPECT_FLOAT_EQ(w[0], 0.5f);
  EXPECT_FLOAT_EQ(w[1], 0.5f);
}

TEST(SelectExperts, GroupedSoftmaxKeepsBestGroupsByMax) {
  const float l[6] = {5.f, 0.f, 0.f, 4.f, 4.5f, 0.f};  // groups {0,1}, {2,3}, {4,5}; maxima 5, 4, 4.5
  RoutingArgs a;
  a.top_k = 2, a.grouped = true, a.num_expert_group = 3, a.topk_group = 1, a.renormalize = true;
  float w[2];
  int32_t ids[2];
  select_experts(l, 1, 6, a, w, ids);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 1);
  EXPECT_FLOAT_EQ(w[0] + w[1], 1.f);
  EXPECT_FLOAT_EQ(w[1] / w[0], float(std::exp(-5.0)));
}

TEST(SelectExperts, RejectsBadArguments) {
  const float l[4] = {0.f, 1.f, NAN, 2.f};
  RoutingArgs a;
  a.top_k = 2;
  float w[8];
  int32_t ids[8];
  EXPECT_THROW(select_experts(l, 1, 4, a, w, ids), ValueError);  // NaN logit
  const float ok[4] = {0.f, 1.f, 2.f, 3.f};
  a.top_k = 5;
  EXPECT_THROW(select_experts(ok, 1, 4, a, w, ids), ValueError);  // k > E
  a.top_k = 2, a.grouped = true, a.num_expert_group = 3, a.topk_group = 1;
  EXPECT_THROW(select_experts(ok, 1, 4, a, w, ids), ValueError);  // 3 does not divide 4
}

TEST(AlignBlockSize, GroupsAndPadsRowsByExpert) {
  const int32_t ids[6] = {2, 0, 2, -1, 0, 2};  // M=3, k=2
  AlignedRows r = moe_align_block_size(ids, 6, 3, 2);
  EXPECT_EQ(r.num_tokens_post_pad, 6);  // expert 0: 2 rows, expert 1: 0, expert 2: 3 -> 4
  EXPECT_EQ(r.sorted_ids, (std::vector<int32_t>{1, 4, 0, 2, 5, 6}));
  EXPECT_EQ(r.expert_ids, (std::vector<int32_t>{0, 2, 2}));
  const int32_t bad[1] = {3};
  EXPECT_THROW(moe_align_block_size(bad, 1, 3, 2), ValueError);
}

}  // namespace
}  // namespace moe_cpu
