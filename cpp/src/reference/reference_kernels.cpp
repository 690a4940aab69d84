// reference_kernels.cpp — Eigen reference GEMMs of every precision, on the canonical layout.
// Layout: the canonical PackedExperts layout (packed_experts.h); weights are unpacked per call.
// Numerics: int schemes take exact integer dot products inside each scale group (in float while
//   group_len*127*15 < 2^24, else in double), scale them per (row n, group) and sum the groups in
//   fp32, then multiply by the row's activation scale. fp8: bf16 activations x e4m3 values per
//   K-block (exact products, fp32 sums), times the block scale. bf16: fp32 sums of exact products.
// Needs: nothing. Limits: none (any M, N, K).
#include <Eigen/Core>

#include "common/numeric.h"
#include "dispatch/registry.h"

namespace moe_cpu {
namespace {

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// acc[r,n] += P[r,n] * scale(e, n, gi), group by group.
template <class T>
void grouped_gemm(const PackedExperts& w, int64_t e, const Mat<T>& A, const Mat<T>& W,
                  Mat<float>& acc) {
  const int64_t gl = w.group_len(), K = w.in_features;
  acc.setZero(A.rows(), W.rows());
  Mat<T> P;
  for (int64_t gi = 0; gi < w.num_groups(); ++gi) {
    const int64_t k0 = gi * gl, len = std::min(gl, K - k0);
    P.noalias() = A.middleCols(k0, len) * W.middleCols(k0, len).transpose();
    for (int64_t n = 0; n < W.rows(); ++n) {
      const float s = w.scale(e, n, gi);
      for (int64_t r = 0; r < A.rows(); ++r) acc(r, n) += float(P(r, n)) * s;
    }
  }
}

template <class T>
void int_gemm_as(const PackedExperts& w, int64_t e, const ActRows& a, float* c, int64_t ldc) {
  const int64_t N = w.out_features, K = w.in_features;
  Mat<T> A(a.rows, K), W(N, K);
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t k = 0; k < K; ++k) A(r, k) = T(a.q[r * K + k]);
  std::vector<int8_t> row(K);
  for (int64_t n = 0; n < N; ++n) {
    w.int_row(e, n, row.data());
    for (int64_t k = 0; k < K; ++k) W(n, k) = T(row[k]);
  }
  Mat<float> acc;
  grouped_gemm(w, e, A, W, acc);
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t n = 0; n < N; ++n) c[r * ldc + n] = acc(r, n) * a.scale[r];
}

void int_gemm(const PackedExperts& w, int64_t e, const ActRows& a, float* c, int64_t ldc) {
  // |sum| <= len * 127 * 15 must stay below 2^24 for float sums to be exact.
  if (w.group_len() * 127 * 15 < (int64_t(1) << 24)) int_gemm_as<float>(w, e, a, c, ldc);
  else int_gemm_as<double>(w, e, a, c, ldc);
}

Mat<float> bf16_rows(const ActRows& a) {
  Mat<float> A(a.rows, a.K);
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t k = 0; k < a.K; ++k) A(r, k) = bf16_to_float(a.bf16[r * a.K + k]);
  return A;
}

void fp8_gemm(const PackedExperts& w, int64_t e, const ActRows& a, float* c, int64_t ldc) {
  const int64_t N = w.out_features, K = w.in_features;
  const uint8_t* codes = w.qweight.as<uint8_t>() + e * N * K;
  Mat<float> W(N, K);
  for (int64_t i = 0; i < N * K; ++i) W.data()[i] = e4m3fn_to_float(codes[i]);
  Mat<float> acc;
  grouped_gemm(w, e, bf16_rows(a), W, acc);
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t n = 0; n < N; ++n) c[r * ldc + n] = acc(r, n);
}

void bf16_gemm(const PackedExperts& w, int64_t e, const ActRows& a, float* c, int64_t ldc) {
  const int64_t N = w.out_features, K = w.in_features;
  const uint16_t* bits = w.qweight.as<uint16_t>() + e * N * K;
  Mat<float> W(N, K);
  for (int64_t i = 0; i < N * K; ++i) W.data()[i] = bf16_to_float(bits[i]);
  Mat<float> C = bf16_rows(a) * W.transpose();
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t n = 0; n < N; ++n) c[r * ldc + n] = C(r, n);
}

}  // namespace

extern const KernelDesc kernel_w4a8_reference{"w4a8_reference", Scheme::kInt4W4A8, "reference", 1, 1, 0, int_gemm};
extern const KernelDesc kernel_w8a8_reference{"w8a8_reference", Scheme::kInt8W8A8, "reference", 1, 1, 0, int_gemm};
extern const KernelDesc kernel_fp8w_reference{"fp8w_reference", Scheme::kFp8W8A16, "reference", 1, 1, 0, fp8_gemm};
extern const KernelDesc kernel_bf16_reference{"bf16_reference", Scheme::kBf16, "reference", 1, 1, 0, bf16_gemm};

}  // namespace moe_cpu
