// Stop requests: the first SIGTERM/SIGINT/SIGUSR1 only records the signal (training then stops at
// a step boundary with a checkpoint); a second one ends the process with the signal's default
// action; once the outcome is final, any of them ends the process with its code.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "train/stop_request.h"

TEST_CASE("a first SIGTERM, SIGINT or SIGUSR1 is recorded, not fatal", "[stop]") {
  ddp::clear_stop_request();
  ddp::install_stop_handlers();
  CHECK(ddp::stop_requested() == 0);
  REQUIRE(::raise(SIGTERM) == 0);
  CHECK(ddp::stop_requested() == SIGTERM);
  ddp::clear_stop_request();
  REQUIRE(::raise(SIGINT) == 0);
  CHECK(ddp::stop_requested() == SIGINT);
  ddp::clear_stop_request();
  REQUIRE(::raise(SIGUSR1) == 0);  // what mpirun forwards (launch/ddp-run sends it)
  CHECK(ddp::stop_requested() == SIGUSR1);
  ddp::clear_stop_request();
  ddp::request_stop(SIGTERM);
  CHECK(ddp::stop_requested() == SIGTERM);
  ddp::clear_stop_request();
  CHECK(ddp::stop_requested() == 0);
  ::signal(SIGTERM, SIG_DFL);
  ::signal(SIGINT, SIG_DFL);
  ::signal(SIGUSR1, SIG_DFL);
}

TEST_CASE("a second signal ends the process with the default action", "[stop]") {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ddp::install_stop_handlers();
    ::raise(SIGINT);  // recorded
    if (ddp::stop_requested() != SIGINT) ::_exit(3);
    ::raise(SIGINT);  // the user insists: killed here
    ::_exit(4);       // not reached
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  INFO("status " << status);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGINT);
}

// The exit status of a forked child that installs the handlers, runs `body` and then raises
// `signal`; -signal if the signal killed it.
template <typename Body>
int exit_after_signal(int signal, Body body) {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ddp::install_stop_handlers();
    body();
    ::raise(signal);
    ::_exit(4);  // not reached when the handler ends the process
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  REQUIRE(WIFEXITED(status));
  return WEXITSTATUS(status);
}

TEST_CASE("once the outcome is final a signal ends the process with that code", "[stop]") {
  // The launcher's SIGTERM to a rank that has stopped with its checkpoint: exit 75, whether the
  // rank itself had been signalled before (the second-signal rule no longer applies) or not.
  CHECK(exit_after_signal(SIGTERM, [] { ddp::set_final_exit_code(ddp::kExitInterrupted); }) ==
        ddp::kExitInterrupted);
  CHECK(exit_after_signal(SIGTERM, [] {
          ::raise(SIGTERM);  // the stop request that started it
          ddp::set_final_exit_code(ddp::kExitInterrupted);
        }) == ddp::kExitInterrupted);
  CHECK(exit_after_signal(SIGINT, [] { ddp::set_final_exit_code(1); }) == 1);
  CHECK(exit_after_signal(SIGTERM, [] { ddp::set_final_exit_code(0); }) == 0);
  // Without a final outcome the second signal still kills.
  CHECK(exit_after_signal(SIGTERM, [] { ::raise(SIGTERM); }) == -SIGTERM);
}
