// Memory: device blocks between inaccessible pages with guard bytes checked after each launch,
// pinned host memory, everything all-ones (poisoned) until written, and the checked copies and
// memsets (at once, or queued on a stream in deferred mode).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda_emu_internal.h"

namespace ddp_emu {
namespace {

constexpr size_t kAlignment = 256;

// Device blocks: the checked all-ones bytes before the start (after the end: up to the next
// kAlignment), then an inaccessible page on either side of the mapping.
constexpr size_t kGuardBytes = 256;

size_t page_bytes() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

size_t round_up(size_t v, size_t unit) { return (v + unit - 1) / unit * unit; }

// Maps [PROT_NONE page][... guard | bytes | all-ones to a multiple of 256][PROT_NONE page] and
// returns the 256-aligned start, every byte up to the end page all-ones; nullptr when out of
// memory.
void* map_device_block(size_t bytes, Allocation& a) {
  const size_t page = page_bytes();
  const size_t span = round_up(bytes, kAlignment);
  const size_t inner = round_up(span + kGuardBytes, page);
  const size_t total = inner + 2 * page;
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return nullptr;
  char* b = static_cast<char*>(base);
  if (mprotect(b, page, PROT_NONE) != 0 || mprotect(b + page + inner, page, PROT_NONE) != 0) {
    munmap(base, total);
    return nullptr;
  }
  char* p = b + page + inner - span;
  std::memset(p - kGuardBytes, 0xFF, kGuardBytes + span);
  a.map = base;
  a.map_bytes = total;
  return p;
}

// Where the guard bytes around a device block were changed ("" if nowhere); restores them.
std::string check_guard(uintptr_t start, const Allocation& a) {
  unsigned char* p = reinterpret_cast<unsigned char*>(start);
  const size_t tail = round_up(a.bytes, kAlignment) - a.bytes;
  std::string where;
  for (size_t i = 0; i < kGuardBytes && where.empty(); ++i) {
    if (p[-static_cast<std::ptrdiff_t>(kGuardBytes - i)] != 0xFF)
      where = std::to_string(kGuardBytes - i) + " byte(s) before the start";
  }
  for (size_t i = 0; i < tail && where.empty(); ++i) {
    if (p[a.bytes + i] != 0xFF) where = "byte " + std::to_string(i) + " past the end";
  }
  if (where.empty()) return "";
  std::memset(p - kGuardBytes, 0xFF, kGuardBytes);
  std::memset(p + a.bytes, 0xFF, tail);
  char at[32];
  std::snprintf(at, sizeof at, "%p", static_cast<void*>(p));
  return "wrote outside a device allocation: " + where + " of the " + std::to_string(a.bytes) +
         "-byte block at " + at;
}

// The allocation holding address p, or end().
std::map<uintptr_t, Allocation>::const_iterator containing_locked(const Registry& r, uintptr_t p) {
  auto it = r.allocations.upper_bound(p);
  if (it == r.allocations.begin()) return r.allocations.end();
  --it;
  return p < it->first + std::max<size_t>(it->second.bytes, 1) ? it : r.allocations.end();
}

bool in_device_allocation_locked(const Registry& r, const void* ptr, size_t n) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto it = containing_locked(r, p);
  return it != r.allocations.end() && it->second.device && p + n <= it->first + it->second.bytes;
}

bool overlaps_device_locked(const Registry& r, const void* ptr, size_t n) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto it = containing_locked(r, p);
  if (it != r.allocations.end() && it->second.device) return true;
  for (it = r.allocations.upper_bound(p); it != r.allocations.end() && it->first < p + n; ++it) {
    if (it->second.device) return true;
  }
  return false;
}

cudaError_t allocate(void** ptr, size_t bytes, bool device) {
  if (!ptr) return record(cudaErrorInvalidValue);
  if (bytes == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  const cudaError_t unsafe = unsafe_call_locked(r);
  if (unsafe != cudaSuccess) return record(unsafe);
  if (device && bytes > kTotalGlobalMem - r.device_bytes) return record(cudaErrorMemoryAllocation);
  Allocation a{bytes, device};
  void* p = nullptr;
  // All-ones bytes read as NaN floats: memory a kernel reads before anything wrote it shows.
  if (device) {
    p = map_device_block(bytes, a);
    if (!p) return record(cudaErrorMemoryAllocation);
  } else {
    if (posix_memalign(&p, kAlignment, bytes) != 0 || !p) return record(cudaErrorMemoryAllocation);
    std::memset(p, 0xFF, bytes);
  }
  r.allocations[reinterpret_cast<uintptr_t>(p)] = a;
  if (device) r.device_bytes += bytes;
  *ptr = p;
  return cudaSuccess;
}

// Freeing is potentially unsafe during a capture (as allocating is), even of a null pointer.
cudaError_t unsafe_call() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  return record(unsafe_call_locked(r));
}

cudaError_t release(void* ptr, bool device) {
  const cudaError_t unsafe = unsafe_call();
  if (unsafe != cudaSuccess || !ptr) return unsafe;
  // CUDA's cudaFree and cudaFreeHost synchronise the device; queued work may use the memory.
  if (deferred()) run_streams(false);
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == r.allocations.end() || it->second.device != device) {
    return record(cudaErrorInvalidValue);
  }
  const Allocation a = it->second;
  r.allocations.erase(it);
  if (device) {
    r.device_bytes -= a.bytes;
    munmap(a.map, a.map_bytes);
  } else {
    std::free(ptr);
  }
  return cudaSuccess;
}

}  // namespace

// The first changed guard byte of any device block, as a message ("" if none).
std::string check_device_guards() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  std::string found;
  for (const auto& [start, a] : r.allocations) {
    if (!a.device) continue;
    std::string where = check_guard(start, a);
    if (found.empty()) found = std::move(where);
  }
  return found;
}

int64_t live_allocations() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  return static_cast<int64_t>(r.allocations.size());
}

bool is_device_memory(const void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return false;
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  const auto* q = static_cast<const unsigned char*>(p);
  return in_device_allocation_locked(r, q, 1) && in_device_allocation_locked(r, q + bytes - 1, 1);
}

}  // namespace ddp_emu

using ddp_emu::record;
using ddp_emu::registry;

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  DDP_EMU_COUNT_CALL();
  if (!free_bytes || !total_bytes) return record(cudaErrorInvalidValue);
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  *total_bytes = ddp_emu::kTotalGlobalMem;
  *free_bytes = ddp_emu::kTotalGlobalMem - r.device_bytes;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** dev_ptr, size_t size) {
  DDP_EMU_COUNT_CALL();
  return ddp_emu::allocate(dev_ptr, size, true);
}

cudaError_t cudaFree(void* dev_ptr) {
  DDP_EMU_COUNT_CALL();
  return ddp_emu::release(dev_ptr, true);
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  DDP_EMU_COUNT_CALL();
  return ddp_emu::allocate(ptr, size, false);
}

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  DDP_EMU_COUNT_CALL();
  if ((flags & ~(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined)) != 0) {
    return record(cudaErrorInvalidValue);
  }
  return ddp_emu::allocate(ptr, size, false);
}

cudaError_t cudaFreeHost(void* ptr) {
  DDP_EMU_COUNT_CALL();
  return ddp_emu::release(ptr, false);
}

cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  DDP_EMU_COUNT_CALL();
  if (ptr == nullptr || size == 0 || flags != cudaHostRegisterDefault) {
    return record(cudaErrorInvalidValue);
  }
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  const cudaError_t unsafe = ddp_emu::unsafe_call_locked(r);
  if (unsafe != cudaSuccess) return record(unsafe);
  if (!r.registered.emplace(reinterpret_cast<uintptr_t>(ptr), size).second) {
    return record(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* ptr) {
  DDP_EMU_COUNT_CALL();
  const cudaError_t unsafe = ddp_emu::unsafe_call();
  if (unsafe != cudaSuccess) return unsafe;
  // Synchronises the device in CUDA: queued copies may still use the memory.
  if (ddp_emu::deferred()) ddp_emu::run_streams(false);
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.registered.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
    return record(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

namespace {

struct CopySides {
  bool dst_device;
  bool src_device;
};

// Each side must be what the kind says: device memory lies wholly inside one cudaMalloc block,
// host memory touches none (a wrong direction or an overrun is a bug a real device hides).
bool copy_valid_locked(ddp_emu::Registry& r, void* dst, const void* src, size_t count,
                       cudaMemcpyKind kind, CopySides* sides) {
  auto side_ok = [&](const void* p, bool device_side) {
    return device_side ? ddp_emu::in_device_allocation_locked(r, p, count)
                       : !ddp_emu::overlaps_device_locked(r, p, count);
  };
  bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind == cudaMemcpyDefault) {
    dst_device = ddp_emu::overlaps_device_locked(r, dst, 1);
    src_device = ddp_emu::overlaps_device_locked(r, src, 1);
  }
  if (sides) *sides = CopySides{dst_device, src_device};
  return side_ok(dst, dst_device) && side_ok(src, src_device);
}

// Page-locked host memory: cudaMallocHost / cudaHostAlloc blocks and cudaHostRegister ranges.
bool pinned_locked(const ddp_emu::Registry& r, const void* ptr, size_t n) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto a = ddp_emu::containing_locked(r, p);
  if (a != r.allocations.end() && !a->second.device && p + n <= a->first + a->second.bytes) {
    return true;
  }
  auto it = r.registered.upper_bound(p);
  if (it == r.registered.begin()) return false;
  --it;
  return p + n <= it->first + it->second;
}

bool copy_args_ok(const void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return kind >= cudaMemcpyHostToHost && kind <= cudaMemcpyDefault && (count == 0 || (dst && src));
}

// Before a call that runs at once: on the legacy stream it is an error while a blocking stream
// captures; otherwise what the legacy stream orders before it runs first.
cudaError_t take_legacy_turn(bool legacy) {
  if (legacy) {
    ddp_emu::Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    const cudaError_t e = ddp_emu::legacy_stream_use_locked(r);
    if (e != cudaSuccess) return record(e);
  }
  ddp_emu::before_legacy_op();
  return cudaSuccess;
}

// A copy at once: the synchronous call, or an asynchronous one that runs now. On the legacy
// stream (the synchronous calls' stream) it is an error while a blocking stream captures.
cudaError_t copy_now(void* dst, const void* src, size_t count, cudaMemcpyKind kind, bool legacy) {
  if (!copy_args_ok(dst, src, count, kind)) return record(cudaErrorInvalidValue);
  if (count == 0) return cudaSuccess;
  if (const cudaError_t e = take_legacy_turn(legacy); e != cudaSuccess) return e;
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (!copy_valid_locked(r, dst, src, count, kind, nullptr)) return record(cudaErrorInvalidValue);
  std::memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t set_now(void* dev_ptr, int value, size_t count, bool legacy) {
  if (count == 0) return cudaSuccess;
  if (const cudaError_t e = take_legacy_turn(legacy); e != cudaSuccess) return e;
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (!dev_ptr || !ddp_emu::in_device_allocation_locked(r, dev_ptr, count)) {
    return record(cudaErrorInvalidValue);
  }
  std::memset(dev_ptr, value, count);
  return cudaSuccess;
}

// A copy node reads and writes the memory when the graph runs, through the pointers of the
// capture; memory freed since is a fault of that launch, not a crash.
cudaError_t capture_copy_locked(ddp_emu::Registry& r, cudaStream_t stream, void* dst,
                                const void* src, size_t count, cudaMemcpyKind kind) {
  if (!copy_valid_locked(r, dst, src, count, kind, nullptr)) return record(cudaErrorInvalidValue);
  return record(ddp_emu::capture_locked(stream, "cudaMemcpyAsync", [dst, src, count, kind] {
    ddp_emu::Registry& reg = registry();
    std::lock_guard<std::mutex> held(reg.mu);
    if (!copy_valid_locked(reg, dst, src, count, kind, nullptr)) {
      ddp_emu::async_fault(cudaErrorInvalidValue,
                           "a graph's cudaMemcpyAsync node: the memory of the capture is gone");
      return;
    }
    std::memmove(dst, src, count);
  }));
}

cudaError_t capture_set_locked(ddp_emu::Registry& r, cudaStream_t stream, void* dev_ptr, int value,
                               size_t count) {
  if (!dev_ptr || !ddp_emu::in_device_allocation_locked(r, dev_ptr, count)) {
    return record(cudaErrorInvalidValue);
  }
  return record(ddp_emu::capture_locked(stream, "cudaMemsetAsync", [dev_ptr, value, count] {
    ddp_emu::Registry& reg = registry();
    std::lock_guard<std::mutex> held(reg.mu);
    if (!ddp_emu::in_device_allocation_locked(reg, dev_ptr, count)) {
      ddp_emu::async_fault(cudaErrorInvalidValue,
                           "a graph's cudaMemsetAsync node: the memory of the capture is gone");
      return;
    }
    std::memset(dev_ptr, value, count);
  }));
}

}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  DDP_EMU_COUNT_CALL();
  return copy_now(dst, src, count, kind, true);
}

// Deferred mode on a created stream: checked now, copied when the stream runs it (see the
// header for which host memory is read when). A capturing stream records it.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  DDP_EMU_COUNT_CALL();
  if (!ddp_emu::stream_valid(stream)) return record(cudaErrorInvalidResourceHandle);
  if (stream) {
    ddp_emu::Registry& r = registry();
    std::unique_lock<std::mutex> lk(r.mu);
    if (r.streams.count(stream) > 0 && stream->capture) {
      if (!copy_args_ok(dst, src, count, kind)) return record(cudaErrorInvalidValue);
      if (count == 0) return cudaSuccess;
      return capture_copy_locked(r, stream, dst, src, count, kind);
    }
  }
  if (!stream || !ddp_emu::deferred()) return copy_now(dst, src, count, kind, !stream);
  if (!copy_args_ok(dst, src, count, kind)) return record(cudaErrorInvalidValue);
  if (count == 0) return cudaSuccess;
  ddp_emu::Registry& r = registry();
  std::unique_lock<std::mutex> lk(r.mu);
  if (r.streams.count(stream) == 0) return record(cudaErrorInvalidResourceHandle);
  CopySides sides{};
  if (!copy_valid_locked(r, dst, src, count, kind, &sides)) return record(cudaErrorInvalidValue);
  if (!sides.dst_device && !sides.src_device) {
    // Host to host is synchronous with the host, behind the stream's queued work.
    const uint64_t serial = stream->serial, target = stream->enqueued;
    lk.unlock();
    ddp_emu::run_until(stream, serial, target);
    std::memmove(dst, src, count);
    return cudaSuccess;
  }
  std::shared_ptr<std::vector<unsigned char>> staged;
  if (!sides.src_device && !pinned_locked(r, src, count)) {
    // Pageable source: the driver stages it before returning, so the caller may reuse it.
    const auto* p = static_cast<const unsigned char*>(src);
    staged = std::make_shared<std::vector<unsigned char>>(p, p + count);
  }
  // The memory checked now is still there when the copy runs: cudaFree, cudaFreeHost and
  // cudaHostUnregister run every queue first.
  ddp_emu::enqueue_locked(stream, [dst, src, count, staged] {
    std::memmove(dst, staged ? staged->data() : src, count);
  });
  return cudaSuccess;
}

cudaError_t cudaMemset(void* dev_ptr, int value, size_t count) {
  DDP_EMU_COUNT_CALL();
  return set_now(dev_ptr, value, count, true);
}

cudaError_t cudaMemsetAsync(void* dev_ptr, int value, size_t count, cudaStream_t stream) {
  DDP_EMU_COUNT_CALL();
  if (!ddp_emu::stream_valid(stream)) return record(cudaErrorInvalidResourceHandle);
  if (stream) {
    ddp_emu::Registry& r = registry();
    std::unique_lock<std::mutex> lk(r.mu);
    if (r.streams.count(stream) > 0 && stream->capture) {
      if (count == 0) return cudaSuccess;
      return capture_set_locked(r, stream, dev_ptr, value, count);
    }
  }
  if (!stream || !ddp_emu::deferred()) return set_now(dev_ptr, value, count, !stream);
  if (count == 0) return cudaSuccess;
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.streams.count(stream) == 0) return record(cudaErrorInvalidResourceHandle);
  if (!dev_ptr || !ddp_emu::in_device_allocation_locked(r, dev_ptr, count)) {
    return record(cudaErrorInvalidValue);
  }
  // Still device memory when it runs: cudaFree runs every queue first.
  ddp_emu::enqueue_locked(stream, [dev_ptr, value, count] { std::memset(dev_ptr, value, count); });
  return cudaSuccess;
}
