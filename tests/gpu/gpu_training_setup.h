// What the GPU training tests share: their small config, whether every rank has a GPU, and (in
// the emulation) a NCCL communicator that gives up on a missing peer after 1 s.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>

#include "comm/device_communicators.h"
#include "comm/mpi/mpi_communicator.h"
#include "ddp/config.h"
#include "kernels/cuda/cuda.h"
#include "mpi_test_helpers.h"

namespace ddp_gpu_test {

inline std::string scratch_dir(const std::string& name) {
  return ddp_test::scratch_dir("ddp_gpu_test_", name);
}

// Small enough for the emulation (every GPU thread a CPU thread), big enough for several
// buckets, momentum and two epochs.
inline ddp::TrainConfig small_config(const std::string& name, ddp::DeviceChoice device) {
  ddp::TrainConfig cfg = ddp_test::small_training_config(scratch_dir(name));
  cfg.device = device;
  cfg.data.train.samples = 96;
  cfg.data.test.samples = 40;
  cfg.data.seed = 7;
  cfg.training.seed = 3;
  cfg.training.batch_size = 8;
  cfg.training.epochs = 2;
  // In the emulation a rank runs on one core beside the other tests' ranks (ctest runs three
  // at once), whose emulated kernels are hundreds of runnable threads: its training thread gets
  // a sliver of the core, and a rank was seen reaching a step's metrics allreduce 60.6 s after
  // its peer (its flight record: not stuck, it completed it later). A real hang still fails the
  // test, after the flight records name the rank and the collective.
#if defined(DDP_CUDA_EMULATION)
  cfg.distributed.timeout_s = 300;
#else
  cfg.distributed.timeout_s = 60;
#endif
  return cfg;
}

// The GPUs of this node cover one per local rank (what NCCL needs).
inline bool gpu_per_rank() {
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  double enough = ddp::cuda_device_count() >= comm->local_size() ? 1.0 : 0.0;
  comm->allreduce(&enough, 1, ddp::ReduceOp::Min);
  return enough > 0 && ddp::nccl_built();
}

#if defined(DDP_CUDA_EMULATION)
// A NCCL communicator over `group` on `backend`'s GPU whose own timeout is 1 s, while the
// emulated NCCL waits 60 s for a peer that never posts (NCCL itself never gives up: the 60 s
// stand for that), for the tests of what the communicator does when a peer is missing.
inline std::unique_ptr<ddp::ShardedCommunicator> nccl_with_1s_timeout(ddp::ProcessGroup& group,
                                                                      ddp::Backend& backend) {
  setenv("DDP_NCCL_EMU_TIMEOUT_S", "60", 1);
  ddp::NcclOptions options;
  options.timeout_s = 1.0;
  auto comm = ddp::make_nccl_communicator(group, backend, options);
  unsetenv("DDP_NCCL_EMU_TIMEOUT_S");
  return comm;
}
#endif

}  // namespace ddp_gpu_test
