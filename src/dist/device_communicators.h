// Communicators for gradients in GPU memory, behind the same Communicator interface the
// Reducer drives on the CPU. NCCL: one allreduce per bucket on a comm stream of its own, which
// waits for the bucket's gradients through an event recorded on the compute stream, so the
// host never waits inside a step. Staged: each bucket is copied to pinned host memory and
// allreduced by MPI on the communication thread (clusters without NCCL; several ranks on one
// GPU). Both take the host communicator for bootstrap and for everything that is not a
// gradient (metrics, broadcasts, barriers).
#pragma once

#include <memory>
#include <string>

#include "ddp/config.h"
#include "dist/communicator.h"
#include "kernels/backend.h"

namespace ddp {

/// Whether this build can use NCCL, and its version ("2.28.9"), or why not.
bool nccl_built();
std::string nccl_version();

struct NcclOptions {
  /// Ring: NCCL_ALGO=Ring unless the user set NCCL_ALGO (the design's ring allreduce);
  /// Auto: NCCL chooses.
  NcclAlgo algo = NcclAlgo::Ring;
  double timeout_s = 600.0;
};

/// Collective over `host` (rank 0 makes the NCCL unique id; MPI broadcasts it). Gradient
/// buckets live in device memory (gradient_arena). Initialisation and every collective are
/// bounded by the timeout; a NCCL error or timeout aborts the NCCL communicator and throws
/// naming the rank and the operation. `host` and `cuda_backend` must outlive it.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host, Backend& cuda_backend,
                                                     const NcclOptions& options);

/// Gradients staged through host memory: the arena is device memory with a host mirror taken
/// from host.gradient_arena (an MPI shared-memory window on one node, page-locked); a bucket's
/// allreduce waits for its gradients, copies them to the mirror, allreduces with MPI and copies
/// the result back, all on the host communicator's thread. Work::wait blocks the host.
std::unique_ptr<Communicator> make_staged_communicator(Communicator& host, Backend& cuda_backend);

}  // namespace ddp
