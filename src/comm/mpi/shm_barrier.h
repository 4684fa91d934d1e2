// A barrier for the ranks of one node over a few bytes of memory they all map (an MPI
// shared-memory window): a short spin, then a sleep in the kernel (a futex on the shared word)
// until the last rank arrives and wakes the sleepers. A rank that waits for a late or
// descheduled peer costs no CPU, and the peer, once it runs, needs no one else's CPU to pass.
#pragma once

#include <atomic>
#include <cstdint>

#include "comm/mpi/lane.h"

namespace ddp {

/// The barrier's shared state: constructed by one rank before anyone uses it.
struct alignas(64) ShmBarrierState {
  std::atomic<uint32_t> arrived{0};
  char pad_[60] = {};
  std::atomic<uint32_t> generation{0};  // the futex word: bumped when everyone has arrived
  std::atomic<uint32_t> sleepers{0};
};
static_assert(std::atomic<uint32_t>::is_always_lock_free,
              "the shared barrier needs address-free atomics");

class ShmBarrier {
 public:
  ShmBarrier(ShmBarrierState* state, int participants) : s_(state), n_(participants) {}

  /// Returns once all participants have called it (the same number of times); every store
  /// made by any of them before its call is then visible to every other. Gives up after
  /// timeout_s, or soon after *cancel becomes true (the barrier is then unusable).
  /// `spin` is the caller's budget for this barrier (one per place it is called from).
  WaitResult arrive_and_wait(double timeout_s, const std::atomic<bool>* cancel, SpinBudget& spin);

 private:
  ShmBarrierState* s_;
  uint32_t n_;
};

}  // namespace ddp
