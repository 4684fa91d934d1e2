// The GPU communicators of a build without the CUDA toolkit: they say how to get them.
#if !defined(DDP_WITH_CUDA)

#include "comm/device_communicators.h"
#include "core/check.h"

namespace ddp {

bool nccl_built() { return false; }
std::string nccl_version() { return "not built (this build has no CUDA support)"; }

std::unique_ptr<ShardedCommunicator> make_nccl_communicator(ProcessGroup&, Backend&,
                                                            const NcclOptions&) {
  DDP_THROW("NCCL: this build has no CUDA support (configure with the CUDA toolkit installed)");
}

std::unique_ptr<GradientCommunicator> make_staged_communicator(HostGradientCommunicator&,
                                                               Backend&) {
  DDP_THROW(
      "staged GPU communicator: this build has no CUDA support (configure with the CUDA "
      "toolkit installed)");
}

PowerSgdCompressors nccl_powersgd_compressors(GradientCommunicator&,
                                              const std::vector<PowerSgdLayout>&,
                                              const PowerSgdOptions&, int) {
  DDP_THROW(
      "distributed.compression: powersgd on GPUs: this build has no CUDA support (configure "
      "with the CUDA toolkit installed)");
}

}  // namespace ddp

#endif  // !DDP_WITH_CUDA
