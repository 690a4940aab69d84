// parallel.h — parallel-for on moe_cpu's compute team (common/thread_pool.h; OpenMP's where pool_enabled() says
// so) with exception capture (the first exception is rethrown).
#pragma once
#include <cstdint>
#include <exception>
#include <mutex>

#include "common/thread_pool.h"
#include "moe_cpu/threads.h"

namespace moe_cpu {

template <class F>
void parallel_for(int64_t n, F&& body) {
  std::exception_ptr err;
  std::mutex mu;
  const int threads = get_num_threads();
  auto task = [&](int64_t i) {
    try {
      body(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!err) err = std::current_exception();
    }
  };
  if (pool_enabled()) {
    using Task = decltype(task);
    pool_run(n, threads, [](void* t, int64_t i) { (*static_cast<Task*>(t))(i); }, &task);
  } else {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (n > 1 && threads > 1)
    for (int64_t i = 0; i < n; ++i) task(i);
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace moe_cpu
