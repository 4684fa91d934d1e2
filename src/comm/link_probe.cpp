// Timed collectives on a duplicate communicator (link_probe.h).
#include "comm/link_probe.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"

namespace ddp {

double time_collective(ProcessGroup& comm, int repeats, const std::function<void()>& collective) {
  collective();
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    comm.barrier();
    const double start = seconds_now();
    collective();
    times.push_back(seconds_now() - start);
  }
  std::sort(times.begin(), times.end());
  double slowest = times[times.size() / 2];
  comm.allreduce(&slowest, 1, ReduceOp::Max);
  return slowest;
}

namespace {

// A duplicate of `comm` with the same timeout and a gradient arena of `numel` small values on
// `wire`.
std::unique_ptr<MpiCommunicator> probe_communicator(MpiCommunicator& comm, const BucketWire& wire,
                                                    size_t numel, float** arena) {
  std::unique_ptr<MpiCommunicator> probe = comm.duplicate();
  probe->set_timeout(comm.timeout());
  *arena = probe->gradient_arena(numel, wire);
  for (size_t i = 0; i < numel; ++i)
    (*arena)[i] = 1e-3f * static_cast<float>((i + static_cast<size_t>(comm.rank())) % 7);
  probe->barrier();  // every rank's part of a shared arena written
  return probe;
}

// Both sizes through `one` (a collective of n floats), fitted.
WireCost fit(MpiCommunicator& probe, const ProbeSizes& sizes,
             const std::function<void(size_t)>& one) {
  const double small = time_collective(probe, sizes.repeats, [&] { one(sizes.small); });
  const double large = time_collective(probe, sizes.repeats, [&] { one(sizes.large); });
  return fit_wire_cost(sizes.small, small, sizes.large, large);
}

}  // namespace

WireCost probe_wire(MpiCommunicator& comm, const BucketWire& wire, const ProbeSizes& sizes) {
  float* arena = nullptr;
  std::unique_ptr<MpiCommunicator> probe = probe_communicator(comm, wire, sizes.large, &arena);
  return fit(*probe, sizes, [&](size_t n) { probe->allreduce_async(arena, n, true)->wait(); });
}

WireCost probe_factor_sums(MpiCommunicator& comm, const ProbeSizes& sizes) {
  float* arena = nullptr;
  std::unique_ptr<MpiCommunicator> probe =
      probe_communicator(comm, BucketWire{}, sizes.large, &arena);
  const HostGradientCommunicator::BucketReduction sum_once =
      [](float* data, size_t count, const HostGradientCommunicator::SumOverRanks& sum) {
        sum(data, count);
      };
  return fit(*probe, sizes, [&](size_t n) {
    probe
        ->reduce_on_lane("factor sum of " + std::to_string(n) + " floats (link probe)",
                         n * sizeof(float), arena, n, sum_once)
        ->wait();
  });
}

}  // namespace ddp
