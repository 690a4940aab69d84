// align.cpp — rows grouped by expert (moe_align_block_size).
#include <algorithm>
#include <limits>

#include "moe_cpu/errors.h"
#include "moe_cpu/fused_moe.h"

namespace moe_cpu {

AlignedRows moe_align_block_size(const int32_t* ids, int64_t numel, int64_t E, int64_t block) {
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  if (E < 1 || E > kInt32Max)
    throw ValueError(msg("num_experts = ", E, " must be in [1, 2^31 - 1] (expert ids are int32)"));
  if (block < 1) throw ValueError(msg("block_size = ", block, " must be >= 1"));
  if (numel >= kInt32Max)
    throw ValueError(msg("topk_ids has ", numel, " slots; at most 2^31 - 2 (slot indices are int32)"));
  int64_t used = 0;  // 1 + the largest id: the experts past it have no rows (and no blocks)
  for (int64_t s = 0; s < numel; ++s) {
    if (ids[s] >= E || ids[s] < -1)
      throw ValueError(msg("topk_ids flat index ", s, " = ", ids[s], " is out of range for ", E,
                           " experts (ids must be < num_experts, or -1 to skip)"));
    used = std::max<int64_t>(used, int64_t(ids[s]) + 1);
  }
  std::vector<int64_t> count(static_cast<size_t>(used), 0), start(static_cast<size_t>(used));
  for (int64_t s = 0; s < numel; ++s)
    if (ids[s] >= 0) ++count[size_t(ids[s])];
  AlignedRows out;
  int64_t total = 0;
  for (int64_t e = 0; e < used; ++e) {
    start[size_t(e)] = total;
    if (count[size_t(e)] == 0) continue;
    // checked before it is formed: block may be near int64's limit
    const int64_t blocks = ceil_div(count[size_t(e)], block);
    if (block > kInt32Max || blocks * block > kInt32Max - total)
      throw ValueError(msg("num_tokens_post_pad (each expert's rows padded to block_size = ", block,
                           ") does not fit int32"));
    out.expert_ids.insert(out.expert_ids.end(), size_t(blocks), int32_t(e));
    total += blocks * block;
  }
  out.sorted_ids.assign(size_t(total), int32_t(numel));
  for (int64_t s = 0; s < numel; ++s)
    if (ids[s] >= 0) out.sorted_ids[size_t(start[size_t(ids[s])]++)] = int32_t(s);
  out.num_tokens_post_pad = total;
  return out;
}

}  // namespace moe_cpu
