// parallel.h — OpenMP parallel-for with exception capture (first exception is rethrown).
#pragma once
#include <cstdint>
#include <exception>
#include <mutex>

#include "moe_cpu/threads.h"

namespace moe_cpu {

template <class F>
void parallel_for(int64_t n, F&& body) {
  std::exception_ptr err;
  std::mutex mu;
  const int threads = get_num_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (n > 1 && threads > 1)
  for (int64_t i = 0; i < n; ++i) {
    try {
      body(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!err) err = std::current_exception();
    }
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace moe_cpu
