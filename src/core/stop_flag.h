// The process's pending stop request: the signal that asked for it (SIGTERM, SIGINT, SIGUSR1),
// recorded by the handlers of train/stop_request.h. Training acts on it at its step polls, after
// a checkpoint; the one-shot commands (convert, predict, evaluate) let it interrupt their loops,
// the readers' included, so they stop within a second and leave no partial output.
#pragma once

#include <string>

namespace ddp {

/// The pending request's signal number, or 0. Async-signal-safe.
int stop_signal();

/// Records `signal` (0 forgets the request) and returns the previous one. Async-signal-safe.
int exchange_stop_signal(int signal);

/// Whether a pending request interrupts work at once (throw_if_stopped throws) instead of
/// waiting for the trainer's next step poll. Off unless a one-shot command turns it on:
/// training reads its data to the end and stops after a checkpoint.
void set_stop_interrupts(bool on);

/// The pending request's signal when it interrupts work (set_stop_interrupts), else 0; two
/// atomic loads, cheap enough for every row of a reader.
int interrupting_stop();

/// Throws ddp::Error "<what>: stopped by SIGTERM" when interrupting_stop() is not 0.
void throw_if_stopped(const std::string& what);

/// "SIGTERM", "SIGINT", "SIGUSR1", ... or "signal N".
std::string signal_name(int signal);

}  // namespace ddp
