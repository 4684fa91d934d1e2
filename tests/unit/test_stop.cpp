// Stop requests: the first SIGTERM/SIGINT only records the signal (training then stops at a step
// boundary with a checkpoint); a second one ends the process with the signal's default action.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "ddp/stop.h"

TEST_CASE("a first SIGTERM or SIGINT is recorded, not fatal", "[stop]") {
  ddp::clear_stop_request();
  ddp::install_stop_handlers();
  CHECK(ddp::stop_requested() == 0);
  REQUIRE(::raise(SIGTERM) == 0);
  CHECK(ddp::stop_requested() == SIGTERM);
  ddp::clear_stop_request();
  REQUIRE(::raise(SIGINT) == 0);
  CHECK(ddp::stop_requested() == SIGINT);
  ddp::clear_stop_request();
  ddp::request_stop(SIGTERM);
  CHECK(ddp::stop_requested() == SIGTERM);
  ddp::clear_stop_request();
  CHECK(ddp::stop_requested() == 0);
  ::signal(SIGTERM, SIG_DFL);
  ::signal(SIGINT, SIG_DFL);
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
