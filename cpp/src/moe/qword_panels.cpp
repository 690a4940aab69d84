// qword_panels.cpp — int4 panels to the qword order and back (layout: qword_panels.h).
#include "moe/qword_panels.h"

#include "common/layout.h"
#include "common/parallel.h"

namespace moe_cpu {

namespace {
constexpr int64_t kQwordMaxGroups = 512;  // IntAvx2G32's row tiles (kG32MaxGroups)

// dst = src with each step's bytes permuted: to_qword, standard -> qword; else back.
AlignedBuffer permuted(const PackedExperts& p, bool to_qword) {
  const int64_t panels = p.num_experts * p.num_blocks(), bytes = p.panel_bytes(), steps = bytes / 64;
  AlignedBuffer out(p.qweight.size());
  parallel_for(panels, [&](int64_t pi) {
    const uint8_t* s = p.qweight.data() + pi * bytes;
    uint8_t* d = out.data() + pi * bytes;
    for (int64_t t = 0; t < steps; ++t, s += 64, d += 64) {
      uint8_t code[16][8];  // the step's codes: code[c][i] of column c, k 8t + i
      for (int64_t c = 0; c < 16; ++c)
        for (int64_t i = 0; i < 8; ++i) {
          if (to_qword) {
            const uint8_t b = s[4 * c + i % 4];
            code[c][i] = i < 4 ? b & 15 : b >> 4;
          } else {
            bool high = false;
            const uint8_t b = s[qword_byte(c, i, &high)];
            code[c][i] = high ? b >> 4 : b & 15;
          }
        }
      for (int64_t b = 0; b < 64; ++b) d[b] = 0;
      for (int64_t c = 0; c < 16; ++c)
        for (int64_t i = 0; i < 8; ++i) {
          if (to_qword) {
            bool high = false;
            const int64_t at = qword_byte(c, i, &high);
            d[at] = uint8_t(d[at] | (high ? code[c][i] << 4 : code[c][i]));
          } else {
            const int64_t at = 4 * c + i % 4;
            d[at] = uint8_t(d[at] | (i < 4 ? code[c][i] : code[c][i] << 4));
          }
        }
    }
  });
  return out;
}
}  // namespace

void derive_qword_panels(PackedExperts& p) {
  if (p.qword_panels || p.scheme != Scheme::kInt4W4A8 || p.a16 || p.has_zeros || p.qweight.size() == 0) return;
  if (p.code_shuffle && code_table_top(p) <= 31) return;  // a codebook taken as table bytes
  const int64_t K = p.in_features;
  // groups of 32; or of 16 through a |codebook| (IQ2_XS, IQ2_S, ik's IQ2_K / IQ3_K)
  const int64_t gl = p.group_len();
  if (!(gl == 32 || (gl == 16 && p.code_shuffle)) || K % gl || p.padded_k() != K || p.num_groups() > kQwordMaxGroups)
    return;
  p.qweight = permuted(p, true), p.qword_panels = true;
}

AlignedBuffer standard_panels(const PackedExperts& p) { return permuted(p, false); }

void join_qword_panels(PackedExperts& p) {
  if (!p.qword_panels) return;
  p.qweight = standard_panels(p), p.qword_panels = false;
}

}  // namespace moe_cpu
