// Whole steps as device graphs (training.cuda_graphs): the device work of a step is captured
// once per kind of step and replayed with one call, where eager execution makes dozens of
// runtime calls (launches, events, collectives) for the same work. A kind of step is what a
// capture bakes in: the batch's device memory (the upload slot), its rows, the loss
// coefficient and the loss totals' slot. The first step of a kind runs eagerly (scratch memory
// grows to its size, NCCL connects), the second is captured and launched, later ones launch.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>

#include "kernels/backend.h"

namespace ddp {

class StepGraphs {
 public:
  struct Key {
    const float* x = nullptr;
    const int32_t* labels = nullptr;
    int64_t rows = 0;
    float loss_coef = 0.0f;
    int slot = 0;
    bool operator<(const Key& o) const {
      return std::tie(x, labels, rows, loss_coef, slot) <
             std::tie(o.x, o.labels, o.rows, o.loss_coef, o.slot);
    }
  };
  /// More kinds than this (a loss scale that keeps changing) start the collection over.
  static constexpr size_t kMaxGraphs = 16;

  explicit StepGraphs(Backend& backend) : be_(backend) {}

  /// Queues the step of kind `key`: `queue_step(captured)` queues its device work, either run
  /// eagerly (captured false) or recorded into a graph that is launched at once (captured
  /// true; the work must then make no call that waits for the device or allocates). Returns
  /// whether the step ran as a graph. An error inside a capture ends the capture and is
  /// rethrown.
  bool run(const Key& key, const std::function<void(bool captured)>& queue_step);

 private:
  Backend& be_;
  std::map<Key, std::unique_ptr<DeviceGraph>> graphs_;  // null: seen once, not captured yet
};

}  // namespace ddp
