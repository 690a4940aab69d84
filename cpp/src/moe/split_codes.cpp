// split_codes.cpp — int8 panels to split 2- / 3- / 4- / 5- / 6-bit codes and back (layout: split_codes.h).
#include "moe/split_codes.h"

#include <algorithm>
#include <atomic>

#include "common/layout.h"
#include "common/parallel.h"

namespace moe_cpu {

namespace {
// The groups along K the split kernels' tiles take (int_avx2_split.h).
constexpr int64_t kSplitMaxGroups = 512;
}  // namespace

void derive_split_codes(PackedExperts& p, bool three) {
  if (p.split_bits || p.scheme != Scheme::kInt8W8A8 || p.a16 || p.qweight.size() == 0) return;
  const int64_t gl = p.group_len(), K = p.in_features;
  if ((gl != 16 && gl != 32) || K % gl || p.num_groups() > kSplitMaxGroups) return;
  const uint8_t* u = p.qweight.data();
  const int64_t panels = p.num_experts * p.num_blocks(), NB = p.num_blocks(), N = p.out_features;
  const int64_t i8_bytes = layout::panel_bytes(Scheme::kInt8W8A8, K);
  // The columns' codes (a last block's padding columns are never read: they take q = 0 below).
  const auto valid = [&](int64_t pi) { return std::min<int64_t>(16, N - 16 * (pi % NB)); };
  std::atomic<int> lo{255}, hi{0};
  parallel_for(panels, [&](int64_t pi) {
    int l = 255, h = 0;
    const uint8_t* src = u + pi * i8_bytes;
    for (int64_t t = 0; t < i8_bytes / 64; ++t)
      for (int64_t b = 0; b < 4 * valid(pi); ++b) l = std::min(l, int(src[t * 64 + b])), h = std::max(h, int(src[t * 64 + b]));
    for (int v = lo.load(); l < v && !lo.compare_exchange_weak(v, l);) {}
    for (int v = hi.load(); h > v && !hi.compare_exchange_weak(v, h);) {}
  });
  const int l0 = lo.load(), span = hi.load() - l0;
  const int bits = span < 0 ? 0 : span < 4 ? 2 : span < 8 && three ? 3 : span < 16 ? 4 : span < 32 && gl == 32 ? 5 : span < 64 ? 6 : 0;
  if (!bits) return;
  const int zero = 128 - l0;  // q = w + zero = u - l0
  const int64_t Kp = p.padded_k(), steps = Kp / 8, xb = split_xb(bits), lb = split_lb(bits);
  const int64_t low_bytes = split_low_bytes(Kp, bits), high_bytes = split_high_bytes(Kp, bits);
  AlignedBuffer low(size_t(panels * low_bytes)), high(size_t(panels * high_bytes));
  parallel_for(panels, [&](int64_t pi) {
    const uint8_t* src = u + pi * i8_bytes;  // int8 step s (4 k): byte 4c + i = w(4s + i) + 128
    uint8_t* dl = low.data() + pi * low_bytes;
    uint8_t* dh = high.data() + pi * high_bytes;
    for (int64_t t = 0; t < steps; ++t)
      for (int64_t b = 0; b < 4 * valid(pi); ++b)  // b = 4c + i
        for (int j = 0; j < 2; ++j) {
          const int q = src[(2 * t + j) * 64 + b] - l0;
          const SplitPos l = split_low_pos(bits, t, j);
          dl[l.vec + b] |= uint8_t((q & ((1 << lb) - 1)) << l.bit);
          if (xb) {
            const SplitPos h = split_high_pos(bits, t, j);
            dh[h.vec + b] |= uint8_t((q >> lb) << h.bit);
          }
        }
  });
  p.qweight = std::move(low), p.qhigh = std::move(high), p.split_bits = bits, p.split_zero = zero;
}

AlignedBuffer joined_codes(const PackedExperts& p) {
  const int64_t K = p.in_features, Kp = p.padded_k(), steps = Kp / 8, panels = p.num_experts * p.num_blocks();
  const int64_t i8_bytes = layout::panel_bytes(Scheme::kInt8W8A8, K), low_bytes = p.panel_bytes();
  const int64_t high_bytes = split_high_bytes(Kp, p.split_bits);
  const int shift = 128 - p.split_zero;  // u = q - zero + 128
  const int64_t NB = p.num_blocks(), N = p.out_features;
  AlignedBuffer out(size_t(panels * i8_bytes));  // padding columns stay 0, as the packers leave them
  parallel_for(panels, [&](int64_t pi) {
    const uint8_t* sl = p.qweight.data() + pi * low_bytes;
    const uint8_t* sh = p.qhigh.data() + pi * high_bytes;
    uint8_t* d = out.data() + pi * i8_bytes;
    const int64_t valid = std::min<int64_t>(16, N - 16 * (pi % NB));
    for (int64_t t = 0; t < steps; ++t)
      for (int64_t b = 0; b < 4 * valid; ++b)
        for (int j = 0; j < 2; ++j) d[(2 * t + j) * 64 + b] = uint8_t(split_code(sl, sh, p.split_bits, t, b, j) + shift);
  });
  return out;
}

void join_split_codes(PackedExperts& p) {
  if (!p.split_bits) return;
  p.qweight = joined_codes(p), p.qhigh = AlignedBuffer(), p.split_bits = 0, p.split_zero = 0;
}

}  // namespace moe_cpu
