// Graceful stop requests: SIGTERM (Slurm preemption, kill), SIGINT (Ctrl-C) and SIGUSR1 (what
// mpirun forwards to every rank; launch/ddp-run turns its own SIGINT/SIGTERM into it) only set
// a flag (core/stop_flag.h); the trainer's ranks agree on it at an optimizer-step boundary,
// write a checkpoint and end with kExitInterrupted, so a requeued job continues with --resume
// auto. convert, predict and evaluate stop in their loops instead and exit exit_code_of_stop().
#pragma once

namespace ddp {

/// Exit code of a run stopped by a signal after writing its checkpoint (EX_TEMPFAIL: "try
/// again"; resume with --resume auto).
constexpr int kExitInterrupted = 75;

/// Exit code of a run that lost a peer: a collective timed out (a rank died, stalled or stopped
/// on an error only it saw). Unlike 1 (an error every rank agreed on: config, data, checkpoint)
/// a restart from the newest checkpoint can help; launch/ddp-run --max-restarts retries on it.
constexpr int kExitPeerLost = 76;

/// Exit code of a one-shot command (convert, predict, evaluate) a signal stopped: 128 + the
/// signal, as a shell reports a process the signal killed (SIGTERM 143, SIGINT 130).
constexpr int exit_code_of_stop(int signal) { return 128 + signal; }

/// Installs the SIGTERM, SIGINT and SIGUSR1 handlers. The first signal requests a stop; a second
/// one ends the process at once with the default action (a user pressing Ctrl-C twice). Once the
/// outcome is final (set_final_exit_code) any signal ends the process with that code.
void install_stop_handlers();

/// Ignores SIGPIPE: a closed stdout (`ddp-train ... | head -1`) then fails writes with EPIPE,
/// which the streams absorb, instead of killing a run before it writes its files.
void ignore_broken_pipes();

/// Optimizer steps between the trainer's stop polls (all ranks poll at the same steps). A poll
/// is a one-float allreduce; polling every step cost ~3% of a small model's step time. A stop
/// request is acted on at the second poll after it: within 2 x kStopPollSteps steps.
constexpr long kStopPollSteps = 8;

/// Requests a stop as the handlers do (async-signal-safe); `signal` is reported back.
void request_stop(int signal);

/// The signal number of the pending stop request, or 0.
int stop_requested();

/// Forgets a pending request (tests).
void clear_stop_request();

/// Declares this process's outcome final: the run finished, stopped with a durable checkpoint
/// or failed with an error every rank agreed on, and `code` is what it exits with. From then on
/// these signals end the process at once with `code` (async-signal-safe `_exit`; flush streams
/// first). mpirun tears a job down as soon as one rank exits non-zero, while a peer may still
/// be inside MPI_Finalize and cannot leave it until mpirun kills it (docs/reliability.md): that
/// peer then exits with its own outcome, not of the launcher's signal.
void set_final_exit_code(int code);

}  // namespace ddp
