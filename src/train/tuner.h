// distributed.tune: auto. At start-up, before the gradient path is resolved: measure each wire
// the buckets could travel on (comm/link_probe.h) and PowerSGD's products on this rank, predict
// every candidate setting's gradient time per step with the step model of docs/scaling.md (one
// core per rank: the step computes, then communicates; Σ over buckets of α + β·floats), and
// choose among them (config/tuning.h: never lossier than the config's compression, the least
// lossy within 10% or 100 us of the fastest). The run trains with the choice and records it in its
// config.yaml, with tune: off, so a rerun takes the same path without measuring.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "config/gradient_path.h"
#include "ddp/config.h"

namespace ddp {

struct TuneOutcome {
  TrainConfig cfg;                 ///< the choice applied, distributed.tune off
  std::vector<std::string> lines;  ///< what was measured, predicted and chosen, for the log
};

/// Collective: `cfg` (distributed.tune: auto, a path that resolves on CPU ranks) with the
/// tuner's choice, every rank the same. `align`: the gradient arena's alignment in floats
/// (DeviceContext::arena_alignment), so the buckets predicted are the run's.
TuneOutcome tune_gradient_path(const TrainConfig& cfg, MpiCommunicator& comm,
                               const RankLayout& layout, size_t align);

}  // namespace ddp
