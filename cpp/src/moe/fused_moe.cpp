// fused_moe.cpp — orchestration of the fused MoE pass, chunk by chunk of tokens: route rows by
// expert, quantize each token's activations once, GEMM1 as (expert, column tile) tasks with bias,
// activation and GEMM2's activation quantization in their epilogue, GEMM2 tasks with bias and
// router weight in their epilogue, then each token's top-k rows summed in fp32 in the order
// j = 0..k-1 and rounded once to the output dtype. Every output element is produced by one task
// in a fixed order, so the result does not depend on the thread count.
#include "moe_cpu/fused_moe.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "common/layout.h"
#include "common/numeric.h"
#include "common/parallel.h"
#include "dispatch/registry.h"
#include "moe/act_buffer.h"
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
  check_scheme_pair(w13, w2, "fused_experts");
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
  check_finite_hidden_states(a.x, a.dtype, a.M, a.H);
}

}  // namespace

void check_finite_hidden_states(const void* x, DType dtype, int64_t M, int64_t H) {
  for (int64_t i = 0; i < M * H; ++i)
    if (!std::isfinite(load(x, dtype, i)))
      throw ValueError(msg("hidden_states[", i / H, ", ", i % H, "] is not finite (", load(x, dtype, i), ")"));
}

void check_scheme_pair(const PackedExperts& w13, const PackedExperts& w2, const char* what) {
  const Scheme s13 = w13.run_scheme(), s2 = w2.run_scheme();
  if (is_int_scheme(s13) && is_int_scheme(s2) && w13.a16 != w2.a16)
    throw ValueError(msg("w13 runs ", scheme_name(s13), " but w2 ", scheme_name(s2), ": one keeps 16-bit activations, the "
                         "other quantizes them to int8; ", what, " takes both as A16 (int4_w4a16 / int8_w8a16) or both as A8"));
  if (s13 != s2 && !(is_int_scheme(s13) && is_int_scheme(s2)))
    throw ValueError(msg("w13 is packed as ", scheme_name(s13), " but w2 as ", scheme_name(s2), "; ", what,
                         " takes the same scheme for both, or two int schemes with the same activations "
                         "(int4_w4a8 / int8_w8a8, or int4_w4a16 / int8_w8a16) in any pair"));
}

namespace {

constexpr int64_t kMinTileBlocks = 4;         // 16-column blocks per GEMM task, at least
constexpr int64_t kTileAlign = 8;             // tiles wider than that: a multiple of the widest decode tile
std::atomic<int64_t> g_scratch_bytes{int64_t(96) << 20};  // set_scratch_limit

// Tasks per thread: 16 balance experts of unequal rows; where every expert has at most kStreamRows rows (decode),
// the GEMMs stream weights and each task's first lines wait on DRAM (~1.3 us a task on a Zen 5), so 4 longer runs.
constexpr int64_t kTasksPerThread = 16, kStreamTasksPerThread = 4, kStreamRows = 4;

struct Task {
  int64_t e, b0, b1;
};
// Whether every expert has at most kStreamRows rows (decode): the GEMMs stream long weight runs per task, and
// GEMM2's tasks follow GEMM1's in one team call.
bool streams(const std::vector<int64_t>& begin) {
  for (size_t e = 0; e + 1 < begin.size(); ++e)
    if (begin[e + 1] - begin[e] > kStreamRows) return false;
  return true;
}
// (expert, column tile) tasks for experts that have rows. Tiles are as wide as keeps the tasks per thread above
// (at least kMinTileBlocks blocks): few rows (decode) then stream long weight runs per task.
std::vector<Task> tasks_for(const std::vector<int64_t>& begin, int64_t blocks) {
  int64_t experts = 0;
  for (size_t e = 0; e + 1 < begin.size(); ++e) experts += begin[e + 1] > begin[e];
  const int64_t per = streams(begin) ? kStreamTasksPerThread : kTasksPerThread;
  const int64_t want = per * int64_t(get_num_threads());
  int64_t tile = std::max(kMinTileBlocks, (experts * blocks + want - 1) / std::max<int64_t>(want, 1));
  if (tile > kTileAlign) tile = (tile + kTileAlign - 1) / kTileAlign * kTileAlign;
  std::vector<Task> t;
  for (size_t e = 0; e + 1 < begin.size(); ++e)
    if (begin[e + 1] > begin[e])
      for (int64_t b = 0; b < blocks; b += tile) t.push_back({int64_t(e), b, std::min(blocks, b + tile)});
  return t;
}

// out[p, :] = GEMM of row p (expert order; row p reads activation row row_idx[p]) with w, as
// (expert, column tile) tasks. Each task then runs epilogue(e, p, out + p * N, n0, n1) on each of
// its rows p for its columns [n0, n1), while the tile is still in cache.
template <class Epilogue>
void gemm_task(const PackedExperts& w, const Task& t, const std::vector<int64_t>& begin, const ActBuffer& acts,
               const int32_t* row_idx, float* out, Epilogue& epilogue) {
  const int64_t N = w.out_features, p0 = begin[size_t(t.e)], p1 = begin[size_t(t.e + 1)];
  w.kernel->gemm(w, t.e, t.b0, t.b1, acts.view(row_idx + p0, p1 - p0), out + p0 * N + 16 * t.b0, N);
  const int64_t n0 = 16 * t.b0, n1 = std::min(N, 16 * t.b1);
  for (int64_t p = p0; p < p1; ++p) epilogue(t.e, p, out + p * N, n0, n1);
}
template <class Epilogue>
void run_gemm(const PackedExperts& w, const std::vector<int64_t>& begin, const ActBuffer& acts,
              const int32_t* row_idx, float* out, Epilogue&& epilogue) {
  const std::vector<Task> tasks = tasks_for(begin, w.num_blocks());
  parallel_for(int64_t(tasks.size()), [&](int64_t i) { gemm_task(w, tasks[size_t(i)], begin, acts, row_idx, out, epilogue); });
}

inline void spin_pause() {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// A per-worker fp32 buffer of n floats (thread-local, reused); `slot` 0 for rows, 1 for GEMM1
// tiles, so that both can be live at once.
float* worker_buffer(int64_t n, int slot = 0) {
  thread_local std::vector<float> buf[2];
  if (buf[slot].size() < size_t(n)) buf[slot].resize(size_t(n));
  return buf[slot].data();
}

// 1 when x is inf or NaN (exponent bits all ones): an integer test that vectorizes.
inline uint32_t non_finite(float x) { return uint32_t((float_to_bits(x) & 0x7f800000u) == 0x7f800000u); }

// A bias is checked where a task adds it (only routed experts' biases are read): this names the first
// non-finite value of expert e's row (n values).
[[noreturn]] void bad_bias(const char* name, const float* row, int64_t n, int64_t e) {
  int64_t i = 0;
  while (i + 1 < n && std::isfinite(row[i])) ++i;
  throw ValueError(msg(name, "[", e, ", ", i, "] = ", row[i], " is not finite (expert ", e, " is routed to)"));
}

constexpr int64_t kPieceBytes = 192 << 10;  // a GEMM1 piece's gate + up tile stays in L2

// GEMM1's rows of one task in expert order, for a kernel that would copy scattered rows on each call
// (KernelDesc::gathers_rows: once per piece and gate / up); the view reads this worker's copy.
ActRows task_rows(const PackedExperts& w, const ActBuffer& src, const int32_t* idx, int64_t R) {
  if (!w.kernel->gathers_rows || !w.kernel->gathers_rows(w, R)) return src.view(idx, R);
  bool consecutive = true;
  for (int64_t r = 1; r < R && consecutive; ++r) consecutive = idx[r] == idx[0] + r;
  if (consecutive) return src.view(idx, R);
  thread_local ActBuffer rows;
  thread_local std::vector<int32_t> iota;
  rows.reset(w, R);
  rows.copy_rows(src, idx, R);
  for (int64_t r = int64_t(iota.size()); r < R; ++r) iota.push_back(int32_t(r));
  return rows.view(iota.data(), R);
}

// GEMM1 with the activation and GEMM2's activation quantization in its epilogue, as (expert,
// activation column tile) tasks. A task computes the gate and up columns of its tile in pieces
// that fit L2, adds the bias and applies the activation to each piece. bf16 / fp8: it writes the
// bf16 GEMM2 activations. Int schemes: it writes the fp32 values to h [P, I] and each row's amax
// over the piece; the task that finishes an expert's last tile quantizes that expert's rows.
// Then (next_n > 0) next_n more tasks in the same team call: next(j, e_ready), GEMM2's tasks on decode, whose
// e_ready(e) waits until expert e's GEMM2 activations are written (false: a GEMM1 task failed). Tasks are claimed in
// index order, so a GEMM2 task waits only on GEMM1 tasks already running; the barrier between the two GEMMs goes,
// and a thread that ends its GEMM1 share streams GEMM2's weights instead of waiting for the slowest.
template <class Next>
void run_gemm1(const FusedMoeArgs& a, const std::vector<int64_t>& begin, const ActBuffer& a1,
               const int32_t* a1_idx, ActBuffer& a2, float* h, std::vector<uint32_t>& amax, int64_t next_n,
               Next&& next) {
  const PackedExperts& w = *a.w13;
  const int64_t E = w.num_experts, I = a.w2->in_features, N1 = 2 * I;
  const bool il = gate_up_interleaved(a.activation), int_scheme = is_int_scheme(w.scheme);
  const std::vector<Task> tasks = tasks_for(begin, (I + 15) / 16);
  const int64_t T = tasks.empty() ? 0 : (tasks[0].b1 - tasks[0].b0);  // tile width in blocks
  const int64_t tiles = T ? ((I + 15) / 16 + T - 1) / T : 0;         // tiles per expert
  std::unique_ptr<std::atomic<int64_t>[]> left(new std::atomic<int64_t>[size_t(E)]);
  std::unique_ptr<std::atomic<int>[]> ready(new std::atomic<int>[size_t(E)]);
  for (int64_t e = 0; e < E; ++e) left[size_t(e)].store(tiles, std::memory_order_relaxed), ready[size_t(e)].store(0, std::memory_order_relaxed);
  std::atomic<bool> failed{false};
  if (int_scheme) amax.assign(size_t(begin[size_t(E)] * tiles), 0);
  const int64_t n1 = int64_t(tasks.size());
  const auto e_ready = [&](int64_t e) {
    for (int64_t spins = 0; !ready[size_t(e)].load(std::memory_order_acquire); ++spins) {
      if (failed.load(std::memory_order_relaxed)) return false;
      if (spins < 4096) spin_pause();
      else std::this_thread::yield();   // the GEMM1 task's thread may have been preempted
    }
    return true;
  };
  const auto task = [&](int64_t i) {
    const Task& t = tasks[size_t(i)];
    const int64_t p0 = begin[size_t(t.e)], R = begin[size_t(t.e + 1)] - p0, ti = t.b0 / T;
    const ActRows rows = task_rows(w, a1, a1_idx + p0, R);
    const float* bias = a.w13_bias ? a.w13_bias + t.e * N1 : nullptr;
    const int64_t n_end = std::min(I, 16 * t.b1);
    const int64_t piece = std::max<int64_t>(64, kPieceBytes / (8 * R) / 64 * 64);
    for (int64_t s0 = 16 * t.b0; s0 < n_end; s0 += piece) {
      const int64_t n = std::min(n_end, s0 + piece) - s0;
      // Gate value i of row r at g[r * ld + i * st] (column gc(i) of w13), up value at u[...] (uc(i)).
      float *g, *u;
      int64_t ld, st, gc0, uc0;
      if (il) {  // columns [2 s0, 2 (s0 + n)) in one run: gate 2i, up 2i + 1
        const int64_t b0 = 2 * s0 / 16, b1 = (2 * (s0 + n) + 15) / 16;
        ld = 16 * (b1 - b0), st = 2, gc0 = 2 * s0, uc0 = 2 * s0 + 1;
        g = worker_buffer(R * ld, 1), u = g + 1;
        w.kernel->gemm(w, t.e, b0, b1, rows, g, ld);
      } else {  // gate columns [s0, s0 + n), up columns I + [s0, s0 + n) (blocks may start before)
        const int64_t gb0 = s0 / 16, gb1 = (s0 + n + 15) / 16, ub0 = (I + s0) / 16, ub1 = (I + s0 + n + 15) / 16;
        const int64_t gw = 16 * (gb1 - gb0);
        ld = gw + 16 * (ub1 - ub0), st = 1, gc0 = s0, uc0 = I + s0;
        g = worker_buffer(R * ld, 1), u = g + gw + (I + s0 - 16 * ub0);
        w.kernel->gemm(w, t.e, gb0, gb1, rows, g, ld);
        w.kernel->gemm(w, t.e, ub0, ub1, rows, g + gw, ld);
      }
      if (bias) {
        uint32_t bad = 0;
        for (int64_t j = 0; j < n; ++j) bad |= non_finite(bias[gc0 + j * st]) | non_finite(bias[uc0 + j * st]);
        if (bad) bad_bias("w13_bias", bias, N1, t.e);
      }
      for (int64_t r = 0; r < R; ++r) {
        float *gr = g + r * ld, *ur = u + r * ld;
        if (bias)
          for (int64_t j = 0; j < n; ++j) gr[j * st] += bias[gc0 + j * st], ur[j * st] += bias[uc0 + j * st];
        const int64_t p = p0 + r;
        if (!int_scheme) {
          float* out = worker_buffer(n);
          gated_activation(a.activation, gr, ur, st, n, out);
          a2.set_float_span(p, s0, out, n);
          continue;
        }
        float* out = h + p * I + s0;
        gated_activation(a.activation, gr, ur, st, n, out);
        uint32_t m = amax[size_t(p * tiles + ti)];  // max of |value| bits: NaN and inf order above
        for (int64_t j = 0; j < n; ++j) m = std::max(m, float_to_bits(out[j]) & 0x7fffffffu);
        amax[size_t(p * tiles + ti)] = m;
      }
    }
    if (left[size_t(t.e)].fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    if (int_scheme)
      for (int64_t p = p0; p < p0 + R; ++p) {  // the expert's last tile: quantize its rows
        uint32_t m = 0;
        for (int64_t j = 0; j < tiles; ++j) m = std::max(m, amax[size_t(p * tiles + j)]);
        if (m > 0x7f7fffffu)
          throw ValueError(msg("non-finite activation output cannot be quantized to ", a2.a16 ? "int16" : "int8",
                               " (check the inputs and weights for overflow)"));
        a2.set_int_row(p, h + p * I, bits_to_float(m));
      }
    ready[size_t(t.e)].store(1, std::memory_order_release);
  };
  parallel_for(n1 + next_n, [&](int64_t i) {
    if (i >= n1) return next(i - n1, e_ready);
    try {
      task(i);
    } catch (...) {
      failed.store(true, std::memory_order_relaxed);
      throw;
    }
  });
}

// Per-calling-thread scratch, kept between calls so that large buffers are not faulted in anew.
// c holds GEMM1's activations [P, I] (int schemes), then (once quantized) GEMM2's output [P, H], which on decode
// goes to c2 instead (GEMM2's tasks run while other experts' GEMM1 tasks still write c);
// amax the int schemes' per (row, GEMM1 tile) amax bits.
struct Scratch {
  ActBuffer a1, a2, ap;  // ap: GEMM1 or GEMM2 activations per routed row in each expert's k_perm order
  std::vector<float> c, c2;  // c2: GEMM2's output on decode, where c still holds GEMM1's
  std::vector<uint32_t> amax;
};

// One chunk of tokens [m0, m1): every phase runs over all experts before the next one starts, but on decode GEMM2's
// tasks, which start per expert as soon as its activations are written (run_gemm1).
void run_chunk(const FusedMoeArgs& a, const std::vector<int32_t>& ids, int64_t m0, int64_t m1) {
  thread_local Scratch scratch;
  ActBuffer &a1 = scratch.a1, &a2 = scratch.a2;
  std::vector<float>& c = scratch.c;
  const PackedExperts &w13 = *a.w13, &w2 = *a.w2;
  const int64_t E = w13.num_experts, H = a.H, I = w2.in_features, k = a.k;
  // 1. Rows by expert: position p of slot s (slots are m*k + j, local to the chunk).
  const int64_t S = (m1 - m0) * k;
  std::vector<int64_t> begin(static_cast<size_t>(E + 1), 0);
  for (int64_t s = 0; s < S; ++s)
    if (ids[size_t(m0 * k + s)] >= 0) ++begin[size_t(ids[size_t(m0 * k + s)] + 1)];
  for (int64_t e = 0; e < E; ++e) begin[size_t(e + 1)] += begin[size_t(e)];
  const int64_t P = begin[size_t(E)];  // may be 0: every id skipped, the output rows are zeros
  std::vector<int32_t> slot_of(static_cast<size_t>(P)), pos_of(static_cast<size_t>(S), -1);
  {
    std::vector<int64_t> next(begin.begin(), begin.end() - 1);
    for (int64_t s = 0; s < S; ++s) {
      const int32_t e = ids[size_t(m0 * k + s)];
      if (e < 0) continue;
      const int64_t p = next[size_t(e)]++;
      slot_of[size_t(p)] = int32_t(s), pos_of[size_t(s)] = int32_t(p);
    }
  }
  // 2. GEMM1 activations: once per token, or per (token, expert) row when the router weight scales the input.
  const bool per_slot = a.apply_router_weight_on_input;
  a1.reset(w13, per_slot ? S : m1 - m0);
  parallel_for(per_slot ? S : m1 - m0, [&](int64_t r) {
    const int64_t m = m0 + (per_slot ? r / k : r);
    const float wr = per_slot ? a.topk_weights[m0 * k + r] : 1.f;
    float* row = worker_buffer(H);
    for (int64_t h = 0; h < H; ++h) row[h] = load(a.x, a.dtype, m * H + h) * wr;
    a1.set_row(r, row, "hidden state");
  });
  std::vector<int32_t> a1_idx(static_cast<size_t>(P)), iota(static_cast<size_t>(P));
  for (int64_t p = 0; p < P; ++p) a1_idx[size_t(p)] = per_slot ? slot_of[size_t(p)] : slot_of[size_t(p)] / int32_t(k), iota[size_t(p)] = int32_t(p);
  // Act-order weights: each routed row gathers its activation codes in its expert's channel order.
  std::vector<int32_t> expert_of;
  if (w13.has_k_perm() || w2.has_k_perm()) {
    expert_of.resize(size_t(P));
    for (int64_t e = 0; e < E; ++e)
      for (int64_t p = begin[size_t(e)]; p < begin[size_t(e + 1)]; ++p) expert_of[size_t(p)] = int32_t(e);
  }
  ActBuffer& ap = scratch.ap;  // (a reference: the workers must not name their own thread_local scratch)
  std::vector<int64_t> runs;   // first rows of runs of up to 8 rows of one expert
  const auto permuted = [&](const PackedExperts& w, const ActBuffer& src, const int32_t* idx) -> const ActBuffer& {
    ap.reset(w, P);
    if (runs.empty())
      for (int64_t e = 0; e < E; ++e)
        for (int64_t p = begin[size_t(e)]; p < begin[size_t(e + 1)]; p += 8) runs.push_back(p);
    const auto run = [&](int64_t i) {
      const int64_t p = runs[size_t(i)], e = expert_of[size_t(p)], n = std::min<int64_t>(8, begin[size_t(e + 1)] - p);
      const int32_t* perm = w.perm_row(e);
      if (n == 8) return ap.set_perm_rows<8>(p, src, idx + p, perm);
      for (int64_t r = 0; r < n; ++r) ap.set_perm_rows<1>(p + r, src, idx + p + r, perm);
    };
    if (P * w.in_features < (int64_t(1) << 16)) {  // decode: a few rows, cheaper than waking the pool
      // The experts' perm rows are cold: ask for all of them at once (bandwidth, not one miss at a time).
      for (const int64_t p : runs) {
        const char* pr = reinterpret_cast<const char*>(w.perm_row(expert_of[size_t(p)]));
        for (int64_t off = 0; off < w.in_features * 4; off += 64) __builtin_prefetch(pr + off);
      }
      for (int64_t i = 0; i < int64_t(runs.size()); ++i) run(i);
    } else {
      parallel_for(int64_t(runs.size()), run);
    }
    return ap;
  };
  const bool perm1 = w13.has_k_perm() && P > 0;
  const ActBuffer& g1 = perm1 ? permuted(w13, a1, a1_idx.data()) : a1;
  // 3. GEMM1 with the activation and the GEMM2 activations in its epilogue (int schemes: the fp32
  // activations go to c [P, I] first).
  c.resize(static_cast<size_t>(P * std::max(I, H)));
  a2.reset(w2, P);
  // 4. GEMM2 into c [P, H] (GEMM1's output is dead: a2 holds what GEMM2 reads), or on decode into c2 (below).
  float* c2 = c.data();
  // GEMM2 epilogue: (+ bias) * router weight (1 when it scaled the input).
  const auto epilogue2 = [&](int64_t e, int64_t p, float* y, int64_t n0, int64_t n1) {
    const float wr = a.apply_router_weight_on_input ? 1.f : a.topk_weights[m0 * k + slot_of[size_t(p)]];
    const float* bias = a.w2_bias ? a.w2_bias + e * H : nullptr;
    if (bias) {
      uint32_t bad = 0;
      for (int64_t n = n0; n < n1; ++n) y[n] = (y[n] + bias[n]) * wr, bad |= non_finite(bias[n]);
      if (bad) bad_bias("w2_bias", bias, H, e);
    } else {
      for (int64_t n = n0; n < n1; ++n) y[n] *= wr;
    }
  };
  const int32_t* idx1 = perm1 ? iota.data() : a1_idx.data();
  if (!w2.has_k_perm() && streams(begin)) {  // decode: GEMM2's tasks in GEMM1's team call (its rows: P <= E * 4)
    // c holds GEMM1's fp32 activations [P, I] (int schemes) until each expert is quantized, so GEMM2 writes
    // its [P, H] rows to a buffer of its own.
    std::vector<float>& c2buf = scratch.c2;
    c2buf.resize(size_t(P * H));
    c2 = c2buf.data();
    const std::vector<Task> tasks2 = tasks_for(begin, w2.num_blocks());
    run_gemm1(a, begin, g1, idx1, a2, c.data(), scratch.amax, int64_t(tasks2.size()), [&](int64_t j, auto& e_ready) {
      const Task& t = tasks2[size_t(j)];
      if (e_ready(t.e)) gemm_task(w2, t, begin, a2, iota.data(), c2, epilogue2);
    });
  } else {
    run_gemm1(a, begin, g1, idx1, a2, c.data(), scratch.amax, 0, [](int64_t, auto&) {});
    const ActBuffer& g2 = w2.has_k_perm() && P > 0 ? permuted(w2, a2, iota.data()) : a2;
    run_gemm(w2, begin, g2, iota.data(), c2, epilogue2);
  }
  // 5. Per token: its rows summed over j in order, rounded once.
  parallel_for(m1 - m0, [&](int64_t r) {
    const int64_t m = m0 + r;
    float* acc = worker_buffer(H);
    std::fill(acc, acc + H, 0.f);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t p = pos_of[size_t(r * k + j)];
      if (p < 0) continue;
      const float* y = c2 + int64_t(p) * H;
      for (int64_t h = 0; h < H; ++h) acc[h] += y[h];
    }
    const DType out_type = a.out_f32 ? DType::kF32 : a.dtype;
    for (int64_t h = 0; h < H; ++h) store(a.out, out_type, m * H + h, acc[h]);
  });
}

}  // namespace

void set_scratch_limit(int64_t bytes) {
  if (bytes < 1) throw ValueError(msg("scratch limit = ", bytes, " bytes must be >= 1"));
  g_scratch_bytes = bytes;
}
int64_t get_scratch_limit() { return g_scratch_bytes.load(); }

void check_fused_experts(const FusedMoeArgs& a) {
  check_args(a);
  if (a.M > 0) local_ids(a, a.w13->num_experts);
}

void fused_experts(const FusedMoeArgs& a) {
  check_args(a);
  if (a.M == 0) return;
  const std::vector<int32_t> ids = local_ids(a, a.w13->num_experts);
  // Tokens per chunk: bounded scratch. Per token: k rows of c (fp32, max(I, H)), k GEMM2 activation
  // rows (I codes or bf16) with their GEMM1 tiles' amax, 1 (or k, router weight on input) GEMM1
  // activation rows (H), and per worker a row of a GEMM1 piece (fp32, at most 2 * 64 + 32 columns,
  // when an expert's rows outgrow kPieceBytes).
  const auto act_row = [](const PackedExperts& w) {  // ActBuffer bytes per row
    const bool blocks = !w.a16 && w.act_block;  // A8 blocks: code sums and block scales per piece
    return is_int_scheme(w.scheme) ? (w.a16 ? 2 : 1) * w.padded_k() + 4 + (blocks ? 8 : 4) * w.num_groups() * act_pieces(w)
                                   : (w.kernel->f32_acts ? 4 : 2) * w.padded_k();
  };
  const int64_t I = a.w2->in_features, a1_rows = a.apply_router_weight_on_input ? a.k : 1;
  const int64_t amax_row = is_int_scheme(a.w2->scheme) ? 4 * (((I + 15) / 16 + kMinTileBlocks - 1) / kMinTileBlocks) : 0;
  const int64_t per_token = a.k * std::max(I, a.H) * 4 + a.k * (act_row(*a.w2) + amax_row) +
                            a1_rows * act_row(*a.w13) + (a.w13->has_k_perm() ? a.k * act_row(*a.w13) : 0) +
                            (a.w2->has_k_perm() ? a.k * act_row(*a.w2) : 0) +
                            get_num_threads() * (2 * 64 + 32) * 4;
  const int64_t most = std::max<int64_t>(1, std::min<int64_t>(a.M, get_scratch_limit() / std::max<int64_t>(1, per_token)));
  const int64_t chunks = (a.M + most - 1) / most, chunk = (a.M + chunks - 1) / chunks;  // equal chunks
  for (int64_t m0 = 0; m0 < a.M; m0 += chunk) run_chunk(a, ids, m0, std::min(a.M, m0 + chunk));
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
  FusedMoeArgs a;  // one expert, weight 1, fp32 output: the shared expert's rows, unrounded
  a.x = x, a.dtype = dtype, a.M = M, a.H = H, a.w13 = &w13, a.w2 = &w2;
  a.topk_weights = ones.data(), a.topk_ids = ids.data(), a.k = 1;
  a.out = shared.data(), a.out_f32 = true;
  fused_experts(a);
  const float scale = float(routed_scaling_factor);
  for (int64_t i = 0; i < M * H; ++i)
    store(out, dtype, i, load(fused_out, dtype, i) * scale + shared[size_t(i)]);
}

}  // namespace moe_cpu
