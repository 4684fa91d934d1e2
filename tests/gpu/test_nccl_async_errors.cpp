// NCCL's asynchronous errors against the events of the collectives, in the emulation of CUDA and
// NCCL: a stream goes on past a collective that failed, so an end event that passed proves
// nothing alone. A wait for a collective that completed must still see an error that a later
// collective, already run by the device, left in the communicator.
#include <catch2/catch.hpp>

#if defined(DDP_CUDA_EMULATION)
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include "comm/device_communicators.h"
#include "comm/mpi/mpi_communicator.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_api.h"
#include "mpi_test_helpers.h"
#include "tests/deferred_streams.h"

// Each rank alone (a communicator of one): its second allreduce fails (DDP_NCCL_EMU_FAIL, read
// when the communicator is made). With deferred streams both are queued, and the device runs
// both before the host waits for the first.
TEST_CASE("NCCL: a wait for a collective that ran sees the error of the one the device ran after",
          "[gpu][nccl][errors]") {
  if (!ddp::nccl_built() || ddp::cuda_device_count() < 1) {
    WARN("skipped: needs a GPU");
    return;
  }
  ddp_emu_test::DeferredStreams deferred;
  auto self = ddp::make_mpi_communicator(MPI_COMM_SELF);
  auto backend = ddp::make_cuda_backend(0);
  setenv("DDP_NCCL_EMU_FAIL", "0:2", 1);
  auto comm = ddp::make_nccl_communicator(*self, *backend, ddp::NcclOptions{});
  unsetenv("DDP_NCCL_EMU_FAIL");
  float* arena = comm->gradient_arena(64, ddp::BucketWire{});
  std::shared_ptr<ddp::Work> first = comm->allreduce_async(arena, 32, false);
  std::shared_ptr<ddp::Work> second = comm->allreduce_async(arena + 32, 32, false);
  (void)cudaDeviceSynchronize();  // the device has run both (the second failed)
  (void)cudaGetLastError();
  const auto error_of = [](const std::function<void()>& call) -> std::string {
    try {
      call();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "no error";
  };
  const std::string waited = error_of([&] { first->synchronize(); });
  const std::string after = error_of([&] { second->synchronize(); });
  const std::string refused = error_of([&] { comm->allreduce_async(arena, 32, false); });
  INFO("the first: " << waited << "\nthe second: " << after << "\nanother: " << refused);
  long errors = 0;
  errors += waited.find("failed: NCCL reports") == std::string::npos;
  errors += after.find("aborted") == std::string::npos;
  errors += refused.find("refused: the communicator was aborted") == std::string::npos;
  CHECK(errors == 0);
  ddp_test::require_on_all_ranks(*ddp::make_mpi_communicator(MPI_COMM_WORLD), errors,
                                 "ranks whose wait missed a later collective's error");
}

#endif  // DDP_CUDA_EMULATION
