#include "crosstrain/core/memory_counter.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/alignment.h>
#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

namespace crosstrain {
namespace {

std::atomic<int64_t> g_in_use{0};
std::atomic<int64_t> g_peak{0};

// Each block carries its size in a header of one alignment unit, so that the plain deleter (also the raw one,
// which some kernels use) can count it back.
constexpr size_t kHeader = c10::gAlignment;

void counted_free(void* data) {
  if (!data) return;
  char* block = static_cast<char*>(data) - kHeader;
  int64_t bytes = 0;
  std::memcpy(&bytes, block, sizeof(bytes));
  g_in_use.fetch_sub(bytes, std::memory_order_relaxed);
  c10::free_cpu(block);
}

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) const override {
    const auto bytes = static_cast<int64_t>(n);
    char* block = static_cast<char*>(c10::alloc_cpu(n + kHeader));
    std::memcpy(block, &bytes, sizeof(bytes));
    const int64_t now = g_in_use.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    int64_t peak = g_peak.load(std::memory_order_relaxed);
    while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    void* data = block + kHeader;
    return {data, data, &counted_free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counted_free; }
};

std::once_flag g_once;
std::atomic<bool> g_installed{false};

}  // namespace

void install_memory_counter() {
  std::call_once(g_once, [] {
    // Lives as long as the process: tensors may be freed during static destruction.
    static CountingAllocator* counting = new CountingAllocator();
    c10::SetCPUAllocator(counting, /*priority=*/1);
    g_installed = true;
  });
}

bool memory_counter_installed() { return g_installed; }

int64_t counted_bytes_in_use() { return g_in_use.load(std::memory_order_relaxed); }

MemoryWatermark::MemoryWatermark() { reset(); }

void MemoryWatermark::reset() {
  baseline_ = g_in_use.load(std::memory_order_relaxed);
  g_peak.store(baseline_, std::memory_order_relaxed);
}

int64_t MemoryWatermark::peak_above_baseline() const {
  return std::max<int64_t>(0, g_peak.load(std::memory_order_relaxed) - baseline_);
}

}  // namespace crosstrain
