// distributed.compression under mpiexec: buckets summed in bf16 or fp16. The collectives are
// exact on data every type represents, and on random data they are bitwise a reference that
// adds the ranks' 16-bit values in rank order, rounding after each addition, on both paths
// (MPI across nodes, and the shared-memory window with compression_on_node). Training is then
// the same bits on every path, sharded or not, and stays within what the rounding explains of
// float32 training; fp16's overflow reaches the non-finite check.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/compression.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/shard_plan.h"
#include "core/check.h"
#include "ddp/trainer.h"
#include "mpi_test_helpers.h"

using ddp::Compression;
using ddp_test::require_on_all_ranks;

namespace {

const std::vector<size_t> kSizes = {1, 3, 1000, 4099, 70001};

struct Path {
  const char* name;
  bool shared;   // the shared-memory window on one node ...
  bool on_node;  // ... compressing there too
};
const Path kPaths[] = {{"MPI across nodes", false, false},
                       {"shared memory, compression_on_node", true, true}};

using ddp_test::hashed_value;

// The reference: every rank's value cast, added in rank order with rounding, cast back.
float reference_sum(Compression format, int ranks, size_t i, int round) {
  uint16_t acc = 0;
  for (int q = 0; q < ranks; ++q) {
    const float v = hashed_value(q, i, round);
    uint16_t h = 0;
    ddp::compress(format, &v, 1, &h);
    if (q == 0) {
      acc = h;
    } else {
      ddp::add_compressed(format, &h, 1, &acc);
    }
  }
  float out = 0;
  ddp::decompress(format, &acc, 1, &out);
  return out;
}

// `v` rounded to the format and back.
float rounded(Compression format, float v) {
  uint16_t h = 0;
  ddp::compress(format, &v, 1, &h);
  float out = 0.0f;
  ddp::decompress(format, &h, 1, &out);
  return out;
}

// distributed.compression_sum float32: the ranks' 16-bit values added in float32 in rank order,
// rounded once.
float reference_float32_sum(Compression format, int ranks, size_t i, int round) {
  float sum = 0.0f;
  for (int q = 0; q < ranks; ++q) sum += rounded(format, hashed_value(q, i, round));
  return rounded(format, sum);
}

std::vector<ddp::Span> layout(size_t* total) {
  std::vector<ddp::Span> buckets;
  *total = 0;
  for (size_t k : kSizes) {
    buckets.push_back(ddp::Span{*total, k});
    *total += k;
  }
  return buckets;
}

// Runs `rounds` rounds of the gradient collective on a fresh communicator: fill writes the
// arena, check counts the wrong values of bucket b's result.
template <class Fill, class Check>
void run_rounds(Compression format, const Path& path, bool scatter, int rounds, Fill fill,
                Check check, ddp::CompressedSum sum = ddp::CompressedSum::Wire) {
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  const ddp::BucketWire wire{format, path.on_node, false, path.shared, sum};
  size_t total = 0;
  const std::vector<ddp::Span> buckets = layout(&total);
  float* grads = comm->gradient_arena(total, wire);
  REQUIRE_THROWS_AS(comm->gradient_arena(total, wire), ddp::Error);
  long errors = 0;
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < total; ++i) grads[i] = fill(comm->rank(), i, round);
    std::vector<std::shared_ptr<ddp::Work>> work;
    for (const ddp::Span& b : buckets)
      work.push_back(scatter ? comm->reduce_scatter_async(grads + b.offset, b.numel)
                             : comm->allreduce_async(grads + b.offset, b.numel, false));
    for (auto& w : work) w->wait();
    for (const ddp::Span& b : buckets) {
      const ddp::Span part =
          scatter ? ddp::shard_part(b.numel, comm->size(), comm->rank()) : ddp::Span{0, b.numel};
      for (size_t i = b.offset + part.offset; i < b.offset + part.end(); ++i)
        errors += !check(comm->size(), i, round, grads[i]);
    }
    require_on_all_ranks(*comm, errors, "round " + std::to_string(round));
  }
}

}  // namespace

TEST_CASE(
    "compressed allreduce and reduce-scatter: exact on representable data, the rank-order "
    "reference of each compression_sum on random data",
    "[mpi][compression]") {
  for (Compression format : {Compression::Bf16, Compression::Fp16}) {
    for (ddp::CompressedSum sum : {ddp::CompressedSum::Wire, ddp::CompressedSum::Float32}) {
      for (const Path& path : kPaths) {
        for (bool scatter : {false, true}) {
          INFO(ddp::to_string(format) << ", compression_sum " << ddp::to_string(sum) << ", "
                                      << path.name << ", "
                                      << (scatter ? "reduce-scatter" : "allreduce"));
          // Integers below 256 and their sums: exact in both types, whatever the order.
          run_rounds(
              format, path, scatter, 3,
              [](int r, size_t i, int round) {
                return static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1) + round);
              },
              [](int n, size_t i, int round, float got) {
                return got == static_cast<float>(n * (n + 1) / 2 * static_cast<int>(i % 7 + 1) +
                                                 n * round);
              },
              sum);
          const auto reference =
              sum == ddp::CompressedSum::Wire ? reference_sum : reference_float32_sum;
          run_rounds(
              format, path, scatter, 2, hashed_value,
              [format, reference](int n, size_t i, int round, float got) {
                const float want = reference(format, n, i, round);
                return std::memcmp(&got, &want, sizeof got) == 0;
              },
              sum);
        }
      }
    }
  }
}

TEST_CASE("compression_sum float32: nearer a float64 sum than the wire's", "[mpi][compression]") {
  for (Compression format : {Compression::Bf16, Compression::Fp16}) {
    // Against the float64 sum of the ranks' float32 values: at 2 ranks both sums round once;
    // from 3 on the wire's rounds after every addition and is further off on the whole.
    double err[2] = {0.0, 0.0};
    int n = 1;
    for (ddp::CompressedSum sum : {ddp::CompressedSum::Wire, ddp::CompressedSum::Float32}) {
      run_rounds(
          format, kPaths[0], false, 1, hashed_value,
          [&](int ranks, size_t i, int, float got) {
            double exact = 0.0;
            for (int q = 0; q < ranks; ++q) exact += hashed_value(q, i, 0);
            err[static_cast<int>(sum)] += std::fabs(static_cast<double>(got) - exact);
            n = ranks;
            return true;
          },
          sum);
    }
    INFO(ddp::to_string(format) << " at " << n << " ranks: total |error| " << err[0] << " (wire), "
                                << err[1] << " (float32 sums)");
    if (n >= 3) CHECK(err[1] < err[0]);
    if (n == 2) CHECK(err[1] == err[0]);
  }
}

TEST_CASE("compression rounds: not float32 sums, and none on shared memory unless asked",
          "[mpi][compression]") {
  auto float_sum = [](int ranks, size_t i, int round) {
    float s = hashed_value(0, i, round);
    for (int q = 1; q < ranks; ++q) s += hashed_value(q, i, round);
    return s;
  };
  // Without compression_on_node the window keeps float32: the rank-order float sums.
  run_rounds(
      Compression::Bf16, Path{"shared memory", true, false}, false, 1, hashed_value,
      [&](int ranks, size_t i, int round, float got) { return got == float_sum(ranks, i, round); });
  // Compressed, most sums differ from float32's (so the rounding did happen) by at most the
  // 16-bit rounding of the ranks' values and of each partial sum.
  for (Compression format : {Compression::Bf16, Compression::Fp16}) {
    INFO(ddp::to_string(format));
    const double unit = format == Compression::Bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    long differ = 0, total = 0;
    run_rounds(format, kPaths[0], false, 1, hashed_value, [&](int ranks, size_t i, int, float got) {
      double magnitudes = 0;
      for (int q = 0; q < ranks; ++q) magnitudes += std::fabs(hashed_value(q, i, 0));
      const double err = std::fabs(static_cast<double>(got) - float_sum(ranks, i, 0));
      ++total;
      differ += got != float_sum(ranks, i, 0);
      // Each value and each partial sum rounds once; fp16's subnormals round absolutely.
      return err <= unit * magnitudes * (2 * ranks) + ranks * std::ldexp(1.0, -24);
    });
    CHECK(differ > total / 2);
  }
}

TEST_CASE("fp16 overflows to infinity beyond 65504, like the hook; bf16 does not",
          "[mpi][compression]") {
  // 40960 = 1.25 x 2^15 is exact in both types, and so is bf16's sum of it over 2 or 4 ranks.
  for (const Path& path : kPaths) {
    INFO(path.name);
    run_rounds(
        Compression::Fp16, path, false, 1, [](int, size_t, int) { return 40960.0f; },
        [](int, size_t, int, float got) { return std::isinf(got) && got > 0; });
    run_rounds(
        Compression::Bf16, path, false, 1, [](int, size_t, int) { return 40960.0f; },
        [](int n, size_t, int, float got) { return got == 40960.0f * static_cast<float>(n); });
  }
}

namespace {

using ddp_test::bitwise_equal;
using ddp_test::max_abs_diff;
using ddp_test::train;

ddp::TrainConfig compressed(ddp::TrainConfig cfg, Compression format, bool shared, bool shard) {
  cfg.distributed.compression = format;
  cfg.distributed.shared_memory = shared;
  cfg.distributed.compression_on_node = shared;
  cfg.distributed.shard_optimizer = shard;
  cfg.output.dir += std::string("/") + ddp::to_string(format) + (shared ? "_shm" : "_mpi") +
                    (shard ? "_shard" : "");
  return cfg;
}

ddp::TrainConfig small_config(const std::string& name) {
  return ddp_test::two_epoch_config("ddp_compress_", name);
}

}  // namespace

TEST_CASE("compressed training: the same bits across nodes and on shared memory, sharded or not",
          "[mpi][compression]") {
  const ddp::TrainConfig sgd = small_config("paths_sgd");
  const ddp::TrainConfig adamw = ddp_test::with_schedule(
      ddp_test::with_adam(small_config("paths_adamw"), true, false), ddp::SchedulerName::Cosine);
  for (const auto& [format, plain] :
       {std::pair{Compression::Bf16, sgd}, std::pair{Compression::Fp16, adamw}}) {
    for (ddp::CompressedSum sum : {ddp::CompressedSum::Wire, ddp::CompressedSum::Float32}) {
      INFO(ddp::to_string(format) << ", compression_sum " << ddp::to_string(sum));
      ddp::TrainConfig base = plain;
      base.distributed.compression_sum = sum;
      base.output.dir += std::string("_") + ddp::to_string(sum);
      const auto across = train(compressed(base, format, false, false), MPI_COMM_WORLD);
      ddp_test::require_identical_replicas(across);
      for (const auto& [shared, shard] :
           {std::pair{true, false}, std::pair{false, true}, std::pair{true, true}}) {
        INFO((shared ? "shared memory" : "MPI") << (shard ? ", sharded" : ""));
        REQUIRE(
            bitwise_equal(train(compressed(base, format, shared, shard), MPI_COMM_WORLD), across));
      }
    }
  }
}

TEST_CASE("compressed training stays within the rounding's reach of float32 training",
          "[mpi][compression]") {
  const ddp::TrainConfig base = small_config("near");
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  const auto start = ddp::Trainer(base, *comm, nullptr).weights();  // before training
  const auto exact = train(base, MPI_COMM_WORLD);
  const double moved = max_abs_diff(exact, start);
  REQUIRE(moved > 0.01);
  // A 16-bit sum is the float32 one within a few units of its last place: 2^-8 (bf16) or 2^-11
  // (fp16) relative. Over 56 steps of SGD that moves the weights by about that fraction of how
  // far training moved them: bounded here by 4x the unit.
  for (const auto& [format, unit] : {std::pair{Compression::Bf16, std::ldexp(1.0, -8)},
                                     std::pair{Compression::Fp16, std::ldexp(1.0, -11)}}) {
    INFO(ddp::to_string(format));
    const double off =
        max_abs_diff(train(compressed(base, format, false, false), MPI_COMM_WORLD), exact);
    INFO("max |compressed - float32| = " << off << ", trained by up to " << moved);
    CHECK(off > 0.0);
    CHECK(off <= 4 * unit * moved);
  }
}

TEST_CASE("fp16 gradients beyond its range reach the non-finite check, which acts",
          "[mpi][compression][nan]") {
  const int n = ddp_test::world_size();
  const std::string dir = ddp_test::shared_scratch_dir("ddp_compress_", "overflow");
  // Sample 5 is (1e7, 1e7, 1e7). With write_overflow_data's weights every logit is 0 (each
  // row of the second layer sums to 0), so the loss is finite, but the second layer's weight
  // gradient is about 1e7 / (8 x ranks) in float32: beyond fp16's 65504 at 2 and 4 ranks.
  const ddp_test::OverflowData data = ddp_test::write_overflow_data(dir, 16 * n, 5, 1e7);
  ddp::TrainConfig cfg = ddp_test::overflow_config(data, dir);
  cfg.training.max_steps = 1;  // the step with sample 5
  auto finite = [](const std::vector<ddp::NamedTensor>& w) {
    for (const auto& t : w)
      for (float v : t.data)
        if (!std::isfinite(v)) return false;
    return true;
  };
  CHECK(finite(train(compressed(cfg, Compression::Bf16, false, false), MPI_COMM_WORLD)));
  std::string message = "(no error)";
  try {
    train(compressed(cfg, Compression::Fp16, false, false), MPI_COMM_WORLD);
  } catch (const ddp::CollectiveError& e) {
    message = e.what();
  }
  INFO(message);
  CHECK_THAT(message, Catch::Contains("step 1: ") &&
                          Catch::Contains("non-finite gradient value(s) after the allreduce"));
  cfg.training.nan_policy = ddp::NanPolicy::SkipStep;
  ddp::TrainSummary summary;
  const auto skipped =
      train(compressed(cfg, Compression::Fp16, false, false), MPI_COMM_WORLD, &summary);
  CHECK(summary.skipped_steps == 1);
  CHECK(finite(skipped));
}
