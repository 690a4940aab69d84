// packed_experts.h — expert weights of one projection in one scheme, in the blocked layout of
// common/layout.h that every kernel reads (16-column panels, K padded to the scheme's k-step).
// Dequantized weight: int4 codebook[u] * s - m (codebook[u] = u - 8 by default), or (u - z) * s
// with stored zero points; int8 (u - 128) * s - m; m = the float group offset ("min") when
// has_mins, else 0; fp8 e4m3fn(code) * s (s of the bn x bk block); bf16 the value.
// G = the scale groups along K.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moe_cpu/types.h"

namespace moe_cpu {

// ceil(x / d) for x >= 0, d >= 1, without the overflow of (x + d - 1) / d (fp8 block sizes are free).
inline int64_t ceil_div(int64_t x, int64_t d) { return x / d + (x % d != 0); }

struct KernelDesc;  // dispatch/registry.h

struct BufferFree {
  size_t mapped = 0;  // bytes of an own mmap (large buffers), else 0: std::free
  void operator()(uint8_t* p) const;
};

// 64-byte aligned (2 MiB from 2 MiB on), zero-initialised byte buffer.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes);
  // A read-only view of n bytes at p that keeps `owner` (e.g. a file mapping) alive; no copy.
  static AlignedBuffer view(const uint8_t* p, size_t n, std::shared_ptr<const void> owner);
  uint8_t* data() { return view_ ? view_ : ptr_.get(); }
  const uint8_t* data() const { return view_ ? view_ : ptr_.get(); }
  size_t size() const { return size_; }
  template <class T> T* as() { return reinterpret_cast<T*>(data()); }
  template <class T> const T* as() const { return reinterpret_cast<const T*>(data()); }

 private:
  std::unique_ptr<uint8_t, BufferFree> ptr_;
  size_t size_ = 0;
  uint8_t* view_ = nullptr;              // set for views: ptr_ is then empty
  std::shared_ptr<const void> owner_;
};

// Groups per dmin of the integer mins (one K-quant super-block: 8 groups of 32).
constexpr int64_t kIMinRun = 8;

struct PackedExperts {
  Scheme scheme = Scheme::kBf16;  // the weights' scheme (int weights: the A8 name; a16 says how they run)
  bool a16 = false;  // int weights: the activations stay 16-bit (int16 codes per token): int4_w4a16 / int8_w8a16
  // A8 int weights: the activation block B, one int8 scale per B channels of each row (32, 64, 128, 256), or 0
  // for one scale per row. B divides K and either divides the group length or is a multiple of it (set_act_block).
  int64_t act_block = 0;
  int64_t num_experts = 0, out_features = 0, in_features = 0;  // E, N, K
  int64_t group_size = -1;   // int4/int8: g, or -1 per channel; fp8: block_k; bf16: -1
  int64_t block_n = 0;       // fp8 only
  bool has_zeros = false;    // int4 only
  bool has_mins = false;     // int schemes: a float offset per (column, group) is subtracted
  bool has_codebook = false; // int4: codebook set by the packer (else the default q + 8 coding)
  // int4: the integer value of each 4-bit code. Default: u - 8 (signed int4 stored as q + 8);
  // with stored zero points: u itself.
  int8_t codebook[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
  // Derived by set_codebook: code_zero = -min(codebook), code_table[u] = codebook[u] + code_zero
  // in [0, 255] (the unsigned byte the x86 kernels multiply; its zero point is code_zero), and
  // code_shuffle = code_table is not the identity (kernels then map each code through a table).
  uint8_t code_table[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  int code_zero = 8;
  bool code_shuffle = false;
  AlignedBuffer qweight, scales, zeros, mins;
  // int schemes, optional (GPTQ act-order): int32 [E, K]; packed input channel j of expert e is
  // channel k_perm[e][j] of the activations (fused_experts gathers them). Empty: the identity.
  AlignedBuffer k_perm;
  // Integer mins (int schemes with mins, for a kernel with KernelDesc::int_mins or on split codes, when they factor
  // exactly, with dmin an fp16 value): m = dmin * imin, imin int8, one fp16 dmin per column and run of imin_groups
  // groups (as K-quants store them). The kernel then sums imin * (activation code sums) in int32 per run and
  // multiplies by dmin once; `mins` is dropped (min() recomputes the same floats).
  // Layout and index arithmetic of both integer forms: cpp/src/moe/int_forms.h.
  AlignedBuffer imins, dmins;
  int64_t imin_groups = 0;  // 0: float mins, else kIMinRun
  // Integer scales (int schemes, for a kernel with KernelDesc::int_scales, when they factor exactly): s = d * isc,
  // isc int8, one fp16 d per column and run of iscale_groups groups (K-quant and IQ4_XS super-blocks, whose d
  // are fp16). The kernel builds each group's float scale as isc * d in fp32 (the same float: exact), so decode
  // reads 1.25 bytes of scale per group and column instead of 4; `scales` is dropped (scale() recomputes them).
  AlignedBuffer iscales, dscales;
  int64_t iscale_groups = 0;  // 0: float scales, else kIMinRun
  // Both integer forms in 4 bits (GGUF Q2_K's sc and m, for a kernel with KernelDesc::int_nibbles, when every span of
  // 2 runs factors as one fp16 d times integers in [0, 15]): two groups a byte, one d and one dmin per column and span
  // (ggml's per 256), 2.625 bits a weight with 2-bit codes, as the file (layout: cpp/src/moe/int_forms.h).
  bool int_nibbles = false;
  // fp16 scales (int schemes, for a kernel with KernelDesc::half_scales, when every scale is exactly an fp16 value,
  // as GGUF's Q4_0 / Q8_0 / Q5_0 / IQ4_NL d are): `scales` holds fp16 codes in the same order, 2 bytes a group and
  // column instead of 4 (Q4_0: 4.5 bits a weight, as ggml's blocks). derive_half_scales, int_forms.cpp.
  bool half_scales = false;
  // Split codes (int8 weights whose values span at most 2^split_bits, 2, 4, 5 or 6 bits, as GGUF's Q2_K, Q3_K, Q5_K /
  // Q6_K, for a kernel with KernelDesc::split_codes): q = w + split_zero in [0, 2^split_bits), qweight holding q's low
  // bits (nibbles in the int4 panel layout, or a 2-bit plane) and qhigh its high bits (cpp/src/moe/split_codes.h).
  int split_bits = 0;  // 0: int8 panels
  int split_zero = 0;
  AlignedBuffer qhigh;
  // Qword panels (int4 plain codes in groups of 32, for a kernel with KernelDesc::qword_panels: the AVX2 vpmaddubsw
  // kernel): the same bytes as the int4 panels in another order inside each step's halves (cpp/src/moe/qword_panels.h).
  bool qword_panels = false;
  const KernelDesc* kernel = nullptr;

  Scheme run_scheme() const { return moe_cpu::run_scheme(scheme, a16); }  // what runs: the kernels' scheme
  void set_codebook(const int8_t* cb);  // fills codebook and the derived fields
  // "int4", "int4+zeros", "int4+codebook", "int4+mins", "int8", "int8+mins", "fp8", "bf16";
  // "+act_order" when k_perm is set.
  std::string form() const;
  bool has_k_perm() const { return k_perm.size() > 0; }
  const int32_t* perm_row(int64_t e) const { return k_perm.as<int32_t>() + e * in_features; }

  // Length along K of one scale group (K for per channel, block_k for fp8).
  // (Inline: kernels call these per scale group, and an out-of-line call spills every vector register.)
  int64_t group_len() const { return group_size > 0 ? group_size : in_features; }
  int64_t num_groups() const { return group_len() > 0 ? ceil_div(in_features, group_len()) : 0; }  // along K
  int64_t padded_k() const;         // K rounded up to the layout's k-step
  int64_t num_blocks() const { return (out_features + 15) / 16; }  // 16-column panels per expert
  size_t nbytes() const {
    return qweight.size() + scales.size() + zeros.size() + mins.size() + k_perm.size() + imins.size() + dmins.size() +
           iscales.size() + dscales.size() + qhigh.size();
  }
  // Weight panel of (expert e, column block b).
  const uint8_t* panel(int64_t e, int64_t b) const { return qweight.data() + (e * num_blocks() + b) * panel_bytes(); }
  int64_t panel_bytes() const;      // bytes of one (expert, column block) panel (split codes: its low nibbles)
  // Index of (e, n, gi) in the scales / zeros arrays.
  int64_t scale_index(int64_t e, int64_t n, int64_t gi) const {
    return ((e * num_blocks() + n / 16) * num_groups() + gi) * 16 + n % 16;
  }
  // Scale and min of (e, n, gi), from the integer forms where they replaced the floats (int_forms.cpp).
  float scale(int64_t e, int64_t n, int64_t gi) const {
    return iscale_groups ? int_scale(e, n, gi) : half_scales ? half_scale(scale_index(e, n, gi)) : scales.as<float>()[scale_index(e, n, gi)];
  }
  float min(int64_t e, int64_t n, int64_t gi) const {
    if (!has_mins) return 0.f;
    return imin_groups ? int_min(e, n, gi) : mins.as<float>()[scale_index(e, n, gi)];
  }
  float int_scale(int64_t e, int64_t n, int64_t gi) const;
  float half_scale(int64_t i) const;  // scales[i] of fp16 scales
  float int_min(int64_t e, int64_t n, int64_t gi) const;
  int zero(int64_t e, int64_t n, int64_t gi) const;  // int schemes: stored, code_zero or 128
  // Raw stored codes of row (e, n): int4 u, int8 u = w + 128, fp8 code, bf16 bits (as uint16).
  void code_row(int64_t e, int64_t n, uint16_t* out) const;
  // Integer weight values of row (e, n), for int schemes: codebook[u], u - zero or u - 128. out[K].
  void int_row(int64_t e, int64_t n, int8_t* out) const;
  // Dequantized float weights of row (e, n), in packed channel order: out[K].
  void dequant_row(int64_t e, int64_t n, float* out) const;
};

// The integer forms of scales and mins (derive_int_*, float_*, set_kernel): cpp/src/moe/int_forms.h.

// Runs int weights with 16-bit activations (a16) or int8 ones, choosing the kernel again (no copy of
// the panels). ValueError for fp8 / bf16 weights, which have no such choice.
void set_a16(PackedExperts& p, bool a16);

// Sets the A8 activation block (0: per row; else 32, 64, 128 or 256 dividing K, and dividing the group length or
// a multiple of it); chooses the kernel again (integer mins need per-row scales). ValueError names the value and
// the valid choices: fp8 / bf16 / A16 weights, act-order weights, a block that does not fit K or the groups.
void set_act_block(PackedExperts& p, int64_t B);

// Sets p.k_perm (int schemes) from perm [E, K]: each row a permutation of [0, K); ValueError else.
// The weights must already be packed in permuted channel order (their groups contiguous).
void set_k_perm(PackedExperts& p, const int32_t* perm);

// ---- packing from pre-quantized arrays (what a checkpoint holds; cpp/src/moe/pack.cpp). All throw ValueError. ----
// int4 q: int8 in [-8,7] when zeros and codebook are null; else codes in [0,15] (uint8 bits), with
// zeros [E,N,G] in [0,15], or indices into codebook[16] (int8 values; not with zeros).
// mins [E,N,G] (optional, finite): subtracted after scaling (w = s * value - m).
// a16: run with 16-bit activations (int4_w4a16 / int8_w8a16) instead of int8 ones.
PackedExperts pack_int4(const int8_t* q, int64_t E, int64_t N, int64_t K, const float* scales,
                        int64_t group_size, const uint8_t* zeros, const int8_t* codebook = nullptr,
                        const float* mins = nullptr, bool a16 = false);
PackedExperts pack_int8(const int8_t* q, int64_t E, int64_t N, int64_t K, const float* scales,
                        int64_t group_size, const float* mins = nullptr, bool a16 = false);
PackedExperts pack_fp8(const uint8_t* codes, int64_t E, int64_t N, int64_t K, const float* scale_inv,
                       int64_t block_n, int64_t block_k);
PackedExperts pack_bf16(const uint16_t* bits, int64_t E, int64_t N, int64_t K);

// ---- quantization from float32 (DESIGN.md section 5). group_size: int4/int8 g or -1. ----
PackedExperts quantize_experts(const float* w, int64_t E, int64_t N, int64_t K, Scheme scheme,
                               int64_t group_size, int64_t block_n, int64_t block_k);

// Dequantized float32 [E,N,K], in the activations' channel order (k_perm undone).
void unpack(const PackedExperts& p, float* out);

// ---- files (format in cpp/src/moe/serialize.cpp and docs/formats.md) ----
void save_packed(const PackedExperts& p, const std::string& path);
// mmap: map the file read-only and use it in place (no copy); verify: check every section's CRC32.
PackedExperts load_packed(const std::string& path, bool mmap, bool verify);

}  // namespace moe_cpu
