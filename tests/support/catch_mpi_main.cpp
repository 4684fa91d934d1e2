// Catch2 main for the MPI test programs (unit, mpi, gpu): initialises MPI (a singleton world
// without mpiexec), runs the tests, and makes all ranks exit with the same code (any rank's
// failure fails every rank), so mpiexec never reports success for a test that failed on one rank
// only. A passing run then removes its scratch directories (scratch_dirs.h). Built with
// DDP_TEST_NEEDS_GPU (the GPU trainer tests against real CUDA) it exits 77 ("skipped") on every
// rank when no CUDA device is visible.
#include <mpi.h>

#include <iostream>
#include <string>

#include "catch_session.h"
#include "core/check.h"
#include "kernels/cuda/cuda.h"
#include "scratch_dirs.h"

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

  // Only rank 0 reports to the terminal; other ranks' failures still count below.
  const int rc = ddp_test::run_catch_session(argc, argv, rank == 0 ? nullptr : "compact");
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (worst == 0) ddp_test::remove_scratch_dirs();  // every rank is done with them
  MPI_Finalize();
  return worst == 0 ? 0 : 1;
}
