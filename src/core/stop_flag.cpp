// The pending stop request (stop_flag.h). Lock-free atomics: a signal handler stores to them.
#include "core/stop_flag.h"

#include <signal.h>

#include <atomic>

#include "core/check.h"

namespace ddp {

namespace {

std::atomic<int> g_stop_signal{0};
std::atomic<bool> g_interrupts{false};
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler stores the request");

}  // namespace

int stop_signal() { return g_stop_signal.load(); }

int exchange_stop_signal(int signal) { return g_stop_signal.exchange(signal); }

void set_stop_interrupts(bool on) { g_interrupts.store(on); }

int interrupting_stop() {
  return g_interrupts.load(std::memory_order_relaxed) ? g_stop_signal.load() : 0;
}

void throw_if_stopped(const std::string& what) {
  const int signal = interrupting_stop();
  DDP_CHECK(signal == 0, what << ": stopped by " << signal_name(signal));
}

std::string signal_name(int signal) {
  switch (signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "signal " + std::to_string(signal);
  }
}

}  // namespace ddp
