// The config as "key.path = value" lines: what ranks compare at startup (so a difference is
// reported by the key that differs) and what a checkpoint records of the run it can continue.
#pragma once

#include <string>
#include <vector>

#include "ddp/config.h"

namespace ddp {

/// Every key of the effective config, in order, as "key.path = value".
std::vector<std::string> config_lines(const TrainConfig& cfg);

/// The lines every rank must share: all of them but where rank 0 writes its files.
std::vector<std::string> shared_config_lines(const TrainConfig& cfg);

/// The settings a checkpoint can only continue under: what decides the model, the order of
/// the data and the update rule. Paths, epochs, logging, devices, the batch and the world size
/// may change (positions in the data are counted in samples of the epoch's global order).
std::string resume_fingerprint(const TrainConfig& cfg);

}  // namespace ddp
