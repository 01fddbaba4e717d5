// PyTorch's own pools, timed with the loops of gpupool's side-by-side
// benchmark: what most users would pick instead of gpupool.
//
// Built on the GPU machine against the libtorch of its PyTorch install
// (scripts/torch-rows.sh); each part is a separate build, so that one whose
// API this PyTorch version lacks leaves the others running:
//
//   -DPART_DEVICE  the CUDA caching allocator: a round of 16 allocations
//                  (1 B - 64 KiB) on the thread's stream, then their frees
//                  (c10::cuda::CUDACachingAllocator::raw_alloc_with_stream,
//                  raw_delete);
//   -DPART_PINNED  the caching host allocator: the same round in pinned
//                  memory, each block's use recorded on the thread's stream
//                  before it is freed (what a copy from it needs);
//   -DPART_EVENTS  the event pool: get + put of one event.
//
// Each at 1 and 16 threads, every thread on its own stream from PyTorch's
// stream pool; ns per round (per op for events) of the median thread, the
// median of 7 repeats of about 100 ms. Prints markdown rows.

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#if defined(PART_DEVICE)
#include <c10/cuda/CUDACachingAllocator.h>
#elif defined(PART_PINNED)
#include <ATen/cuda/CachingHostAllocator.h>
#elif defined(PART_EVENTS)
#include EVENT_POOL_HEADER
#endif

namespace {

constexpr size_t kSizes[16] = {1,    24,   100,  512,   4096,  65536, 17, 3000,
                               8192, 40000, 64, 256, 1024, 12345, 50000, 2};
constexpr int kRepeats = 7;
constexpr double kTargetNs = 100e6;

using Clock = std::chrono::steady_clock;

// Runs `op` on `threads` threads together, each `n` times after a start
// line; the median thread's ns per op.
double per_op(int threads, long n, const std::function<void(int)>& setup,
              const std::function<void(int)>& op) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<double> ns(threads);
  std::vector<std::thread> crew;
  for (int t = 0; t < threads; ++t) {
    crew.emplace_back([&, t] {
      setup(t);
      for (int i = 0; i < 64; ++i) op(t);  // warm
      ready.fetch_add(1);
      while (!go.load()) {
      }
      auto start = Clock::now();
      for (long i = 0; i < n; ++i) op(t);
      ns[t] = std::chrono::duration<double, std::nano>(Clock::now() - start).count() / n;
    });
  }
  while (ready.load() < threads) {
  }
  go.store(true);
  for (auto& th : crew) th.join();
  std::sort(ns.begin(), ns.end());
  return ns[threads / 2];
}

double median_of_repeats(int threads, const std::function<void(int)>& setup,
                         const std::function<void(int)>& op) {
  double first = per_op(1, 200, setup, op);
  long n = std::max(16L, static_cast<long>(kTargetNs / std::max(first, 1.0)));
  std::vector<double> runs;
  for (int r = 0; r < kRepeats; ++r) runs.push_back(per_op(threads, n, setup, op));
  std::sort(runs.begin(), runs.end());
  return runs[kRepeats / 2];
}

}  // namespace

int main() {
  if (c10::cuda::device_count() < 1) {
    std::printf("skipped: no GPU\n");
    return 0;
  }
  c10::cuda::set_device(0);
  const int kThreads[] = {1, 16};
  std::vector<c10::cuda::CUDAStream> streams;
  for (int t = 0; t < 16; ++t) streams.push_back(c10::cuda::getStreamFromPool(false, 0));
  auto setup = [&](int) { c10::cuda::set_device(0); };
#if defined(PART_DEVICE)
  // What PyTorch's lazy CUDA initialisation does first for its allocator.
  c10::cuda::CUDACachingAllocator::init(c10::cuda::device_count());
  const char* row = "torch caching allocator: device round of 16";
  auto op = [&](int t) {
    void* p[16];
    cudaStream_t s = streams[t].stream();
    for (int i = 0; i < 16; ++i)
      p[i] = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(kSizes[i], s);
    for (int i = 0; i < 16; ++i) c10::cuda::CUDACachingAllocator::raw_delete(p[i]);
  };
#elif defined(PART_PINNED)
  const char* row = "torch caching host allocator: pinned round of 16";
  auto op = [&](int t) {
    std::vector<at::DataPtr> blocks;
    blocks.reserve(16);
#if PINNED_API == 1
    auto* host = at::cuda::getCachingHostAllocator();
#else
    auto* host = at::getHostAllocator(at::kCUDA);
#endif
    for (int i = 0; i < 16; ++i) blocks.push_back(host->allocate(kSizes[i]));
    for (auto& b : blocks) {
#if PINNED_API == 1
      at::cuda::CachingHostAllocator_recordEvent(b.get(), b.get_context(), streams[t]);
#else
      host->record_event(b.get(), b.get_context(), streams[t].unwrap());
#endif
    }
  };
#elif defined(PART_EVENTS)
  const char* row = "torch event pool: get+put";
  static at::cuda::CUDAEventPool pool;
  auto op = [&](int) {
    auto e = pool.get(0);
    asm volatile("" : : "r"(e.get()) : "memory");
  };
#endif
  for (int threads : kThreads) {
    double ns = median_of_repeats(threads, setup, op);
    std::printf("| %s | %d | %.1f |\n", row, threads, ns);
    std::fflush(stdout);
  }
  return 0;
}
