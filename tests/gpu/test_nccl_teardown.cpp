// The NCCL communicator's teardown on an error path, in the emulation of CUDA and NCCL: a
// communicator destroyed while its collective still waits on the NCCL stream for a peer that
// never posts it must return within distributed.timeout_s, aborting, and never hang the rank.
#include <catch2/catch.hpp>

#if defined(DDP_CUDA_EMULATION)
#include <cstdlib>
#include <memory>
#include <thread>

#include "comm/device_communicators.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/clock.h"
#include "gpu_training_setup.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_backend.h"
#include "mpi_test_helpers.h"
#include "nccl_emu.h"
#include "tests/deferred_streams.h"

// Rank 0 queues an allreduce that no other rank posts; a thread runs the compute stream, which
// waits for it (the device, busy with the collective). NCCL itself never gives up on a peer:
// the emulation's timeout (60 s here) stands for that, and the communicator's own timeout is
// 1 s. Destroying rank 0's communicator must take about that second, not the 60.
TEST_CASE("NCCL: a communicator destroyed with a collective waiting for a peer returns in time",
          "[gpu][nccl][errors]") {
  auto mpi = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  if (mpi->size() < 2 || !ddp::nccl_built() || ddp::cuda_device_count() < mpi->local_size()) {
    WARN("skipped: needs 2 ranks with a GPU each");
    return;
  }
  ddp_emu_test::DeferredStreams deferred(ddp_emu::device_lag());  // as the process has it
  auto backend = ddp::make_cuda_backend(mpi->local_rank() % ddp::cuda_device_count());
  auto comm = ddp_gpu_test::nccl_with_1s_timeout(*mpi, *backend);
  float* arena = comm->gradient_arena(64, ddp::BucketWire{});
  long errors = 0;
  if (mpi->rank() == 0) {
    std::shared_ptr<ddp::Work> work = comm->allreduce_async(arena, 64, false);
    work->wait();
    cudaStream_t compute = dynamic_cast<ddp::cuda::CudaBackend&>(*backend).stream();
    std::thread device([compute] { (void)cudaStreamSynchronize(compute); });
    const bool waiting =
        ddp_test::within(30, [] { return ddp_nccl_emu::running_collectives() == 1; });
    const double start = ddp::seconds_now();
    comm.reset();
    const double seconds = ddp::seconds_now() - start;
    device.join();
    INFO("the collective was waiting: " << waiting << "; teardown took " << seconds << " s");
    errors += !waiting;
    errors += seconds < 0.9 || seconds > 10;  // it waited for its timeout, and no longer
    errors += ddp_nccl_emu::running_collectives() != 0;
    errors += ddp_nccl_emu::live_communicators() != 0;  // aborted, not left behind
    CHECK(errors == 0);
    (void)cudaGetLastError();  // the aborted collective's result, on the device thread's stream
  }
  // The other ranks keep theirs (alive, never posting) until rank 0 is done.
  ddp_test::require_on_all_ranks(*mpi, errors, "ranks whose NCCL teardown did not return in time");
  comm.reset();
}

#endif  // DDP_CUDA_EMULATION
