// The per-rank report (src/train/straggler.h): an interval's split, the spread of a quantity over
// the ranks (lower median, the rank at the max), the slowest rank judged by compute + data wait
// (never by its collective wait), the skew, the "ranks" record, and the persistent-straggler
// verdict over a run's intervals.
#include <catch2/catch.hpp>
#include <vector>

#include "train/straggler.h"

using ddp::IntervalReport;
using ddp::RankSplit;
using ddp::StragglerTally;

TEST_CASE("straggler: an interval's compute is the wall time less both waits, never below 0",
          "[straggler]") {
  const RankSplit s = ddp::split_interval(2.0, 0.25, 0.5);
  CHECK(s.compute == 1.25);
  CHECK(s.data_wait == 0.25);
  CHECK(s.collective_wait == 0.5);
  CHECK(s.busy() == 1.5);
  CHECK(ddp::split_interval(1.0, 0.75, 0.5).compute == 0.0);
}

TEST_CASE("straggler: an interval's collective wait from the steps that were timed",
          "[straggler]") {
  ddp::WaitTally t;
  CHECK(t.estimate() == 0.0);
  t.add(true, 0.25);
  t.add(true, 0.5);
  CHECK(t.estimate() == 0.75);  // every step timed: their sum
  t.add(false, 99.0);           // a replayed graph: its time is not known, nor read
  t.add(false, 0.0);
  CHECK(t.estimate() == Approx(0.375 * 4));  // the timed steps' mean for each of the 4
  t.reset();
  t.add(false, 1.0);
  CHECK(t.estimate() == 0.0);  // nothing timed: no wait known
}

TEST_CASE("straggler: min, lower median, max and the lowest rank at the max", "[straggler]") {
  const ddp::SpreadOfRanks odd = ddp::spread({3.0, 1.0, 5.0, 2.0, 4.0});
  CHECK(odd.min == 1.0);
  CHECK(odd.median == 3.0);
  CHECK(odd.max == 5.0);
  CHECK(odd.max_rank == 2);
  // Even counts take the lower of the two middle values: with 2 ranks, the faster one's.
  const ddp::SpreadOfRanks two = ddp::spread({4.0, 1.0});
  CHECK(two.median == 1.0);
  CHECK(two.max_rank == 0);
  CHECK(ddp::spread({1.0, 2.0, 3.0, 4.0}).median == 2.0);
  CHECK(ddp::spread({2.0, 7.0, 7.0}).max_rank == 1);
  CHECK(ddp::spread({6.0}).median == 6.0);
  CHECK_THROWS(ddp::spread({}));
}

TEST_CASE("straggler: the slowest rank has the most compute + data wait, not the most wait",
          "[straggler]") {
  // Rank 2 computes twice as long; ranks 0, 1 and 3 wait for it in the allreduce.
  const std::vector<RankSplit> ranks = {
      {1.0, 0.1, 1.0}, {1.1, 0.0, 0.9}, {2.0, 0.1, 0.05}, {0.9, 0.1, 1.1}};
  const IntervalReport r = ddp::report_interval(ranks);
  CHECK(r.slowest == 2);
  CHECK(r.collective_wait.max_rank == 3);
  CHECK(r.compute.max == 2.0);
  CHECK(r.compute.min == 0.9);
  CHECK(r.compute.median == 1.0);
  // busy: 1.1, 1.1, 2.1, 1.0; lower median 1.1.
  CHECK(r.skew == Approx(2.1 / 1.1).epsilon(1e-12));
  // A rank slow at loading its data is the straggler too.
  const IntervalReport data = ddp::report_interval({{1.0, 0.0, 1.5}, {1.0, 1.5, 0.0}});
  CHECK(data.slowest == 1);
  CHECK(data.data_wait.max_rank == 1);
  CHECK(data.skew == 2.5);
}

TEST_CASE("straggler: no work measured is a skew of 1", "[straggler]") {
  const IntervalReport r = ddp::report_interval({{0, 0, 0.5}, {0, 0, 0.0}});
  CHECK(r.skew == 1.0);
  CHECK(ddp::report_interval({{0, 0, 0}, {1, 0, 0}, {0, 0, 0}}).skew == 1.0);
}

TEST_CASE("straggler: the ranks record", "[straggler]") {
  const nlohmann::json j = ddp::ranks_record(ddp::report_interval({{1, 0, 1}, {2, 0.5, 0}}));
  CHECK(j["compute"]["min"] == 1.0);
  CHECK(j["compute"]["median"] == 1.0);
  CHECK(j["compute"]["max"] == 2.0);
  CHECK(j["compute"]["slowest"] == 1);
  CHECK(j["data_wait"]["max"] == 0.5);
  CHECK(j["collective_wait"]["slowest"] == 0);
  CHECK(j["skew"] == 2.5);
  CHECK(j["slowest"] == 1);
}

namespace {
IntervalReport interval(int slowest, double skew) {
  IntervalReport r;
  r.slowest = slowest;
  r.skew = skew;
  return r;
}
}  // namespace

TEST_CASE("straggler: persistent when slowest at more than half of the flagged intervals",
          "[straggler]") {
  StragglerTally t(3);
  for (int i = 0; i < 9; ++i) t.add(interval(1, 2.0 + 0.1 * (i % 2)), 1.5);
  t.add(interval(2, 1.6), 1.5);
  t.add(interval(0, 1.4), 1.5);  // under the threshold: logged, not flagged
  CHECK(t.logged() == 11);
  CHECK(t.flagged() == 10);
  const auto v = t.persistent();
  REQUIRE(v);
  CHECK(v->rank == 1);
  CHECK(v->slowest_at == 9);
  CHECK(v->flagged == 10);
  CHECK(v->mean_skew == Approx((5 * 2.0 + 4 * 2.1) / 9).epsilon(1e-12));
}

TEST_CASE("straggler: half is not more than half, fewer than 3 or than a quarter is no verdict",
          "[straggler]") {
  StragglerTally half(2);
  for (int i = 0; i < 4; ++i) half.add(interval(i % 2, 3.0), 1.5);
  CHECK_FALSE(half.persistent());
  half.add(interval(1, 3.0), 1.5);
  REQUIRE(half.persistent());
  CHECK(half.persistent()->rank == 1);

  StragglerTally few(2);
  few.add(interval(1, 3.0), 1.5);
  few.add(interval(1, 3.0), 1.5);
  CHECK_FALSE(few.persistent());
  few.add(interval(1, 3.0), 1.5);
  REQUIRE(few.persistent());
  CHECK(few.persistent()->slowest_at == 3);

  StragglerTally quiet(2);  // many intervals, none past the threshold
  for (int i = 0; i < 20; ++i) quiet.add(interval(1, 1.2), 1.5);
  CHECK(quiet.flagged() == 0);
  CHECK_FALSE(quiet.persistent());

  StragglerTally sparse(2);  // 3 noisy intervals of 30: fewer than a quarter
  for (int i = 0; i < 27; ++i) sparse.add(interval(0, 1.2), 1.5);
  for (int i = 0; i < 3; ++i) sparse.add(interval(0, 1.6), 1.5);
  CHECK(sparse.flagged() == 3);
  CHECK_FALSE(sparse.persistent());
  for (int i = 0; i < 5; ++i) sparse.add(interval(0, 1.6), 1.5);  // 8 of 35: still fewer
  CHECK_FALSE(sparse.persistent());
  sparse.add(interval(0, 1.6), 1.5);  // 9 of 36: a quarter
  REQUIRE(sparse.persistent());
  CHECK(sparse.persistent()->slowest_at == 9);

  StragglerTally off(2);  // threshold 0: the report is off
  for (int i = 0; i < 5; ++i) off.add(interval(1, 9.0), 0.0);
  CHECK_FALSE(off.persistent());
}

TEST_CASE("straggler: a rank outside the tally is refused", "[straggler]") {
  StragglerTally t(2);
  CHECK_THROWS(t.add(interval(2, 3.0), 1.5));
}
