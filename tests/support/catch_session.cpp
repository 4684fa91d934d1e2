// Catch2's implementation, compiled once for every test program (the single header defines it
// in the one translation unit that asks for it). Each program brings its own main: the MPI
// main (catch_mpi_main.cpp), the CUDA main (catch_cuda_main.cpp) or the plain one
// (catch_main.cpp); they reach the session through catch_session.h.
#define CATCH_CONFIG_RUNNER
#include "catch_session.h"

#include <catch2/catch.hpp>

namespace ddp_test {

int run_catch_session(int argc, char** argv, const char* reporter) {
  Catch::Session session;
  const int rc = session.applyCommandLine(argc, argv);
  if (rc != 0) return rc;
  if (reporter != nullptr) session.configData().reporterName = reporter;
  return session.run();
}

}  // namespace ddp_test
