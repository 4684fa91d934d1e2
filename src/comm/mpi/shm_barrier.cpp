// The node-local barrier of shm_barrier.h: a counter and a generation word in shared memory.
#include "comm/mpi/shm_barrier.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <ctime>

#include "core/clock.h"

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif


namespace ddp {

namespace {

// How often a sleeper wakes to look at its deadline and at the cancel flag.
constexpr double kSliceSeconds = 0.05;

// Not FUTEX_PRIVATE_FLAG: the word lives in memory that other processes map.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, double seconds) {
#if defined(__linux__)
  timespec ts;
  ts.tv_sec = static_cast<time_t>(seconds);
  ts.tv_nsec = static_cast<long>((seconds - static_cast<double>(ts.tv_sec)) * 1e9);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
#else
  (void)word, (void)expected;
  struct timespec ts = {0, 50000};
  nanosleep(&ts, nullptr);
#endif
}

void futex_wake_all(std::atomic<uint32_t>* word) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
          0);
#else
  (void)word;
#endif
}

}  // namespace

WaitResult ShmBarrier::arrive_and_wait(double timeout_s, const std::atomic<bool>* cancel,
                                       SpinBudget& spin) {
  const uint32_t gen = s_->generation.load();
  if (s_->arrived.fetch_add(1) + 1 == n_) {
    // Last to arrive: reset the count for the next round before anyone can see the new
    // generation, then wake whoever went to sleep (the seq_cst order of sleepers++ / the
    // generation check against generation++ / the sleepers check leaves no lost wake-up).
    s_->arrived.store(0);
    s_->generation.fetch_add(1);
    if (s_->sleepers.load() > 0) futex_wake_all(&s_->generation);
    return WaitResult::Done;
  }
  const double start = seconds_now();
  if (spin_until([&] { return s_->generation.load() != gen; }, spin.seconds())) {
    spin.learn(seconds_now() - start, false);
    return WaitResult::Done;
  }
  WaitResult result = WaitResult::Done;
  s_->sleepers.fetch_add(1);
  while (s_->generation.load() == gen) {
    if (cancel != nullptr && cancel->load()) {
      result = WaitResult::Cancelled;
      break;
    }
    const double left = timeout_s - (seconds_now() - start);
    if (left <= 0) {
      result = WaitResult::TimedOut;
      break;
    }
    futex_wait(&s_->generation, gen, std::min(left, kSliceSeconds));
  }
  s_->sleepers.fetch_sub(1);
  spin.learn(seconds_now() - start, true);
  return s_->generation.load() != gen ? WaitResult::Done : result;
}

}  // namespace ddp
