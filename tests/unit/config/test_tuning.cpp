// distributed.tune's pure half (config/tuning.h): the α-β fit, the lossiness order, the
// candidates a config allows on a layout, what a candidate sets, and the choice.
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "config/gradient_path.h"
#include "config/tuning.h"
#include "ddp/config.h"

namespace {

using ddp::CompressedSum;
using ddp::Compression;
using ddp::TrainConfig;
using ddp::TuneCandidate;

ddp::RankLayout nodes(int count, int each) {
  ddp::RankLayout l;
  l.ranks = count * each;
  l.local_ranks = l.fewest_local = l.most_local = each;
  return l;
}

TrainConfig tuned(Compression c, int64_t rank = 1) {
  TrainConfig cfg;
  cfg.distributed.tune = ddp::Tune::Auto;
  cfg.distributed.compression = c;
  cfg.distributed.powersgd_rank = rank;
  return cfg;
}

std::vector<std::string> names(const std::vector<TuneCandidate>& candidates) {
  std::vector<std::string> out;
  for (const TuneCandidate& c : candidates) out.push_back(c.name());
  return out;
}

TuneCandidate candidate(Compression c, CompressedSum sum, int64_t rank) {
  TuneCandidate t;
  t.compression = c;
  t.sum = sum;
  t.powersgd_rank = rank;
  return t;
}

}  // namespace

TEST_CASE("tuning: a wire's cost is the line through its two timed sizes, never below zero",
          "[config][tune]") {
  const ddp::WireCost c = ddp::fit_wire_cost(256, 110e-6, 1 << 20, 110e-6 + 0.01);
  CHECK(c.beta == Approx(0.01 / ((1 << 20) - 256)).epsilon(1e-12));
  CHECK(c.alpha == Approx(110e-6 - 256 * c.beta).epsilon(1e-12));
  CHECK(c.seconds(1 << 20) == Approx(110e-6 + 0.01).epsilon(1e-12));
  // Noise that makes the large collective the faster one: no negative slope.
  const ddp::WireCost noisy = ddp::fit_wire_cost(256, 2e-4, 4096, 1e-4);
  CHECK(noisy.beta == 0.0);
  CHECK(noisy.alpha == 2e-4);
  // A slope steep enough to put the line below zero at no floats: no negative latency.
  CHECK(ddp::fit_wire_cost(256, 1e-6, 512, 1e-3).alpha == 0.0);
}

TEST_CASE("tuning: lossiness orders none, float32 sums, 16-bit sums, then PowerSGD by rank",
          "[config][tune]") {
  const int none = ddp::lossiness(Compression::None, CompressedSum::Wire, 0);
  const int f32 = ddp::lossiness(Compression::Bf16, CompressedSum::Float32, 0);
  const int wire = ddp::lossiness(Compression::Bf16, CompressedSum::Wire, 0);
  CHECK(ddp::lossiness(Compression::Fp16, CompressedSum::Wire, 0) == wire);
  const int r4 = ddp::lossiness(Compression::PowerSgd, CompressedSum::Wire, 4);
  const int r1 = ddp::lossiness(Compression::PowerSgd, CompressedSum::Wire, 1);
  CHECK(none < f32);
  CHECK(f32 < wire);
  CHECK(wire < r4);
  CHECK(r4 < r1);
}

TEST_CASE("tuning: the candidates are the config's own first, none lossier, each a path",
          "[config][tune]") {
  SECTION("compression none on one node: lossless only, the caps as configured") {
    CHECK(names(ddp::tune_candidates(tuned(Compression::None), nodes(1, 2), false, 7.1)) ==
          std::vector<std::string>{"none, buckets 1 + 25 MiB"});
  }
  SECTION("bf16 on one node: float32 there unless compression_on_node") {
    TrainConfig cfg = tuned(Compression::Bf16);
    CHECK(names(ddp::tune_candidates(cfg, nodes(1, 2), false, 7.1)) ==
          std::vector<std::string>{"none, buckets 1 + 25 MiB"});
    cfg.distributed.compression_on_node = true;
    CHECK(names(ddp::tune_candidates(cfg, nodes(1, 2), false, 7.1)) ==
          std::vector<std::string>{"bf16 (16-bit sums), buckets 1 + 25 MiB",
                                   "none, buckets 1 + 25 MiB",
                                   "bf16 (float32 sums), buckets 1 + 25 MiB"});
  }
  SECTION("bf16 on 2 nodes x 2: its sums and none, hierarchical and flat") {
    CHECK(names(ddp::tune_candidates(tuned(Compression::Bf16), nodes(2, 2), false, 7.1)) ==
          std::vector<std::string>{
              "bf16 (16-bit sums), hierarchical, buckets 1 + 25 MiB",
              "none, hierarchical, buckets 1 + 25 MiB",
              "bf16 (float32 sums), hierarchical, buckets 1 + 25 MiB",
              "bf16 (16-bit sums), buckets 1 + 25 MiB",
              "none, buckets 1 + 25 MiB",
              "bf16 (float32 sums), buckets 1 + 25 MiB",
          });
  }
  SECTION("fp16 summed in float32: nothing summed in 16 bits") {
    TrainConfig cfg = tuned(Compression::Fp16);
    cfg.distributed.compression_sum = CompressedSum::Float32;
    CHECK(names(ddp::tune_candidates(cfg, nodes(2, 1), false, 7.1)) ==
          std::vector<std::string>{"fp16 (float32 sums), buckets 1 + 25 MiB",
                                   "none, buckets 1 + 25 MiB"});
  }
  SECTION("PowerSGD rank 2: its rank and above, bf16, none; never hierarchical") {
    CHECK(names(ddp::tune_candidates(tuned(Compression::PowerSgd, 2), nodes(2, 2), false, 7.1)) ==
          std::vector<std::string>{
              "none, hierarchical, buckets 1 + 25 MiB",
              "bf16 (float32 sums), hierarchical, buckets 1 + 25 MiB",
              "bf16 (16-bit sums), hierarchical, buckets 1 + 25 MiB",
              "powersgd rank 2, buckets 1 + 25 MiB",
              "none, buckets 1 + 25 MiB",
              "bf16 (float32 sums), buckets 1 + 25 MiB",
              "bf16 (16-bit sums), buckets 1 + 25 MiB",
              "powersgd rank 4, buckets 1 + 25 MiB",
              "powersgd rank 8, buckets 1 + 25 MiB",
          });
  }
  SECTION("the caps: as configured, one cap for all, the whole model in one bucket") {
    TrainConfig cfg = tuned(Compression::None);
    cfg.distributed.first_bucket_mb = 0.25;
    cfg.distributed.bucket_cap_mb = 0.5;
    CHECK(names(ddp::tune_candidates(cfg, nodes(2, 1), true, 7.1)) ==
          std::vector<std::string>{"none, buckets 0.25 + 0.5 MiB", "none, buckets 0.5 + 0.5 MiB",
                                   "none, buckets 8 + 8 MiB"});
    // A cap that holds the model already: no third.
    CHECK(ddp::tune_candidates(tuned(Compression::None), nodes(2, 1), true, 7.1).size() == 2);
  }
  SECTION("hierarchical off is kept; on is kept where it resolves") {
    TrainConfig cfg = tuned(Compression::None);
    cfg.distributed.hierarchical = ddp::Hierarchy::Off;
    CHECK(names(ddp::tune_candidates(cfg, nodes(2, 2), false, 1)) ==
          std::vector<std::string>{"none, buckets 1 + 25 MiB"});
    cfg.distributed.hierarchical = ddp::Hierarchy::On;
    cfg.distributed.compression = Compression::PowerSgd;  // refused with on: none of its kind
    CHECK(names(ddp::tune_candidates(cfg, nodes(2, 2), false, 1)) ==
          std::vector<std::string>{"none, hierarchical, buckets 1 + 25 MiB",
                                   "bf16 (float32 sums), hierarchical, buckets 1 + 25 MiB",
                                   "bf16 (16-bit sums), hierarchical, buckets 1 + 25 MiB"});
  }
}

TEST_CASE("tuning: a candidate applied sets its keys and turns tune off", "[config][tune]") {
  TrainConfig cfg = tuned(Compression::Bf16);
  cfg.distributed.compression_on_node = true;
  TuneCandidate none = candidate(Compression::None, CompressedSum::Float32, 0);
  none.first_bucket_mb = 8;
  none.bucket_cap_mb = 8;
  const TrainConfig a = none.applied(cfg);
  CHECK(a.distributed.tune == ddp::Tune::Off);
  CHECK(a.distributed.compression == Compression::None);
  CHECK(a.distributed.compression_sum == CompressedSum::Wire);  // float32 sums need 16 bits
  CHECK_FALSE(a.distributed.compression_on_node);               // so does compression_on_node
  CHECK(a.distributed.hierarchical == ddp::Hierarchy::Off);
  CHECK(a.distributed.first_bucket_mb == 8);
  CHECK(a.distributed.bucket_cap_mb == 8);
  CHECK_FALSE(ddp::gradient_path_refusal(a));
  TuneCandidate half = candidate(Compression::Bf16, CompressedSum::Float32, 0);
  half.hierarchical = true;
  const TrainConfig b = half.applied(cfg);
  CHECK(b.distributed.compression_on_node);
  CHECK(b.distributed.compression_sum == CompressedSum::Float32);
  CHECK(b.distributed.hierarchical == ddp::Hierarchy::On);
  const TrainConfig c = candidate(Compression::PowerSgd, CompressedSum::Wire, 4)
                            .applied(tuned(Compression::PowerSgd));
  CHECK(c.distributed.powersgd_rank == 4);
}

TEST_CASE("tuning: the least lossy within the tolerances of the fastest, else the fastest",
          "[config][tune]") {
  const auto none = candidate(Compression::None, CompressedSum::Wire, 0);
  const auto bf16 = candidate(Compression::Bf16, CompressedSum::Wire, 0);
  const auto f32 = candidate(Compression::Bf16, CompressedSum::Float32, 0);
  const auto psgd = candidate(Compression::PowerSgd, CompressedSum::Wire, 2);
  // bf16 gains 2% over none: not worth its rounding.
  CHECK(ddp::choose_candidate({{none, 0.100}, {bf16, 0.098}}, 0.03, 0.0) == 0);
  // It gains half: taken; float32 sums as fast (within 3%) and less lossy: those.
  CHECK(ddp::choose_candidate({{none, 0.100}, {bf16, 0.050}, {f32, 0.051}}, 0.03, 0.0) == 2);
  CHECK(ddp::choose_candidate({{none, 0.100}, {bf16, 0.050}, {f32, 0.060}}, 0.03, 0.0) == 1);
  // PowerSGD far ahead.
  CHECK(ddp::choose_candidate({{none, 0.100}, {f32, 0.050}, {psgd, 0.015}}, 0.03, 0.0) == 2);
  // Equal loss: the faster; equal everything: the first.
  auto caps = none;
  caps.bucket_cap_mb = 8;
  CHECK(ddp::choose_candidate({{none, 0.100}, {caps, 0.099}}, 0.03, 0.0) == 1);
  CHECK(ddp::choose_candidate({{none, 0.100}, {caps, 0.100}}, 0.03, 0.0) == 0);
  // A tenth of the time, but 9 us of it: below the least gain worth a rounding.
  CHECK(ddp::choose_candidate({{none, 10e-6}, {bf16, 1e-6}}, 0.03, 100e-6) == 0);
  CHECK(ddp::choose_candidate({{none, 1e-3}, {bf16, 0.5e-3}}, 0.03, 100e-6) == 1);
}
