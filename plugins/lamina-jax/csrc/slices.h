// Work split over XLA's intra-op thread pool, shared by the CPU kernels.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace lamina {

// Runs work(lo, hi) over slices of `slice` items of [0, n), claimed from a shared counter by this
// thread and by helpers on XLA's intra-op pool. This thread works until none is left and then
// waits only for slices already claimed, so the call completes even if no helper ever runs; the
// counters are shared with the helpers so that one starting late finds nothing to do.
template <typename Work>
void InSlices(int64_t n, int64_t slice, xla::ffi::ThreadPool &pool, const Work &work) {
  struct Counters {
    std::atomic<int64_t> next{0}, done{0};
  };
  const int64_t slices = (n + slice - 1) / slice;
  auto counters = std::make_shared<Counters>();
  auto run = [=, &work](Counters &c) {
    for (int64_t i; (i = c.next.fetch_add(1)) < slices; c.done.fetch_add(1, std::memory_order_release))
      work(i * slice, std::min(n, (i + 1) * slice));
  };
  for (int64_t t = 1; t < std::min<int64_t>(pool.num_threads(), slices); ++t)
    pool.Schedule([counters, run] { run(*counters); });
  run(*counters);
  while (counters->done.load(std::memory_order_acquire) < slices) std::this_thread::yield();
}

}  // namespace lamina
