// A device communicator that queues a bucket's own reduction on its stream (NCCL): what
// PowerSGD's device compressor (device_powersgd.h) needs of it.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "comm/work.h"
#include "kernels/cuda/cuda_api.h"

namespace ddp {

class StreamReducer {
 public:
  virtual ~StreamReducer() = default;
  /// Queues a sum over ranks of `count` device floats in place on the stream: the same bits on
  /// every rank.
  using Sum = std::function<void(float* data, size_t count)>;
  /// Queues a bucket's reduction on `stream`, calling `sum` as often as it needs, every rank
  /// alike.
  using Reduction = std::function<void(cudaStream_t stream, const Sum& sum)>;
  /// Runs `reduce` now, on the calling thread, to queue its work on the communicator's stream
  /// after what the compute stream queued so far, in order with the other collectives; its
  /// Work is the whole of it (waits, timeouts and errors as a bucket's allreduce). `what` and
  /// `bytes` (sent by this rank) name it in errors and the flight recorder.
  virtual std::shared_ptr<Work> reduce_on_stream(std::string what, size_t bytes,
                                                 const Reduction& reduce) = 0;
  /// The device's multiprocessors, for the kernels' grids.
  virtual int sm_count() const = 0;
};

}  // namespace ddp
