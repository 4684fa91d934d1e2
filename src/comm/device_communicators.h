// Communicators for gradients in GPU memory, behind the same GradientCommunicator interface the
// Reducer drives on the CPU. NCCL: one allreduce per bucket on a comm stream of its own, which
// waits for the bucket's gradients through an event recorded on the compute stream, so the
// host never waits inside a step (the process group only bootstraps it). Staged: each bucket is
// copied to pinned host memory and allreduced by the host gradient communicator on its
// communication thread (clusters without NCCL; several ranks on one GPU). Control messages
// (metrics, broadcasts, barriers) stay on the process group.
#pragma once

#include <memory>
#include <string>

#include "comm/gradient_communicator.h"
#include "comm/powersgd_communicator.h"
#include "comm/process_group.h"
#include "ddp/config.h"
#include "kernels/backend.h"

namespace ddp {

/// Whether this build can use NCCL, and its version ("2.28.9"), or why not.
bool nccl_built();
std::string nccl_version();

struct NcclOptions {
  /// Auto: NCCL chooses (NVLS or tree where they are faster); Ring: NCCL_ALGO=Ring unless the
  /// user set NCCL_ALGO, one algorithm whatever the message size and machine.
  NcclAlgo algo = NcclAlgo::Auto;
  double timeout_s = 600.0;
};

/// Collective over `group` (rank 0 makes the NCCL unique id; the group broadcasts it).
/// Gradient buckets live in device memory (gradient_arena). Initialisation and every
/// collective are bounded by the timeout; a NCCL error or timeout aborts the NCCL communicator
/// and throws naming the rank and the operation. `cuda_backend` must outlive it.
std::unique_ptr<ShardedCommunicator> make_nccl_communicator(ProcessGroup& group,
                                                            Backend& cuda_backend,
                                                            const NcclOptions& options);

/// Gradients staged through host memory: the arena is device memory with a host mirror taken
/// from host.gradient_arena (an MPI shared-memory window on one node, page-locked); a bucket's
/// allreduce waits for its gradients, copies them to the mirror, allreduces with MPI and copies
/// the result back, all on the host communicator's thread. Work::wait blocks the host. Its
/// timeout is the host's. `host` and `cuda_backend` must outlive it.
std::unique_ptr<GradientCommunicator> make_staged_communicator(HostGradientCommunicator& host,
                                                               Backend& cuda_backend);

/// distributed.compression powersgd on GPUs: the compressors of `buckets` (in the plan's
/// order), each a DevicePowerSgdBucket (comm/nccl/device_powersgd.h) queued on the stream of
/// `nccl`, make_nccl_communicator's (anything else throws ddp::Error), its two sums NCCL
/// allreduces. `world`: the job's ranks. `nccl` must outlive them.
PowerSgdCompressors nccl_powersgd_compressors(GradientCommunicator& nccl,
                                              const std::vector<PowerSgdLayout>& buckets,
                                              const PowerSgdOptions& options, int world);

}  // namespace ddp
