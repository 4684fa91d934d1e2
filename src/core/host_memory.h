// Where host buffers that travel to a device live: ordinary memory, or memory a device reads
// directly (CUDA's pinned host memory, whose copies to the device are asynchronous DMA). The
// loader assembles batches in the memory its context names, so an upload needs no staging copy.
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>

namespace ddp {

/// A kind of host memory: how to get and give back `bytes` of it.
struct HostMemory {
  void* (*allocate)(size_t bytes);
  void (*release)(void* p);
};

/// A standard allocator over a HostMemory (null: operator new). Containers that use it carry
/// the kind of memory with them: assignment and swap take the other's.
template <typename T>
class HostAllocator {
 public:
  using value_type = T;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;

  HostAllocator() noexcept = default;
  explicit HostAllocator(const HostMemory* memory) noexcept : memory_(memory) {}
  template <typename U>
  HostAllocator(const HostAllocator<U>& other) noexcept : memory_(other.memory()) {}

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    return static_cast<T*>(memory_ ? memory_->allocate(bytes) : ::operator new(bytes));
  }
  void deallocate(T* p, size_t) noexcept {
    if (memory_) {
      memory_->release(p);
    } else {
      ::operator delete(p);
    }
  }
  const HostMemory* memory() const noexcept { return memory_; }

  template <typename U>
  bool operator==(const HostAllocator<U>& o) const noexcept {
    return memory_ == o.memory();
  }
  template <typename U>
  bool operator!=(const HostAllocator<U>& o) const noexcept {
    return memory_ != o.memory();
  }

 private:
  const HostMemory* memory_ = nullptr;
};

}  // namespace ddp
