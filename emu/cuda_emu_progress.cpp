// The emulated device's own progress in deferred mode: an operation that has waited on its
// stream longer than the device lag is run by a thread of the device, as a device runs what is
// queued whether or not its host waits for it. Without it a rank whose host sits in an MPI call
// would never run the NCCL collective its peer is already waiting in.
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "cuda_emu_internal.h"

namespace ddp_emu {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kDefaultLagS = 2.0;
constexpr double kMaxLagS = 1e6;

std::atomic<double> g_lag{-1.0};  // seconds, infinity for never; negative before the environment

double lag_now() {
  const double lag = g_lag.load(std::memory_order_acquire);
  if (lag >= 0) return lag;
  static const double from_env = [] {
    try {
      return parse_device_lag(std::getenv("DDP_EMU_DEVICE_LAG_S"));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cuda emulation: %s\n", e.what());  // as a wrong DDP_EMU_STREAMS
      std::abort();
    }
  }();
  double expected = -1.0;
  g_lag.compare_exchange_strong(expected, from_env);
  return g_lag.load();
}

// One device thread per process: the flag is cleared in a forked child, which has no thread.
// The registry's lock is taken around a fork, so that the child never inherits it held by the
// device thread.
std::atomic<bool> g_thread_started{false};

void lock_before_fork() { registry().mu.lock(); }
void unlock_in_parent() { registry().mu.unlock(); }
void unlock_in_child() {
  registry().mu.unlock();
  g_thread_started.store(false);
}

// How often the device thread looks at the queues: often enough that an operation runs soon
// after its lag, rarely enough to cost nothing.
Clock::duration tick(double lag) {
  const double s = std::isfinite(lag) ? std::min(0.05, std::max(0.001, lag / 4)) : 0.05;
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

struct Overdue {
  CUstream_st* stream = nullptr;
  uint64_t serial = 0;
  uint64_t target = 0;  // the stream's last operation queued before the deadline
};

// The stream whose oldest operation waits longest, if that one waited longer than the lag and
// no thread runs the stream now.
Overdue oldest_overdue_locked(Registry& r, Clock::time_point deadline) {
  Overdue o;
  Clock::time_point oldest = Clock::time_point::max();
  for (CUstream_st* s : r.streams) {
    if (s->running || s->queue.empty()) continue;
    const QueuedOp& front = s->queue.front();
    if (front.queued > deadline || front.queued >= oldest) continue;
    oldest = front.queued;
    o.stream = s;
    o.serial = s->serial;
    o.target = front.seq;
    for (const QueuedOp& op : s->queue) {
      if (op.queued > deadline) break;
      o.target = op.seq;
    }
  }
  return o;
}

[[noreturn]] void device_loop() {
  Registry& r = registry();
  for (;;) {
    const double lag = lag_now();
    Overdue o;
    if (std::isfinite(lag) && deferred()) {
      const auto deadline = Clock::now() - std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(lag));
      std::lock_guard<std::mutex> lk(r.mu);
      o = oldest_overdue_locked(r, deadline);
    }
    if (o.stream == nullptr) {
      std::this_thread::sleep_for(tick(lag));
      continue;
    }
    run_until(o.stream, o.serial, o.target);  // may wait for peers, as the device would
  }
}

}  // namespace

double parse_device_lag(const char* value) {
  if (value == nullptr || *value == '\0') return kDefaultLagS;
  if (std::strcmp(value, "never") == 0) return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const double s = std::strtod(value, &end);
  if (end == value || *end != '\0' || !(s >= 0 && s <= kMaxLagS)) {
    throw std::invalid_argument(std::string("DDP_EMU_DEVICE_LAG_S='") + value +
                                "' is not a number of seconds in [0, 1e6] or \"never\"");
  }
  return s;
}

double device_lag() { return lag_now(); }

void set_device_lag(double seconds) {
  if (!(seconds >= 0)) throw std::invalid_argument("set_device_lag: the lag must be >= 0 s");
  (void)lag_now();  // the environment is read once, and never overrides this choice
  g_lag.store(seconds, std::memory_order_release);
}

namespace detail {

void start_device_thread() {
  if (g_thread_started.load(std::memory_order_acquire)) return;
  static std::once_flag at_fork;
  std::call_once(at_fork,
                 [] { pthread_atfork(lock_before_fork, unlock_in_parent, unlock_in_child); });
  bool expected = false;
  if (!g_thread_started.compare_exchange_strong(expected, true)) return;
  // Detached and never stopped: at exit it is asleep or inside an operation, as a device is.
  std::thread(device_loop).detach();
}

}  // namespace detail
}  // namespace ddp_emu
