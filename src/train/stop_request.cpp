// Stop requests from SIGTERM, SIGINT and SIGUSR1 (see stop_request.h). The handler only stores
// to a lock-free atomic (core/stop_flag.h), or ends the process with its decided code:
// everything else (agreeing, checkpointing, exiting) happens on the thread doing the work.
#include "train/stop_request.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <initializer_list>

#include "core/stop_flag.h"

namespace ddp {
namespace {

std::atomic<int> g_final_exit_code{-1};  // < 0 while the outcome is open
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");

extern "C" void on_stop_signal(int signal) {
  const int final_code = g_final_exit_code.load();
  if (final_code >= 0) _exit(final_code);  // the outcome is decided: a signal cannot change it
  if (exchange_stop_signal(signal) != 0) {
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
  for (const int signal : {SIGTERM, SIGINT, SIGUSR1}) sigaction(signal, &action, nullptr);
}

void ignore_broken_pipes() { ::signal(SIGPIPE, SIG_IGN); }

void request_stop(int signal) { exchange_stop_signal(signal); }

int stop_requested() { return stop_signal(); }

void clear_stop_request() { exchange_stop_signal(0); }

void set_final_exit_code(int code) { g_final_exit_code.store(code < 0 ? 1 : code); }

}  // namespace ddp
