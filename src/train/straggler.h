// Which rank the others wait for: each rank's time between two progress lines split into
// compute, data wait and collective wait, gathered at the progress line and reduced to
// min / median / max and the slowest rank; and, over the run, the rank that was slowest at most
// of the intervals whose skew passed output.straggler_threshold, and at a quarter of all of them
// at least (the persistent straggler the summary names). Pure functions: the gathering is TrainLoop's.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

namespace ddp {

/// One rank's wall time between two progress lines, in seconds.
struct RankSplit {
  double compute = 0;          ///< the rest: its own work (the interval minus the two waits)
  double data_wait = 0;        ///< the training thread waited for the loader's next batch
  double collective_wait = 0;  ///< it waited for its peers' gradients (StepResult::collective_wait)
  double busy() const { return compute + data_wait; }
};

/// A rank's collective wait over the steps of one interval. Where only some steps were timed (on
/// a GPU, replayed graphs carry no times: only the eager steps, the logged one among them), the
/// timed steps' mean stands for every step of the interval.
class WaitTally {
 public:
  void add(bool timed, double seconds);
  /// The interval's wait: the timed steps' sum scaled to every step, 0 when none was timed.
  double estimate() const;
  void reset() { *this = WaitTally{}; }

 private:
  double timed_seconds_ = 0;
  int64_t steps_ = 0, timed_ = 0;
};

/// The split of an interval of `wall` seconds: the waits measured, the rest compute (never
/// below 0: clocks read at different moments may round the waits past the wall time).
RankSplit split_interval(double wall, double data_wait, double collective_wait);

/// One quantity over the ranks.
struct SpreadOfRanks {
  double min = 0, median = 0, max = 0;
  int max_rank = 0;  ///< the lowest rank holding the max
};

/// The lower median: the ((n - 1) / 2)-th smallest value, a rank's own number (with 2 ranks the
/// faster one's), so a skew of 2 means "twice what a typical rank took". `values` not empty.
SpreadOfRanks spread(const std::vector<double>& values);

/// The ranks' splits of one interval.
struct IntervalReport {
  SpreadOfRanks compute, data_wait, collective_wait, busy;
  int slowest = 0;  ///< the rank with the most compute + data wait: the one the others wait for
  /// max / median of compute + data wait; 1 when the median is 0 (nothing measured to compare).
  double skew = 1;
};

/// The report of the splits of every rank, in rank order. Peers of a slow rank show a large
/// collective wait (they reach the gradient allreduce first and wait for it) and the slow rank a
/// small one, so the slowest is judged by compute + data wait, never by the wait.
IntervalReport report_interval(const std::vector<RankSplit>& ranks);

/// The "ranks" object of a train record: {"compute": {"min", "median", "max", "slowest"},
/// "data_wait": {...}, "collective_wait": {...}, "skew", "slowest"}, where each quantity's
/// "slowest" is the rank holding its max (for collective_wait: the rank that waited longest, a
/// peer of the slow one) and the top-level "slowest" is IntervalReport::slowest.
nlohmann::json ranks_record(const IntervalReport& r);

/// The run's tally of intervals whose skew passed the threshold: which rank was slowest in each.
class StragglerTally {
 public:
  explicit StragglerTally(int ranks) : slowest_at_(ranks, 0), skew_sum_(ranks, 0.0) {}
  /// Counts an interval (every logged one); those with skew >= threshold are flagged.
  void add(const IntervalReport& r, double threshold);

  struct Verdict {
    int rank = 0;
    int64_t slowest_at = 0;  ///< flagged intervals where it was the slowest
    int64_t flagged = 0;     ///< intervals whose skew passed the threshold
    double mean_skew = 0;    ///< its mean skew over the intervals where it was the slowest
  };
  /// The persistent straggler: the rank slowest at more than half of the flagged intervals,
  /// at least kMinIntervals of them and at least a quarter of all logged intervals (so a few
  /// noisy intervals of a long run name nobody); none otherwise.
  std::optional<Verdict> persistent() const;
  int64_t logged() const { return logged_; }
  int64_t flagged() const { return flagged_; }

  static constexpr int64_t kMinIntervals = 3;

 private:
  std::vector<int64_t> slowest_at_;
  std::vector<double> skew_sum_;
  int64_t logged_ = 0, flagged_ = 0;
};

}  // namespace ddp
