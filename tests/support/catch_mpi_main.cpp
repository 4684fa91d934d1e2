// Catch2 main for every test program: initialises MPI (a singleton world without mpiexec), runs
// the tests, and makes all ranks exit with the same code (any rank's failure fails every rank),
// so mpiexec never reports success for a test that failed on one rank only. Built with
// DDP_TEST_NEEDS_GPU (the GPU trainer tests against real CUDA) it exits 77 ("skipped") on every
// rank when no CUDA device is visible.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <catch2/catch.hpp>
#include <iostream>
#include <string>

#include "core/check.h"
#include "kernels/cuda/cuda.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ddp::set_error_rank(rank);
#if defined(DDP_TEST_NEEDS_GPU)
  std::string why;
  if (ddp::cuda_device_count(&why) == 0) {
    if (rank == 0) std::cout << "skipped: no CUDA device (" << why << ")" << std::endl;
    MPI_Finalize();
    return 77;
  }
#endif

  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  if (rc == 0) {
    // Only rank 0 reports to the terminal; other ranks' failures still count below.
    if (rank != 0) session.configData().reporterName = "compact";
    rc = session.run();
  }
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst == 0 ? 0 : 1;
}
