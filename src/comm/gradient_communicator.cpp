// The sharded optimizer's collectives and gradient compression where a communicator has none
// (gradient_communicator.h).
#include "comm/gradient_communicator.h"

#include "core/check.h"

namespace ddp {

namespace {
[[noreturn]] void no_sharding(const char* what) {
  DDP_THROW(what << ": this gradient communicator has no sharded-optimizer collectives "
                    "(distributed.shard_optimizer needs CPU ranks, or GPU ranks with "
                    "distributed.backend: nccl)");
}
}  // namespace

std::shared_ptr<Work> GradientCommunicator::reduce_scatter_async(float*, size_t) {
  no_sharding("reduce-scatter");
}

std::shared_ptr<Work> GradientCommunicator::reduce_scatter_into_async(float*, size_t,
                                                                      PartConsumer) {
  DDP_THROW(
      "reduce-scatter: this gradient communicator cannot hand a bucket's sum to the "
      "optimizer (distributed.overlap_optimizer needs CPU ranks)");
}

std::shared_ptr<Work> GradientCommunicator::allgather_async(float*, const std::vector<Span>&,
                                                            ScalarRiders) {
  no_sharding("allgather");
}

float* GradientCommunicator::parameter_arena(size_t, bool) { no_sharding("parameter arena"); }

void GradientCommunicator::set_compression(Compression format, bool) {
  DDP_CHECK(format == Compression::None,
            "distributed.compression: " << to_string(format)
                                        << ": this gradient communicator sums in float32 only");
}

void GradientCommunicator::set_hierarchical(bool on) {
  DDP_CHECK(!on, "distributed.hierarchical: this gradient communicator has no hierarchical path");
}

}  // namespace ddp
