// The ranks' time splits and the straggler verdict (straggler.h).
#include "train/straggler.h"

#include <algorithm>

#include "core/check.h"

namespace ddp {

RankSplit split_interval(double wall, double data_wait, double collective_wait) {
  RankSplit s;
  s.data_wait = data_wait;
  s.collective_wait = collective_wait;
  s.compute = std::max(0.0, wall - data_wait - collective_wait);
  return s;
}

void WaitTally::add(bool timed, double seconds) {
  ++steps_;
  if (!timed) return;
  ++timed_;
  timed_seconds_ += seconds;
}

double WaitTally::estimate() const {
  if (timed_ == 0) return 0.0;
  if (timed_ == steps_) return timed_seconds_;  // every step: the sum itself, not rescaled
  return timed_seconds_ / static_cast<double>(timed_) * static_cast<double>(steps_);
}

SpreadOfRanks spread(const std::vector<double>& values) {
  DDP_CHECK(!values.empty(), "spread of no ranks");
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  SpreadOfRanks s;
  s.min = sorted.front();
  s.max = sorted.back();
  s.median = sorted[(sorted.size() - 1) / 2];
  s.max_rank = static_cast<int>(std::find(values.begin(), values.end(), s.max) - values.begin());
  return s;
}

IntervalReport report_interval(const std::vector<RankSplit>& ranks) {
  std::vector<double> compute, data, wait, busy;
  for (const RankSplit& r : ranks) {
    compute.push_back(r.compute);
    data.push_back(r.data_wait);
    wait.push_back(r.collective_wait);
    busy.push_back(r.busy());
  }
  IntervalReport out;
  out.compute = spread(compute);
  out.data_wait = spread(data);
  out.collective_wait = spread(wait);
  out.busy = spread(busy);
  out.slowest = out.busy.max_rank;
  out.skew = out.busy.median > 0 ? out.busy.max / out.busy.median : 1.0;
  return out;
}

namespace {
nlohmann::json spread_record(const SpreadOfRanks& s) {
  return {{"min", s.min}, {"median", s.median}, {"max", s.max}, {"slowest", s.max_rank}};
}
}  // namespace

nlohmann::json ranks_record(const IntervalReport& r) {
  return {{"compute", spread_record(r.compute)},
          {"data_wait", spread_record(r.data_wait)},
          {"collective_wait", spread_record(r.collective_wait)},
          {"skew", r.skew},
          {"slowest", r.slowest}};
}

void StragglerTally::add(const IntervalReport& r, double threshold) {
  ++logged_;
  if (threshold <= 0 || r.skew < threshold) return;
  DDP_CHECK(r.slowest >= 0 && r.slowest < static_cast<int>(slowest_at_.size()),
            "straggler tally: rank " << r.slowest << " of " << slowest_at_.size());
  ++flagged_;
  ++slowest_at_[r.slowest];
  skew_sum_[r.slowest] += r.skew;
}

std::optional<StragglerTally::Verdict> StragglerTally::persistent() const {
  for (size_t rank = 0; rank < slowest_at_.size(); ++rank) {
    const int64_t n = slowest_at_[rank];
    if (n >= kMinIntervals && 2 * n > flagged_ && 4 * n >= logged_)
      return Verdict{static_cast<int>(rank), n, flagged_, skew_sum_[rank] / n};
  }
  return std::nullopt;
}

}  // namespace ddp
