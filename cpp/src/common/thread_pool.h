// thread_pool.h — moe_cpu's compute team (docs/threads.md): each calling thread has its own workers; a call
// hands out its tasks one at a time from one atomic counter, the caller takes tasks too, and the call returns
// when every task is done. A worker that the scheduler took away before it claimed a task holds nothing up:
// the others take the tasks it would have run (an OpenMP team's end-of-region barrier waits for every thread).
// Idle workers poll for spin_us microseconds, then sleep until the next call wakes them.
#pragma once
#include <cstdint>

#include "moe_cpu/threads.h"

namespace moe_cpu {

// Runs fn(ctx, i) for i in [0, n) on `threads` threads (the caller and threads - 1 workers of its own team);
// nested calls (from inside a task) run inline. Exceptions are fn's business (parallel_for catches them).
void pool_run(int64_t n, int threads, void (*fn)(void*, int64_t), void* ctx);

// If the calling thread runs on `cpu` and may run elsewhere, moves it to another of its allowed CPUs and allows
// them all again (a woken worker that landed on its busy caller's CPU; thread_pool.cpp). Linux; elsewhere a no-op.
void leave_cpu(int cpu);

// pool_enabled() / pool_spin_us() / compute_team(): moe_cpu/threads.h.

}  // namespace moe_cpu
