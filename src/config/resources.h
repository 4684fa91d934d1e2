// What a config asks of each rank's memory, from the products of several keys: a micro-batch's
// activations, the parameters with their gradients and optimizer state, the loader's batches and
// generated data. Computed with checked arithmetic, so that validation refuses a product that
// overflows int64, or needs more than the machine has, before anything is allocated.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/config.h"

namespace ddp {

/// One quantity of memory a rank needs, as a product of keys.
struct MemoryDemand {
  std::string what;               ///< "the activations of one micro-batch"
  std::vector<std::string> keys;  ///< the keys it is the product of, the one to name first
  std::string product;            ///< the product spelled out, keys with their values
  int64_t bytes = 0;              ///< meaningful unless `overflows`
  bool overflows = false;         ///< the product does not fit in int64
};

/// The demands of a config whose keys are each within the schema's bounds and whose model has
/// at least two widths. Each is a lower bound of what the run allocates.
std::vector<MemoryDemand> memory_demands(const TrainConfig& cfg);

/// This machine's physical memory in bytes; 0 when the system does not say.
int64_t physical_memory_bytes();

/// Samples a rank takes per optimizer step (batch_size x accumulate_steps) may be at most this:
/// times any MPI world size (an int) the global batch stays below 2^63.
constexpr int64_t kMaxRankStepSamples = int64_t{1} << 32;

}  // namespace ddp
