// Stop requests: the first SIGTERM/SIGINT/SIGUSR1 only records the signal (training then stops at
// a step boundary with a checkpoint); a second one ends the process with the signal's default
// action; once the outcome is final, any of them ends the process with its code.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <filesystem>
#include <string>

#include "core/stop_flag.h"
#include "data/convert.h"
#include "data/dataset.h"
#include "temp_files.h"
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

TEST_CASE("the one-shot commands' exit code for a stop is 128 + the signal", "[stop]") {
  CHECK(ddp::exit_code_of_stop(SIGTERM) == 143);
  CHECK(ddp::exit_code_of_stop(SIGINT) == 130);
  CHECK(ddp::signal_name(SIGTERM) == "SIGTERM");
  CHECK(ddp::signal_name(SIGINT) == "SIGINT");
  CHECK(ddp::signal_name(SIGUSR1) == "SIGUSR1");
}

// Training reads its data to the end and stops at a step poll with a checkpoint; convert,
// predict and evaluate turn interrupts on and their readers and loops stop at once, leaving
// no output.
TEST_CASE("a stop interrupts the readers only where a one-shot command asked for it", "[stop]") {
  ddp_test::TempDir dir;
  const std::string csv = dir.file("rows.csv");
  ddp_test::write_bytes(csv, "0.5,1.5,1\n2.5,3.5,0\n");
  const std::string images = dir.file("images"), labels = dir.file("labels");
  ddp_test::write_bytes(images,
                        std::string("\0\0\x08\x03\0\0\0\x01\0\0\0\x01\0\0\0\x02\x07\x09", 18));
  ddp_test::write_bytes(labels, std::string("\0\0\x08\x01\0\0\0\x01\x02", 9));
  ddp::ConvertRequest convert;
  convert.format = "csv";
  convert.data = csv;
  convert.out = dir.file("npy");
  struct Reset {
    ~Reset() {
      ddp::clear_stop_request();
      ddp::set_stop_interrupts(false);
    }
  } reset;

  ddp::request_stop(SIGTERM);
  CHECK_NOTHROW(ddp::throw_if_stopped("training"));  // interrupts are off by default
  CHECK(ddp::load_csv(csv, false).size == 2);
  CHECK(ddp::load_idx(images, labels).size == 1);

  ddp::set_stop_interrupts(true);
  CHECK_THROWS_WITH(ddp::throw_if_stopped("predict"),
                    Catch::Contains("predict: stopped by SIGTERM"));
  CHECK_THROWS_WITH(ddp::load_csv(csv, false),
                    Catch::Contains("reading " + csv + " at line 1: stopped by SIGTERM"));
  CHECK_THROWS_WITH(ddp::load_idx(images, labels),
                    Catch::Contains("reading " + images + ": stopped by SIGTERM"));
  CHECK_THROWS_WITH(ddp::convert_to_npy(convert), Catch::Contains("stopped by SIGTERM"));
  CHECK_FALSE(std::filesystem::exists(convert.out));

  ddp::clear_stop_request();
  CHECK_NOTHROW(ddp::throw_if_stopped("predict"));
  CHECK(ddp::convert_to_npy(convert).samples == 2);
}

// `ddp-train ... | head -1`: once head exits, writes to stdout fail with EPIPE instead of the
// default SIGPIPE ending the run before it writes its files.
TEST_CASE("a write to a closed pipe fails with EPIPE instead of killing the process", "[stop]") {
  const auto write_to_closed_pipe = [](bool ignore) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      if (ignore) ddp::ignore_broken_pipes();
      int fds[2];
      if (::pipe(fds) != 0) ::_exit(3);
      ::close(fds[0]);
      const bool epipe = ::write(fds[1], "x", 1) < 0 && errno == EPIPE;
      ::_exit(epipe ? 0 : 4);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    return WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status);
  };
  CHECK(write_to_closed_pipe(false) == -SIGPIPE);  // what the default did to a run
  CHECK(write_to_closed_pipe(true) == 0);
}
