// align.cpp — rows grouped by expert (moe_align_block_size).
#include <algorithm>

#include "moe_cpu/errors.h"
#include "moe_cpu/fused_moe.h"

namespace moe_cpu {

AlignedRows moe_align_block_size(const int32_t* ids, int64_t numel, int64_t E, int64_t block) {
  if (E < 1) throw ValueError(msg("num_experts = ", E, " must be >= 1"));
  if (block < 1) throw ValueError(msg("block_size = ", block, " must be >= 1"));
  std::vector<int64_t> count(static_cast<size_t>(E), 0);
  for (int64_t s = 0; s < numel; ++s) {
    if (ids[s] >= E || ids[s] < -1)
      throw ValueError(msg("topk_ids flat index ", s, " = ", ids[s], " is out of range for ", E,
                           " experts (ids must be < num_experts, or -1 to skip)"));
    if (ids[s] >= 0) ++count[size_t(ids[s])];
  }
  AlignedRows out;
  std::vector<int64_t> start(static_cast<size_t>(E));
  int64_t total = 0;
  for (int64_t e = 0; e < E; ++e) {
    start[size_t(e)] = total;
    const int64_t padded = (count[size_t(e)] + block - 1) / block * block;
    for (int64_t b = 0; b < padded / block; ++b) out.expert_ids.push_back(int32_t(e));
    total += padded;
  }
  out.sorted_ids.assign(size_t(total), int32_t(numel));
  for (int64_t s = 0; s < numel; ++s)
    if (ids[s] >= 0) out.sorted_ids[size_t(start[size_t(ids[s])]++)] = int32_t(s);
  out.num_tokens_post_pad = total;
  return out;
}

}  // namespace moe_cpu
