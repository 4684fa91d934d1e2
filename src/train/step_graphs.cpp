// Whole steps as device graphs (step_graphs.h).
#include "train/step_graphs.h"

#include "core/check.h"

namespace ddp {

bool StepGraphs::run(const Key& key, const std::function<void(bool captured)>& queue_step) {
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    if (graphs_.size() >= kMaxGraphs) graphs_.clear();
    graphs_.emplace(key, nullptr);
    queue_step(false);
    return false;
  }
  if (it->second && be_.launch_graph(*it->second)) return true;
  // Seen before, or stale (the scratch memory moved, a slot's state differs): capture anew.
  it->second.reset();
  be_.begin_graph();
  try {
    queue_step(true);
  } catch (...) {
    (void)be_.end_graph(/*discard=*/true);
    throw;
  }
  it->second = be_.end_graph();
  DDP_CHECK(be_.launch_graph(*it->second), "a CUDA graph captured just now does not launch");
  return true;
}

}  // namespace ddp
