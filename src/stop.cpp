// Stop requests from SIGTERM/SIGINT (see stop.h). The handler only stores to a lock-free
// atomic: everything else (agreeing, checkpointing, exiting) happens on the training thread.
#include "ddp/stop.h"

#include <signal.h>

#include <atomic>

namespace ddp {
namespace {

std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");

extern "C" void on_stop_signal(int signal) {
  if (g_stop_signal.exchange(signal) != 0) {
    // Second signal: the user insists. Default action, re-raised (returning re-delivers it).
    ::signal(signal, SIG_DFL);
    ::raise(signal);
  }
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking calls in progress go on; the loop polls the flag
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

void request_stop(int signal) { g_stop_signal.store(signal); }

int stop_requested() { return g_stop_signal.load(); }

void clear_stop_request() { g_stop_signal.store(0); }

}  // namespace ddp
