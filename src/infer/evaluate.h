// ddp-train evaluate: a saved model on the config's test split, data-parallel over the ranks it
// is launched with (each rank a shard, the counts summed), with the loss and accuracy exactly as
// training's evaluation after each epoch computes them, and the confusion matrix.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "ddp/config.h"
#include "comm/process_group.h"
#include "train/report.h"

namespace ddp {

struct Evaluation {
  Tally tally;  ///< loss and correct count over every rank's shard
  int64_t classes = 0;
  std::vector<int64_t> confusion;  ///< [true class][predicted class], classes x classes
  std::string model, data;         ///< what was evaluated on what, for the report
};

/// Collective over `comm`: the model file at `model_path` on cfg's test split (data.test), its
/// input transform applied. Throws ddp::Error (every rank agrees) when the config has no test
/// split, when the model does not fit the config's model.layers or the data, or when the model
/// and data.normalize disagree.
Evaluation evaluate_model(const TrainConfig& cfg, ProcessGroup& comm,
                          const std::string& model_path);

/// The report rank 0 prints: "test loss L acc A% (N samples)", then the confusion matrix
/// with per-class recall.
void print_evaluation(const Evaluation& e, std::ostream& out);

}  // namespace ddp
