// How fast the gradient buckets' wires move floats between this job's ranks: collectives timed
// on a duplicate of the job's communicator, each fitted to the α-β model (config/tuning.h).
// What distributed.tune: auto measures at start-up (train/tuner.h).
#pragma once

#include <cstddef>
#include <functional>

#include "comm/mpi/mpi_communicator.h"
#include "config/tuning.h"

namespace ddp {

/// The sizes timed: `small` floats gives α, `large` the slope β; each timed `repeats` times
/// after one untimed round, every rank starting together.
struct ProbeSizes {
  size_t small = 256;
  size_t large = size_t{1} << 20;
  int repeats = 5;
};

/// Collective: `collective` run once untimed, then `repeats` times, each after a barrier; the
/// median of this rank's runs (a run that waited for a peer to get a core counts as often as
/// it happens: training waits so too), the slowest rank's, on every rank.
double time_collective(ProcessGroup& group, int repeats, const std::function<void()>& collective);

/// Collective: a bucket's allreduce (averaged, as the Reducer's) on `wire`, through a fresh
/// gradient arena of `sizes.large` floats, timed by time_collective: every rank returns the
/// same cost.
WireCost probe_wire(MpiCommunicator& comm, const BucketWire& wire, const ProbeSizes& sizes);

/// Collective: the blocking float32 sums over ranks that PowerSGD's factors take
/// (HostGradientCommunicator::reduce_on_lane), timed the same way.
WireCost probe_factor_sums(MpiCommunicator& comm, const ProbeSizes& sizes);

}  // namespace ddp
