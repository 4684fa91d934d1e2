// The Catch2 session, compiled once (catch_session.cpp) for every test program's own main.
#pragma once

namespace ddp_test {

/// Parses the command line and runs the registered tests; returns Catch2's exit code.
/// `reporter`, when not null, replaces the reporter the command line chose.
int run_catch_session(int argc, char** argv, const char* reporter = nullptr);

}  // namespace ddp_test
