// The trainer on GPUs: every rank on its own device (NCCL) or sharing one (host-staged MPI),
// against the CPU trainer on the same data and against one rank on the global batch. Built
// twice: against the CPU emulation of CUDA and NCCL (ddp_gpu_emu_tests, every CI run) and
// against the real ones (ddp_gpu_tests, on GPU machines).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>

#include "comm/compression.h"
#include "comm/device_communicators.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/check.h"
#include "core/clock.h"
#include "ddp/trainer.h"
#include "kernels/cuda/cuda.h"
#include "gpu_training_setup.h"
#include "mpi_test_helpers.h"
#if defined(DDP_CUDA_EMULATION)
#include "cuda_emu.h"
#endif

namespace {

using ddp_test::require_identical_replicas;
using ddp_test::train;
using ddp_test::world_size;
using ddp_gpu_test::gpu_per_rank;
using ddp_gpu_test::scratch_dir;
using ddp_gpu_test::small_config;

using Weights = std::vector<ddp::NamedTensor>;

// Largest relative difference |a - b| / (|b| + 1e-3) over all tensors and ranks, agreed by
// every rank (infinite when the structure differs or a value is not finite).
double max_rel_diff(const Weights& a, const Weights& b) {
  double worst = a.size() == b.size() ? 0.0 : INFINITY;
  for (size_t t = 0; t < std::min(a.size(), b.size()); ++t) {
    if (a[t].name != b[t].name || a[t].data.size() != b[t].data.size()) worst = INFINITY;
    for (size_t i = 0; i < std::min(a[t].data.size(), b[t].data.size()); ++i) {
      const double d = std::fabs(static_cast<double>(a[t].data[i]) - b[t].data[i]) /
                       (std::fabs(static_cast<double>(b[t].data[i])) + 1e-3);
      worst = std::isfinite(d) ? std::max(worst, d) : INFINITY;
    }
  }
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  return ddp_test::max_over_ranks(*comm, worst);
}

// The compression test's arena: three allreduce buckets, then a reduce-scatter bucket of a
// part per rank.
constexpr size_t kCompressedBuckets[3] = {3, 1001, 2052};
constexpr size_t kScattered = 3056, kPart = 512;
constexpr size_t kOverflow = 1004;  // the third bucket's first value

// What rank r of n puts in that arena: values over many binades (the sum's roundings differ
// from a single one), fp16 subnormals among them, and at kOverflow 70000 / n, whose sum fp16
// cannot hold.
std::vector<float> compression_data(int r, int n) {
  std::mt19937 gen(99 + r);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-16, 10);
  std::vector<float> v(kScattered + n * kPart);
  for (float& x : v) x = std::ldexp(mant(gen), expo(gen));
  v[kOverflow] = 70000.0f / static_cast<float>(n);
  return v;
}

// comm/compression.h's sum: rank 0's values cast, each other rank's added in rank order with
// a rounding after every addition, the result cast back.
std::vector<float> compressed_sum(ddp::Compression format, int n) {
  const size_t total = kScattered + n * kPart;
  std::vector<uint16_t> acc(total), x(total);
  ddp::compress(format, compression_data(0, n).data(), total, acc.data());
  for (int r = 1; r < n; ++r) {
    ddp::compress(format, compression_data(r, n).data(), total, x.data());
    ddp::add_compressed(format, x.data(), total, acc.data());
  }
  std::vector<float> sum(total);
  ddp::decompress(format, acc.data(), total, sum.data());
  return sum;
}

// Runs every bucket's collective on `mine` in the arena, waits, and returns the arena.
std::vector<float> run_compression_buckets(ddp::ShardedCommunicator& comm, ddp::Backend& backend,
                                           float* arena, const std::vector<float>& mine) {
  const size_t total = mine.size();
  ddp::cuda_copy_bytes(arena, mine.data(), total * sizeof(float));
  std::vector<std::shared_ptr<ddp::Work>> works;
  size_t offset = 0;
  for (const size_t size : kCompressedBuckets) {
    works.push_back(comm.allreduce_async(arena + offset, size, false));
    offset += size;
  }
  works.push_back(comm.reduce_scatter_async(arena + kScattered, total - kScattered));
  for (auto& w : works) w->wait();
  for (auto& w : works) w->synchronize();
  backend.synchronize();
  std::vector<float> got(total);
  ddp::cuda_copy_bytes(got.data(), arena, total * sizeof(float));
  return got;
}

bool same_bits(const float* a, const float* b, size_t count) {
  return std::memcmp(a, b, count * sizeof(float)) == 0;
}

// Ranges of `got` that differ from the host's compressed sum, or in the reduce-scattered
// bucket outside this rank's part from this rank's own values, which stay.
long compression_errors(ddp::Compression format, int rank, int n, const std::vector<float>& got,
                        const std::vector<float>& mine) {
  const std::vector<float> want = compressed_sum(format, n);
  const size_t own = kScattered + rank * kPart, after = own + kPart;
  long errors = !same_bits(got.data(), want.data(), kScattered);
  errors += !same_bits(got.data() + own, want.data() + own, kPart);
  errors += !same_bits(got.data() + kScattered, mine.data() + kScattered, rank * kPart);
  errors += !same_bits(got.data() + after, mine.data() + after, got.size() - after);
  if (format == ddp::Compression::Fp16)
    errors += !(std::isinf(got[kOverflow]) && got[kOverflow] > 0);
  return errors;
}

// Trains `reference` and `candidate` from the same initial weights: the reference must move
// them by more than `min_moved`, and the candidate's weights (identical on every rank) stay
// within 4 units of 2^-`bits` of how far the reference moved them — a rounding to a `bits`-bit
// fraction now and then, each step moving a weight by a fraction of that distance.
void require_within_rounding(const ddp::TrainConfig& reference, const ddp::TrainConfig& candidate,
                             int bits, double min_moved, ddp::TrainSummary* summary = nullptr) {
  auto mpi = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  const Weights start = ddp::Trainer(reference, *mpi, nullptr).weights();
  const Weights want = train(reference, MPI_COMM_WORLD);
  const double moved = ddp_test::max_abs_diff(want, start);
  REQUIRE(moved > min_moved);
  INFO(ddp::to_string(candidate.distributed.backend));
  const Weights got = train(candidate, MPI_COMM_WORLD, summary);
  require_identical_replicas(got);
  const double off = ddp_test::max_abs_diff(got, want);
  INFO("max |candidate - reference| = " << off << ", trained by up to " << moved);
  CHECK(off <= 4 * std::ldexp(1.0, -bits) * moved);
}

}  // namespace

TEST_CASE("GPU training with host-staged MPI matches CPU training", "[gpu][staged]") {
  ddp::TrainConfig cpu = small_config("staged_cpu", ddp::DeviceChoice::Cpu);
  ddp::TrainConfig gpu = small_config("staged_gpu", ddp::DeviceChoice::Cuda);
  gpu.distributed.backend =
      ddp::BackendChoice::Mpi;  // several ranks may share one GPU on this path
  ddp::TrainSummary s_cpu, s_gpu;
  const Weights w_cpu = train(cpu, MPI_COMM_WORLD, &s_cpu);
  const Weights w_gpu = train(gpu, MPI_COMM_WORLD, &s_gpu);
  REQUIRE(s_gpu.steps == s_cpu.steps);
  REQUIRE(s_gpu.steps >= 6);
  require_identical_replicas(w_gpu);
  const double diff = max_rel_diff(w_gpu, w_cpu);
  INFO("max relative |w_gpu - w_cpu| = " << diff);
  REQUIRE(diff <= 1e-4);
  CHECK(s_gpu.train_loss == Approx(s_cpu.train_loss).epsilon(1e-4));
  CHECK(s_gpu.test_accuracy == Approx(s_cpu.test_accuracy).margin(1e-9));
  CHECK(s_gpu.evaluated);
  CHECK(s_gpu.comm_seconds >= 0);
  CHECK(s_gpu.hidden_seconds <= s_gpu.comm_seconds + 1e-9);

  // And one rank on the global batch, on the GPU too.
  ddp::TrainConfig single = gpu;
  single.training.batch_size = gpu.training.batch_size * world_size();
  single.output.dir = scratch_dir("staged_single");
  const Weights reference = train(single, MPI_COMM_SELF);
  REQUIRE(max_rel_diff(w_gpu, reference) <= 1e-4);
}

TEST_CASE("GPU training with AdamW, AMSGrad, warmup + cosine and clipping matches CPU training",
          "[gpu][staged][adam][schedule]") {
  // Clipping acts on the GPU's own norm (its fixed-order reduction) and never waits for it.
  ddp::TrainConfig cpu = ddp_test::with_schedule(
      ddp_test::with_adam(small_config("adam_cpu", ddp::DeviceChoice::Cpu), true, true),
      ddp::SchedulerName::Cosine);
  ddp::TrainConfig gpu = cpu;
  gpu.device = ddp::DeviceChoice::Cuda;
  gpu.distributed.backend = ddp::BackendChoice::Mpi;
  gpu.output.dir = scratch_dir("adam_gpu");
  ddp::TrainSummary s_cpu, s_gpu;
  const Weights w_cpu = train(cpu, MPI_COMM_WORLD, &s_cpu);
  const Weights w_gpu = train(gpu, MPI_COMM_WORLD, &s_gpu);
  REQUIRE(s_gpu.steps == s_cpu.steps);
  require_identical_replicas(w_gpu);
  const double diff = max_rel_diff(w_gpu, w_cpu);
  INFO("max relative |w_gpu - w_cpu| = " << diff);
  REQUIRE(diff <= 1e-4);
  CHECK(s_gpu.train_loss == Approx(s_cpu.train_loss).epsilon(1e-4));
}

// nccl-tests' check: rank r contributes r + 1 (+ the element index), so every sum is an exact
// float and the result must be == on every element, for both GPU communicators.
TEST_CASE("GPU communicators allreduce rank-valued data exactly", "[gpu][nccl][staged]") {
  auto host = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  const int n = host->size(), rank = host->rank();
  std::vector<ddp::BackendChoice> kinds = {ddp::BackendChoice::Mpi};
  if (gpu_per_rank()) kinds.push_back(ddp::BackendChoice::Nccl);
  long errors = 0;
  for (const ddp::BackendChoice kind : kinds) {
    auto mpi = ddp::make_mpi_communicator(MPI_COMM_WORLD);
    const int gpu = mpi->local_rank() % ddp::cuda_device_count();
    auto backend = ddp::make_cuda_backend(gpu);
    std::unique_ptr<ddp::GradientCommunicator> comm =
        kind == ddp::BackendChoice::Nccl
            ? ddp::make_nccl_communicator(*mpi, *backend, ddp::NcclOptions{})
            : ddp::make_staged_communicator(*mpi, *backend);
    const size_t sizes[3] = {1, 1000, 4099};
    const size_t total = sizes[0] + sizes[1] + sizes[2];
    float* arena = comm->gradient_arena(total, ddp::BucketWire{});
    std::vector<float> mine(total);
    for (size_t i = 0; i < total; ++i) mine[i] = static_cast<float>(rank + 1 + (i % 7));
    ddp::cuda_copy_bytes(arena, mine.data(), total * sizeof(float));
    std::vector<std::shared_ptr<ddp::Work>> works;
    size_t offset = 0;
    for (size_t b = 0; b < 3; ++b) {
      works.push_back(comm->allreduce_async(arena + offset, sizes[b], false));
      offset += sizes[b];
    }
    for (auto& w : works) w->wait();
    for (auto& w : works) w->synchronize();
    for (auto& w : works) errors += w->end_time() < w->start_time();
    backend->synchronize();
    std::vector<float> got(total);
    ddp::cuda_copy_bytes(got.data(), arena, total * sizeof(float));
    for (size_t i = 0; i < total; ++i) {
      const float want = static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 7));
      errors += got[i] != want;
    }
    INFO(ddp::to_string(kind));
    CHECK(errors == 0);
  }
  ddp_test::require_on_all_ranks(*host, errors, "elements that differ from the exact sum");
}

// distributed.compression over NCCL, against the host's compressed sum bitwise: three
// allreduce buckets (at offsets that are and are not multiples of four values: the casts' two
// paths) and a reduce-scatter bucket, of which only this rank's part comes back.
TEST_CASE("GPU compression over NCCL sums buckets in bf16 and fp16 as the host does",
          "[gpu][nccl][compression]") {
  if (!gpu_per_rank()) {
    WARN("skipped: needs a GPU per rank and NCCL");
    return;
  }
  auto mpi = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  const int n = mpi->size(), rank = mpi->rank();
  const std::vector<float> mine = compression_data(rank, n);
  long errors = 0;
  for (const ddp::Compression format : {ddp::Compression::Bf16, ddp::Compression::Fp16}) {
    INFO(ddp::to_string(format));
    auto backend = ddp::make_cuda_backend(mpi->local_rank() % ddp::cuda_device_count());
    auto comm = ddp::make_nccl_communicator(*mpi, *backend, ddp::NcclOptions{});
    const ddp::BucketWire wire{format, false, false, true};
    float* arena = comm->gradient_arena(mine.size(), wire);
    CHECK_THROWS_WITH(comm->gradient_arena(mine.size(), wire),
                      Catch::Contains("gradient_arena() called twice"));
    CHECK_THROWS_WITH(comm->allreduce_async(arena + 1, mine.size(), false),
                      Catch::Contains("not in this communicator's arena"));
    const std::vector<float> got = run_compression_buckets(*comm, *backend, arena, mine);
    const long bad = compression_errors(format, rank, n, got, mine);
    CHECK(bad == 0);
    errors += bad;
  }
  ddp_test::require_on_all_ranks(*mpi, errors, "compressed sums that differ from the host's");
}

TEST_CASE("GPU training in bf16 stays within the rounding's reach of CPU training in bf16",
          "[gpu][staged][nccl][compression]") {
  // The CPU reference sums in bf16 on one node's shared memory (compression_on_node), as the
  // host-staged GPU path does; NCCL compresses on one node anyway. GPU and CPU gradients differ
  // in float rounding, which a bf16 rounding now and then turns into one unit of 2^-8: the
  // weights stay within 4 units of how far training moved them, as for float32 vs bf16.
  // One epoch, and one GPU path per layout (NCCL with a GPU per rank, else host staging): the
  // emulation is the slowest part of CI.
  auto compressed = [](ddp::TrainConfig cfg) {
    cfg.distributed.compression = ddp::Compression::Bf16;
    cfg.distributed.compression_on_node = true;
    cfg.training.epochs = 1;
    return cfg;
  };
  const ddp::TrainConfig cpu = compressed(small_config("bf16_cpu", ddp::DeviceChoice::Cpu));
  ddp::TrainConfig gpu = compressed(small_config("bf16_gpu", ddp::DeviceChoice::Cuda));
  gpu.distributed.backend = gpu_per_rank() ? ddp::BackendChoice::Nccl : ddp::BackendChoice::Mpi;
  require_within_rounding(cpu, gpu, 8, 0.01);
}

TEST_CASE("GPU training with NCCL: N ranks equal 1 rank on the global batch", "[gpu][nccl]") {
  if (!gpu_per_rank()) {
    WARN("skipped: NCCL needs one GPU per rank on this node");
    return;
  }
  const int n = world_size();
  ddp::TrainConfig cfg = small_config("nccl_eq", ddp::DeviceChoice::Cuda);
  cfg.distributed.backend = ddp::BackendChoice::Nccl;
  cfg.optimizer.nesterov = true;
  cfg.output.trace = true;
  ddp::TrainSummary summary;
  const Weights distributed = train(cfg, MPI_COMM_WORLD, &summary);
  require_identical_replicas(distributed);
  {
    // The timeline: device-side spans from CUDA events, one process per rank.
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    long errors = 0;
    if (rank == 0) {
      std::ifstream file(cfg.output.dir + "/trace.json");
      std::stringstream text;
      text << file.rdbuf();
      for (const char* needle : {"\"compute stream\"", "\"NCCL stream\"", "\"allreduce bucket 0\"",
                                 "\"forward layers.0+relu.0\"", "\"backward layers.2+relu.1\"",
                                 "\"optimizer (sgd)\"", "\"bucket 0 ready\""}) {
        errors += text.str().find(needle) == std::string::npos;
      }
      for (int r = 0; r < n; ++r)
        errors += text.str().find("\"rank " + std::to_string(r) + " (") == std::string::npos;
    }
    auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
    ddp_test::require_on_all_ranks(*comm, errors, "things missing from trace.json");
  }

  ddp::TrainConfig single = cfg;
  single.training.batch_size = cfg.training.batch_size * n;
  single.output.dir = scratch_dir("nccl_eq_single");
  ddp::TrainSummary single_summary;
  const Weights reference = train(single, MPI_COMM_SELF, &single_summary);
  REQUIRE(single_summary.steps == summary.steps);
  const double diff = max_rel_diff(distributed, reference);
  INFO("max relative |w_N - w_1| = " << diff);
  REQUIRE(diff <= 1e-4);

  // And the CPU path on the same job: the device changes nothing but rounding.
  ddp::TrainConfig on_cpu = cfg;
  on_cpu.device = ddp::DeviceChoice::Cpu;
  on_cpu.distributed.backend = ddp::BackendChoice::Mpi;
  on_cpu.output.dir = scratch_dir("nccl_eq_cpu");
  const Weights cpu = train(on_cpu, MPI_COMM_WORLD);
  REQUIRE(max_rel_diff(distributed, cpu) <= 1e-4);
}

TEST_CASE("GPU training with gradient accumulation and max_steps", "[gpu][staged]") {
  ddp::TrainConfig cpu = small_config("accum_cpu", ddp::DeviceChoice::Cpu);
  cpu.training.accumulate_steps = 3;
  cpu.training.max_steps = 3;
  cpu.training.log_every = 1;
  ddp::TrainConfig gpu = cpu;
  gpu.device = ddp::DeviceChoice::Cuda;
  gpu.distributed.backend = gpu_per_rank() ? ddp::BackendChoice::Nccl : ddp::BackendChoice::Mpi;
  gpu.output.dir = scratch_dir("accum_gpu");
  ddp::TrainSummary s_cpu, s_gpu;
  const Weights w_cpu = train(cpu, MPI_COMM_WORLD, &s_cpu);
  const Weights w_gpu = train(gpu, MPI_COMM_WORLD, &s_gpu);
  REQUIRE(s_gpu.steps == 3);
  REQUIRE(s_cpu.steps == 3);
  REQUIRE(max_rel_diff(w_gpu, w_cpu) <= 1e-4);
  // Progress records of every step reach metrics.jsonl on rank 0, read a step behind the device.
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  long errors = 0;
  if (rank == 0) {
    std::ifstream metrics(gpu.output.dir + "/metrics.jsonl");
    int train_records = 0, summaries_on_cuda = 0;
    for (std::string line; std::getline(metrics, line);) {
      train_records += line.find("\"type\":\"train\"") != std::string::npos;
      summaries_on_cuda += line.find("\"type\":\"summary\"") != std::string::npos &&
                           line.find("\"device\":\"cuda:") != std::string::npos;
    }
    errors += train_records != 3;
    errors += summaries_on_cuda != 1;
  }
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  ddp_test::require_on_all_ranks(*comm, errors, "missing metrics records");
}

TEST_CASE("GPU training: a bad label is reported with its step on every rank", "[gpu][errors]") {
  // CSV data whose 30th row has label 7 in a 5-class model.
  const std::string dir = scratch_dir("bad_label");
  const std::string path = dir + "/bad.csv";
  {
    std::ofstream csv(path);
    for (int r = 0; r < 48; ++r) {
      for (int c = 0; c < 12; ++c) csv << (r * 0.01 + c * 0.1) << ",";
      csv << (r == 29 ? 7 : r % 5) << "\n";
    }
  }
  ddp::TrainConfig cfg = small_config("bad_label_run", ddp::DeviceChoice::Cuda);
  cfg.distributed.backend = ddp::BackendChoice::Mpi;
  cfg.data = ddp::DataConfig{};
  cfg.data.format = ddp::DataFormat::Csv;
  cfg.data.train.path = path;
  cfg.data.shuffle = false;
  // The loader checks labels before any kernel sees them; that is the message users get.
  std::string message;
  try {
    train(cfg, MPI_COMM_WORLD);
  } catch (const std::exception& e) {
    message = e.what();
  }
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  ddp_test::require_on_all_ranks(*comm, message.find("label") == std::string::npos,
                                 "ranks without an error naming the label");
}

// One epoch of the small model in a 16-bit training.precision on `device`, the GPU ranks on
// NCCL where each has its own GPU, else host staging.
ddp::TrainConfig mixed_config(const std::string& name, ddp::DeviceChoice device,
                              ddp::Precision precision) {
  ddp::TrainConfig cfg = small_config(name, device);
  cfg.training.precision = precision;
  cfg.training.epochs = 1;
  if (device == ddp::DeviceChoice::Cuda)
    cfg.distributed.backend = gpu_per_rank() ? ddp::BackendChoice::Nccl : ddp::BackendChoice::Mpi;
  return cfg;
}

TEST_CASE("GPU training in training.precision bf16 follows CPU training in bf16",
          "[gpu][precision]") {
  // Both sides round the same float32 values to bf16 at the same points, so every GEMM sees
  // the same operand bits; only the order of the float32 accumulation differs (WMMA tiles
  // against oneDNN or Eigen), by a few units of 2^-24 of a sum. A bf16 rounding of an
  // activation or a gradient now and then turns that into one unit of 2^-8 of the value, and
  // a step moves a weight by a fraction of how far training moves it: the weights stay within
  // 4 units of 2^-8 of how far training moved them, as for float32 against bf16 compression.
  const ddp::TrainConfig cpu =
      mixed_config("bf16_train_cpu", ddp::DeviceChoice::Cpu, ddp::Precision::Bf16);
  const ddp::TrainConfig gpu =
      mixed_config("bf16_train_gpu", ddp::DeviceChoice::Cuda, ddp::Precision::Bf16);
  require_within_rounding(cpu, gpu, 8, 0.01);
}

TEST_CASE("GPU training in training.precision fp16 trains, close to float32", "[gpu][precision]") {
  // fp16 with loss scaling on (training.loss_scaling auto) at its first scale, 2^16, which
  // this model's gradients never overflow: a small learning rate and one short epoch. fp16
  // keeps 10 fraction bits: the weights stay within 4 units of 2^-11 of how far float32
  // training moved them, and the loss is finite.
  auto short_run = [](ddp::TrainConfig cfg) {
    cfg.optimizer.lr = 0.01;
    return cfg;
  };
  const ddp::TrainConfig fp32 =
      short_run(mixed_config("fp16_train_fp32", ddp::DeviceChoice::Cuda, ddp::Precision::Fp32));
  const ddp::TrainConfig fp16 =
      short_run(mixed_config("fp16_train_fp16", ddp::DeviceChoice::Cuda, ddp::Precision::Fp16));
  ddp::TrainSummary summary;
  require_within_rounding(fp32, fp16, 11, 0.001, &summary);
  CHECK(std::isfinite(summary.train_loss));
  CHECK(summary.steps > 0);
  CHECK(summary.scaler_skipped_steps == 0);  // 2^16 never overflows here
}

TEST_CASE("GPU training in fp16: an overflowing loss scale backs off, and a resume is bitwise",
          "[gpu][precision][resume]") {
  // A first scale of 2^24 times a gradient of the loss up to 1/8 (batch 8) is past fp16's
  // 65504 where the gradient of the loss is rounded to fp16: the first steps overflow in the
  // 16-bit backward pass itself, every rank skips them alike and the scale halves until it
  // fits; growth every 5 clean steps overflows again now and then. The scale and its growth
  // count are in the checkpoint: stopped anywhere and resumed, the run is bitwise the whole.
  ddp::TrainConfig cfg =
      mixed_config("fp16_scaling", ddp::DeviceChoice::Cuda, ddp::Precision::Fp16);
  cfg.training.epochs = 3;
  cfg.training.loss_scale_init = 0x1p24;
  cfg.training.loss_scale_growth_interval = 5;
  ddp::TrainSummary whole_summary;
  const Weights whole = train(cfg, MPI_COMM_WORLD, &whole_summary);
  require_identical_replicas(whole);
  CHECK(whole_summary.scaler_skipped_steps >= 3);  // 2^24, 2^23, 2^22 overflow at least
  CHECK(whole_summary.scaler_skipped_steps < whole_summary.steps / 2);
  CHECK(whole_summary.skipped_steps == 0);
  CHECK(whole_summary.loss_scale < 0x1p24);
  CHECK(std::isfinite(whole_summary.train_loss));
  for (const auto& t : whole)
    for (float v : t.data) REQUIRE(std::isfinite(v));
  ddp::TrainConfig first = cfg;
  first.output.dir = scratch_dir("fp16_scaling_first");
  first.training.max_steps = whole_summary.steps / 2 + 1;
  first.checkpoint.every_steps = 1000;  // the last step is checkpointed at the end
  ddp::TrainSummary first_summary;
  train(first, MPI_COMM_WORLD, &first_summary);
  REQUIRE(first_summary.steps == first.training.max_steps);
  ddp::TrainConfig rest = first;
  rest.training.max_steps = 0;
  rest.training.resume = "auto";
  ddp::TrainSummary rest_summary;
  const Weights resumed = train(rest, MPI_COMM_WORLD, &rest_summary);
  REQUIRE(rest_summary.resumed);
  CHECK(rest_summary.scaler_skipped_steps == whole_summary.scaler_skipped_steps);
  CHECK(rest_summary.loss_scale == whole_summary.loss_scale);
  require_identical_replicas(resumed);
  REQUIRE(ddp_test::bitwise_equal(resumed, whole));
}

#if defined(DDP_CUDA_EMULATION)
// The emulated NCCL fails rank 1's third allreduce asynchronously (DDP_NCCL_EMU_FAIL, see
// emu/nccl_emu.h); rank 0, waiting for it, gives up after the emulation's timeout. Both
// must stop with an error naming NCCL, the bucket and the step: no rank may hang or go on.
TEST_CASE("GPU training: a NCCL failure on one rank stops every rank", "[gpu][nccl][errors]") {
  if (world_size() < 2 || !gpu_per_rank()) {
    WARN("skipped: needs 2 ranks with a GPU each");
    return;
  }
  setenv("DDP_NCCL_EMU_FAIL", "1:3", 1);
  setenv("DDP_NCCL_EMU_TIMEOUT_S", "2", 1);
  ddp::TrainConfig cfg = small_config("nccl_fail", ddp::DeviceChoice::Cuda);
  cfg.distributed.backend = ddp::BackendChoice::Nccl;
  std::string message;
  const double start = ddp::seconds_now();
  try {
    train(cfg, MPI_COMM_WORLD);
  } catch (const std::exception& e) {
    message = e.what();
  }
  const double seconds = ddp::seconds_now() - start;
  unsetenv("DDP_NCCL_EMU_FAIL");
  unsetenv("DDP_NCCL_EMU_TIMEOUT_S");
  INFO(message);
  long errors = 0;
  errors += message.find("gradient allreduce of bucket") == std::string::npos;
  errors += message.find("NCCL") == std::string::npos && message.find("nccl") == std::string::npos;
  errors += message.find("epoch 1 step") == std::string::npos;
  errors += seconds > 30;
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  ddp_test::require_on_all_ranks(*comm, errors, "ranks without the expected NCCL error");
}
#endif

TEST_CASE("GPU training: steps replayed as CUDA graphs give the eager steps' bits",
          "[gpu][nccl][graphs]") {
  if (!gpu_per_rank()) {
    WARN("skipped: NCCL needs one GPU per rank on this node");
    return;
  }
  // What a graph bakes in differs between these: the optimizer and its schedule (after the
  // graph), clipping, 16-bit operands and compressed buckets, a loss scale that changes.
  struct Case {
    const char* name;
    std::function<void(ddp::TrainConfig&)> set;
    bool constant_key;  // one loss coefficient: every step but the first few and the logged
  };
  const Case cases[] = {
      {"sgd nesterov, clipped",
       [](ddp::TrainConfig& c) {
         c.optimizer.nesterov = true;
         c.training.clip_grad_norm = 0.05;
       },
       true},
      {"adamw, cosine, bf16 operands and buckets",
       [](ddp::TrainConfig& c) {
         c.optimizer.name = ddp::OptimizerName::AdamW;
         c.optimizer.lr = 0.01;
         c.scheduler.name = ddp::SchedulerName::Cosine;
         c.training.precision = ddp::Precision::Bf16;
         c.distributed.compression = ddp::Compression::Bf16;
         c.distributed.compression_on_node = true;
       },
       true},
      {"fp16, loss scale growing every 3 steps",
       [](ddp::TrainConfig& c) {
         c.training.precision = ddp::Precision::Fp16;
         c.training.loss_scale_growth_interval = 3;
       },
       false},
  };
  for (const Case& k : cases) {
    INFO(k.name);
    ddp::TrainConfig eager = small_config("graphs_eager", ddp::DeviceChoice::Cuda);
    eager.distributed.backend = ddp::BackendChoice::Nccl;
    eager.training.epochs = 1;
    eager.training.log_every = 5;  // logged steps run eagerly in between
    k.set(eager);
    eager.training.cuda_graphs = false;
    ddp::TrainConfig graphed = eager;
    graphed.training.cuda_graphs = true;
    graphed.output.dir = scratch_dir("graphs_graphed");
    ddp::TrainSummary eager_sum, graphed_sum;
    const Weights want = train(eager, MPI_COMM_WORLD, &eager_sum);
    const Weights got = train(graphed, MPI_COMM_WORLD, &graphed_sum);
    CHECK(eager_sum.graph_steps == 0);
    // Eager: the first step of each kind (upload slot, loss slot, loss coefficient: at most
    // 4 kinds with one coefficient) and the logged steps.
    CHECK(graphed_sum.graph_steps > 0);
    if (k.constant_key)
      CHECK(graphed_sum.graph_steps >= graphed_sum.steps - 4 - graphed_sum.steps / 5);
    CHECK(graphed_sum.train_loss == eager_sum.train_loss);
    require_identical_replicas(got);
    REQUIRE(ddp_test::max_abs_diff(got, want) == 0.0);
  }
}

#if defined(DDP_CUDA_EMULATION)
// Host calls per training step, counted by the emulation (ddp_emu::runtime_calls): one rank
// with NCCL, the calls of 10 steps less those of 4 (start-up, the final evaluation and the
// end cancel), per step and by function, eager and as graphs. The bounds are today's counts: a
// change that adds calls to every step shows here.
// Eager, measured: 14 kernel launches and 88 calls in all per step, of which 14
// cudaEventRecord, 14 cudaGetLastError, 11 cudaEventSynchronize and 9 cudaEventElapsedTime
// (one of each the last bucket's ready time, for the straggler report), 8
// cudaStreamWaitEvent, 3 cudaMemcpyAsync, 3 ncclAllReduce and 9 ncclCommGetAsyncError (a wait
// reads NCCL's error state once more after its event passed); cudaEventQuery (about 3) and so
// the total vary with timing, hence the margin.
// As graphs: 1 cudaGraphLaunch, the optimizer's kernel and its cudaGetLastError, 4
// cudaEventRecord (the upload slot's release, the loss totals after the graph, the fence, the
// next batch's upload), 2 cudaStreamWaitEvent, 2 cudaMemcpyAsync (the next batch's upload), 2
// cudaEventSynchronize and about 1 cudaEventQuery: 14.
constexpr double kEagerStepLaunches = 14, kEagerStepCalls = 94;
constexpr double kGraphStepLaunches = 1, kGraphStepCalls = 17;
TEST_CASE("GPU training: runtime calls per step, eager and as graphs", "[gpu][nccl][calls]") {
  if (world_size() != 1 || !gpu_per_rank()) {
    WARN("skipped: counted on one rank with a GPU");
    return;
  }
  auto count = [](int64_t steps, bool graphs) {
    ddp::TrainConfig cfg = small_config("calls", ddp::DeviceChoice::Cuda);
    cfg.distributed.backend = ddp::BackendChoice::Nccl;
    cfg.training.max_steps = steps;  // within the first epoch of 12 steps
    cfg.training.cuda_graphs = graphs;
    ddp_emu::reset_runtime_calls();
    train(cfg, MPI_COMM_WORLD);
    return ddp_emu::runtime_calls();
  };
  for (const bool graphs : {false, true}) {
    const ddp_emu::RuntimeCalls shorter = count(4, graphs), longer = count(10, graphs);
    const int64_t steps = 6;
    std::ostringstream by_function;
    for (const auto& [name, calls] : longer.api) {
      const int64_t diff = calls - shorter.of(name);
      if (diff != 0) by_function << "\n  " << name << ": " << static_cast<double>(diff) / steps;
    }
    const double launches =
        static_cast<double>(longer.kernel_launches - shorter.kernel_launches) / steps;
    const double total = static_cast<double>(longer.total() - shorter.total()) / steps;
    const double graph_launches =
        static_cast<double>(longer.graph_launches - shorter.graph_launches) / steps;
    WARN("runtime calls per " << (graphs ? "graph" : "eager") << " step: " << total << " ("
                              << launches << " kernel launches, " << graph_launches
                              << " graph launches)" << by_function.str());
    CHECK(launches <= (graphs ? kGraphStepLaunches : kEagerStepLaunches));
    CHECK(total <= (graphs ? kGraphStepCalls : kEagerStepCalls));
    CHECK(graph_launches == (graphs ? 1.0 : 0.0));
  }
}
#endif

TEST_CASE("GPU training: NCCL with more ranks than GPUs on a node is refused on every rank",
          "[gpu][nccl][errors]") {
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  if (ddp::cuda_device_count() >= comm->local_size()) {
    WARN("skipped: every rank of this node has a GPU of its own");
    return;
  }
  ddp::TrainConfig cfg = small_config("nccl_shared", ddp::DeviceChoice::Cuda);
  cfg.distributed.backend = ddp::BackendChoice::Nccl;
  std::string message;
  try {
    train(cfg, MPI_COMM_WORLD);
  } catch (const std::exception& e) {
    message = e.what();
  }
  INFO(message);
  ddp_test::require_on_all_ranks(*comm,
                                 message.find("NCCL needs one GPU per rank") == std::string::npos,
                                 "ranks without the one-GPU-per-rank error");
}

TEST_CASE("GPU training, sharded optimizer over NCCL: the unsharded weights within 1e-6",
          "[gpu][nccl][shard]") {
  if (!gpu_per_rank()) {
    WARN("skipped: needs a GPU per rank and NCCL");
    return;
  }
  // AdamW with AMSGrad (three state arrays), warmup + cosine and clipping (the norm from the
  // parts' partial sums, summed in another order than the whole arena's: hence a tolerance).
  // One case only: the emulation runs every GPU thread on a CPU thread.
  ddp::TrainConfig cfg = ddp_test::with_schedule(
      ddp_test::with_adam(small_config("shard_nccl", ddp::DeviceChoice::Cuda), true, true),
      ddp::SchedulerName::Cosine);
  cfg.distributed.backend = ddp::BackendChoice::Nccl;
  cfg.training.log_every = 3;  // logged steps gather the norm
  ddp::TrainConfig shard = cfg;
  shard.distributed.shard_optimizer = true;
  shard.output.dir = scratch_dir("shard_nccl_on");
  ddp::TrainSummary s_whole, s_shard;
  const Weights whole = train(cfg, MPI_COMM_WORLD, &s_whole);
  const Weights sharded = train(shard, MPI_COMM_WORLD, &s_shard);
  REQUIRE(s_shard.steps == s_whole.steps);
  REQUIRE(s_shard.steps >= 6);
  require_identical_replicas(sharded);
  const double diff = max_rel_diff(sharded, whole);
  INFO("max relative |sharded - unsharded| = " << diff);
  REQUIRE(diff <= 1e-6);
}

TEST_CASE("GPU training: the sharded optimizer with host-staged buckets is refused on every rank",
          "[gpu][staged][errors]") {
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  // device: auto finds the GPU at run time (device: cuda is refused by the config check).
  ddp::TrainConfig cfg = small_config("shard_staged", ddp::DeviceChoice::Auto);
  cfg.distributed.backend = ddp::BackendChoice::Mpi;
  cfg.distributed.shard_optimizer = true;
  std::string message;
  try {
    train(cfg, MPI_COMM_WORLD);
  } catch (const std::exception& e) {
    message = e.what();
  }
  INFO(message);
  ddp_test::require_on_all_ranks(
      *comm,
      message.find("distributed.shard_optimizer: on GPUs needs distributed.backend: nccl (or "
                   "auto); mpi stages the buckets through host memory and has no sharded "
                   "path") == std::string::npos,
      "ranks without the sharded-optimizer error");
}

TEST_CASE("GPU communicators refuse memory outside their arena and unequal NCCL parts",
          "[gpu][staged][nccl][errors]") {
  std::vector<ddp::BackendChoice> kinds = {ddp::BackendChoice::Mpi};
  if (gpu_per_rank()) kinds.push_back(ddp::BackendChoice::Nccl);
  for (const ddp::BackendChoice kind : kinds) {
    INFO(ddp::to_string(kind));
    auto mpi = ddp::make_mpi_communicator(MPI_COMM_WORLD);
    auto backend = ddp::make_cuda_backend(mpi->local_rank() % ddp::cuda_device_count());
    if (kind == ddp::BackendChoice::Mpi) {
      auto comm = ddp::make_staged_communicator(*mpi, *backend);
      float* arena = comm->gradient_arena(64, ddp::BucketWire{});
      CHECK_THROWS_WITH(comm->gradient_arena(64, ddp::BucketWire{}),
                        Catch::Contains("gradient_arena() called twice"));
      CHECK_THROWS_WITH(comm->allreduce_async(arena + 32, 64, false),
                        Catch::Contains("must lie in this communicator's gradient arena"));
      continue;
    }
    auto comm = ddp::make_nccl_communicator(*mpi, *backend, ddp::NcclOptions{});
    float* arena = comm->gradient_arena(64, ddp::BucketWire{});
    CHECK_THROWS_WITH(comm->gradient_arena(64, ddp::BucketWire{}),
                      Catch::Contains("gradient_arena() called twice"));
    // NCCL's parts must be equal: a bucket not padded to them is refused (one rank's single
    // part always is).
    if (mpi->size() > 1) {
      CHECK_THROWS_WITH(comm->reduce_scatter_async(arena, 33), Catch::Contains("is not padded to"));
    }
    comm->parameter_arena(64, true);
    CHECK_THROWS_WITH(comm->parameter_arena(64, true),
                      Catch::Contains("parameter_arena() called twice"));
  }
}

TEST_CASE("GPU training stopped and resumed continues as the uninterrupted run", "[gpu][resume]") {
  ddp::TrainConfig whole = small_config("resume_whole", ddp::DeviceChoice::Cuda);
  whole.distributed.backend = gpu_per_rank() ? ddp::BackendChoice::Nccl : ddp::BackendChoice::Mpi;
  const Weights w_whole = train(whole, MPI_COMM_WORLD);
  ddp::TrainConfig first = whole;
  first.output.dir = scratch_dir("resume_first");
  first.training.max_steps = 5;  // mid-epoch: 96 / (8 N) steps per epoch
  first.checkpoint.every_steps = 100;
  ddp::TrainSummary s_first;
  train(first, MPI_COMM_WORLD, &s_first);
  REQUIRE(s_first.steps == 5);
  ddp::TrainConfig rest = first;
  rest.training.max_steps = 0;
  rest.training.resume = "auto";
  ddp::TrainSummary s_rest;
  const Weights w_rest = train(rest, MPI_COMM_WORLD, &s_rest);
  REQUIRE(s_rest.resumed);
  require_identical_replicas(w_rest);
  // Momentum and position came back from the device: any loss would show at 1e-3 or more.
  REQUIRE(max_rel_diff(w_rest, w_whole) <= 1e-6);
  // The checkpoint is device-neutral: the CPU continues it too.
  ddp::TrainConfig on_cpu = rest;
  on_cpu.device = ddp::DeviceChoice::Cpu;
  on_cpu.distributed.backend = ddp::BackendChoice::Mpi;
  REQUIRE(max_rel_diff(train(on_cpu, MPI_COMM_WORLD), w_whole) <= 1e-4);
}

TEST_CASE("GPU training: nan_policy skip_step skips the non-finite step on every rank",
          "[gpu][nan]") {
  const int n = world_size();
  const std::string dir = ddp_test::shared_scratch_dir("ddp_gpu_test_", "nan");
  const ddp_test::OverflowData data = ddp_test::write_overflow_data(dir, 16 * n, 5);
  ddp::TrainConfig cfg = ddp_test::overflow_config(data, dir);
  cfg.device = ddp::DeviceChoice::Cuda;
  cfg.distributed.backend = gpu_per_rank() ? ddp::BackendChoice::Nccl : ddp::BackendChoice::Mpi;
  cfg.distributed.timeout_s = 60;
  cfg.training.nan_policy = ddp::NanPolicy::SkipStep;
  ddp::TrainSummary s_gpu, s_cpu;
  const Weights w_gpu = train(cfg, MPI_COMM_WORLD, &s_gpu);
  CHECK(s_gpu.skipped_steps == 2);
  ddp::TrainConfig cpu = cfg;
  cpu.device = ddp::DeviceChoice::Cpu;
  cpu.distributed.backend = ddp::BackendChoice::Mpi;
  const Weights w_cpu = train(cpu, MPI_COMM_WORLD, &s_cpu);
  CHECK(s_cpu.skipped_steps == 2);
  REQUIRE(max_rel_diff(w_gpu, w_cpu) <= 1e-4);
}
