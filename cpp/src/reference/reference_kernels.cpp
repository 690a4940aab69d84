// reference_kernels.cpp — Eigen reference GEMMs of every precision, read through the layout accessors.
// Numerics: int schemes take exact integer dot products inside each scale group (in float while
//   group_len*amax*max|w| < 2^24, amax 127 for int8 activation codes and 32767 for A16's int16 ones,
//   else in double), scale them per (column, group), subtract the group offset (min) times the group's
//   activation code sum, sum the groups in fp32, then multiply by the row's activation scale (A8 activation
//   blocks: each piece's dot product and code sum times its block's scale first; the row scale is 1). fp8: bf16 activations x e4m3 values per
//   K-block (exact products, fp32 sums), times the block scale. bf16: fp32 sums of exact products.
// Needs: nothing. Limits: none (any M, N, K, group).
#include <Eigen/Core>

#include <cstdlib>

#include "common/numeric.h"
#include "dispatch/registry.h"

namespace moe_cpu {
namespace {

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct Cols {
  int64_t n0, count;
};
Cols cols_of(const PackedExperts& w, int64_t b0, int64_t b1) {
  const int64_t n0 = 16 * b0;
  return {n0, std::min(w.out_features, 16 * b1) - n0};
}

// acc[r, j] = sum over groups of P_g[r, j] * scale(e, n0 + j, g) (- min(e, n0 + j, g) * (sum of A's row r
// over group g) when the weights have mins: the activation code sums of the int schemes). With A8 activation
// blocks (a.bscale) each group splits into pieces (the blocks shorter than it), and every piece's exact dot
// product and code sum are multiplied by its block's scale first.
template <class T>
Mat<float> grouped_gemm(const PackedExperts& w, int64_t e, Cols cols, const Mat<T>& A, const Mat<T>& W, const ActRows& a) {
  const int64_t gl = w.group_len(), K = w.in_features, G = w.num_groups();
  const int64_t NP = a.bscale ? a.NP : 1, pl = NP > 1 ? a.pk : gl;
  Mat<float> acc = Mat<float>::Zero(A.rows(), W.rows());
  Mat<T> P;
  for (int64_t gi = 0; gi < G; ++gi) {
    Eigen::VectorXf fsum = Eigen::VectorXf::Zero(A.rows());  // the group's (scaled) activation code sums
    for (int64_t pi = 0; pi < NP; ++pi) {
      const int64_t k0 = gi * gl + pi * pl, len = std::min(NP > 1 ? pl : gl, K - k0);
      P.noalias() = A.middleCols(k0, len) * W.middleCols(k0, len).transpose();
      Eigen::Matrix<T, Eigen::Dynamic, 1> asum;
      if (w.has_mins) asum = A.middleCols(k0, len).rowwise().sum();  // exact (integers)
      for (int64_t r = 0; r < A.rows(); ++r) {
        const float bs = a.bscale ? a.bscale[a.row_idx[r] * G * NP + gi * NP + pi] : 1.f;
        if (w.has_mins) fsum(r) += float(asum(r)) * bs;
        for (int64_t j = 0; j < W.rows(); ++j) acc(r, j) += float(P(r, j)) * bs * w.scale(e, cols.n0 + j, gi);
      }
    }
    if (w.has_mins)
      for (int64_t j = 0; j < W.rows(); ++j) {
        const float m = w.min(e, cols.n0 + j, gi);
        for (int64_t r = 0; r < A.rows(); ++r) acc(r, j) -= m * fsum(r);
      }
  }
  return acc;
}

void store(const Mat<float>& acc, const float* row_scale, const ActRows& a, float* c, int64_t ldc) {
  for (int64_t r = 0; r < acc.rows(); ++r)
    for (int64_t j = 0; j < acc.cols(); ++j)
      c[r * ldc + j] = row_scale ? acc(r, j) * row_scale[a.row_idx[r]] : acc(r, j);
}

template <class T>
void int_gemm_as(const PackedExperts& w, int64_t e, Cols cols, const ActRows& a, float* c, int64_t ldc) {
  const int64_t K = w.in_features;
  Mat<T> A(a.rows, K), W(cols.count, K);
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t k = 0; k < K; ++k)
      A(r, k) = a.q16 ? T(a.q16[a.row_idx[r] * a.Kp + a16_pos(k)]) : T(a.q[a.row_idx[r] * a.Kp + k]);
  std::vector<int8_t> row(static_cast<size_t>(K));
  for (int64_t j = 0; j < cols.count; ++j) {
    w.int_row(e, cols.n0 + j, row.data());
    for (int64_t k = 0; k < K; ++k) W(j, k) = T(row[size_t(k)]);
  }
  store(grouped_gemm(w, e, cols, A, W, a), a.scale, a, c, ldc);
}

void int_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  // |sum| <= len * amax * max|w| must stay below 2^24 for float sums to be exact.
  const int64_t amax = w.a16 ? 32767 : 127;
  int64_t wmax = 128;
  if (w.scheme == Scheme::kInt4W4A8) {
    wmax = 15;
    for (int i = 0; i < 16 && !w.has_zeros; ++i) wmax = std::max<int64_t>(wmax, std::abs(int(w.codebook[i])));
  }
  if (w.group_len() * amax * wmax < (int64_t(1) << 24)) int_gemm_as<float>(w, e, cols_of(w, b0, b1), a, c, ldc);
  else int_gemm_as<double>(w, e, cols_of(w, b0, b1), a, c, ldc);
}

Mat<float> bf16_rows(const ActRows& a, int64_t K) {
  Mat<float> A(a.rows, K);
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t k = 0; k < K; ++k) A(r, k) = bf16_to_float(a.bf16[a.row_idx[r] * a.Kp + k]);
  return A;
}

// Raw weight values (e4m3 unscaled, or bf16) of the columns.
Mat<float> raw_weights(const PackedExperts& w, int64_t e, Cols cols) {
  const int64_t K = w.in_features;
  Mat<float> W(cols.count, K);
  std::vector<uint16_t> u(static_cast<size_t>(K));
  for (int64_t j = 0; j < cols.count; ++j) {
    w.code_row(e, cols.n0 + j, u.data());
    for (int64_t k = 0; k < K; ++k)
      W(j, k) = w.scheme == Scheme::kBf16 ? bf16_to_float(u[size_t(k)]) : e4m3fn_to_float(uint8_t(u[size_t(k)]));
  }
  return W;
}

void fp8_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  const Cols cols = cols_of(w, b0, b1);
  store(grouped_gemm(w, e, cols, bf16_rows(a, w.in_features), raw_weights(w, e, cols), a), nullptr, a, c, ldc);
}

void bf16_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  const Cols cols = cols_of(w, b0, b1);
  Mat<float> C = bf16_rows(a, w.in_features) * raw_weights(w, e, cols).transpose();
  store(C, nullptr, a, c, ldc);
}

}  // namespace

// The int kernels read every compact weight form through the accessors (int_row, scale, min): the file's bytes.
extern const KernelDesc kernel_w4a8_reference{"w4a8_reference", Scheme::kInt4W4A8, "reference", 1, 1, 0, nullptr, int_gemm,
                                              /*f32_acts=*/false, /*int_mins=*/true, /*int_scales=*/true,
                                              /*gathers_rows=*/nullptr, /*half_scales=*/true, /*split_codes=*/false,
                                              /*qword_panels=*/true};
extern const KernelDesc kernel_w8a8_reference{"w8a8_reference", Scheme::kInt8W8A8, "reference", 1, 1, 0, nullptr, int_gemm,
                                              /*f32_acts=*/false, /*int_mins=*/true, /*int_scales=*/true,
                                              /*gathers_rows=*/nullptr, /*half_scales=*/true, /*split_codes=*/true,
                                              /*qword_panels=*/false, /*split3=*/true, /*int_nibbles=*/true};
extern const KernelDesc kernel_fp8w_reference{"fp8w_reference", Scheme::kFp8W8A16, "reference", 1, 1, 0, nullptr, fp8_gemm};
extern const KernelDesc kernel_w4a16_reference{"w4a16_reference", Scheme::kInt4W4A16, "reference", 1, 1, 0, nullptr, int_gemm,
                                               /*f32_acts=*/false, /*int_mins=*/true, /*int_scales=*/true,
                                               /*gathers_rows=*/nullptr, /*half_scales=*/true};
extern const KernelDesc kernel_w8a16_reference{"w8a16_reference", Scheme::kInt8W8A16, "reference", 1, 1, 0, nullptr, int_gemm,
                                               /*f32_acts=*/false, /*int_mins=*/true, /*int_scales=*/true,
                                               /*gathers_rows=*/nullptr, /*half_scales=*/true};
extern const KernelDesc kernel_bf16_reference{"bf16_reference", Scheme::kBf16, "reference", 1, 1, 0, nullptr, bf16_gemm};

}  // namespace moe_cpu
