// Tests for the YAML config loader: every key mapped, --set overrides, strict types, unknown
// keys, every validation rule, file errors, the to_yaml round trip, and the shipped configs.
// Messages are compared in full: they are the user interface of this module.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cfloat>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "config/resources.h"
#include "config/schema.h"
#include "core/check.h"
#include "ddp/config.h"
#include "kernels/cuda/cuda.h"
#include "test_helpers.h"

#if defined(DDP_SOURCE_DIR)
static const std::string kSourceDir = DDP_SOURCE_DIR;
#elif defined(DDP_TEST_DATA_DIR)
static const std::string kSourceDir = std::string(DDP_TEST_DATA_DIR) + "/../..";
#else
#error "define DDP_SOURCE_DIR (the source tree root), e.g. -DDDP_SOURCE_DIR=\"\\\"/work/main\\\"\""
#endif

namespace {

namespace fs = std::filesystem;
using ddp::TrainConfig;

// A valid synthetic config: the smallest file every other case builds on.
const std::string kMinimal = "model:\n  layers: [4, 3]\ndata:\n  train:\n    samples: 10\n";

TrainConfig parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return ddp::parse_config(text, "run.yaml", overrides);
}

/// kMinimal plus more top-level sections (they must not repeat model or data).
TrainConfig parse_min(const std::string& extra, const std::vector<std::string>& overrides = {}) {
  return parse(kMinimal + extra, overrides);
}

using ddp_test::error_of;  // a yaml-cpp exception leaking out fails the test

std::string parse_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { parse(text, overrides); });
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ddp_config_test_XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name, const std::string& text = "x") const {
    std::string p = path_ + "/" + name;
    std::ofstream(p) << text;
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// A config built in code that validates; each rule below breaks exactly one field of it.
TrainConfig valid_config() {
  TrainConfig c;
  c.model.layers = {4, 3};
  c.data.train.samples = 10;
  return c;
}

void require_same(const TrainConfig& a, const TrainConfig& b) {
  CHECK(a.device == b.device);
  CHECK(a.model.layers == b.model.layers);
  CHECK(a.model.activation == b.model.activation);
  CHECK(a.model.init_from == b.model.init_from);
  CHECK(a.data.format == b.data.format);
  CHECK(a.data.dir == b.data.dir);
  for (auto split : {&ddp::DataConfig::train, &ddp::DataConfig::test}) {
    CHECK((a.data.*split).images == (b.data.*split).images);
    CHECK((a.data.*split).features == (b.data.*split).features);
    CHECK((a.data.*split).labels == (b.data.*split).labels);
    CHECK((a.data.*split).path == (b.data.*split).path);
    CHECK((a.data.*split).samples == (b.data.*split).samples);
  }
  CHECK(a.data.shuffle == b.data.shuffle);
  CHECK(a.data.drop_last == b.data.drop_last);
  CHECK(a.data.csv_header == b.data.csv_header);
  CHECK(a.data.seed == b.data.seed);
  CHECK(a.data.prefetch == b.data.prefetch);
  CHECK(a.optimizer.name == b.optimizer.name);
  CHECK(a.optimizer.lr == b.optimizer.lr);
  CHECK(a.optimizer.momentum == b.optimizer.momentum);
  CHECK(a.optimizer.dampening == b.optimizer.dampening);
  CHECK(a.optimizer.weight_decay == b.optimizer.weight_decay);
  CHECK(a.optimizer.nesterov == b.optimizer.nesterov);
  CHECK(a.training.epochs == b.training.epochs);
  CHECK(a.training.batch_size == b.training.batch_size);
  CHECK(a.training.accumulate_steps == b.training.accumulate_steps);
  CHECK(a.training.seed == b.training.seed);
  CHECK(a.training.log_every == b.training.log_every);
  CHECK(a.training.max_steps == b.training.max_steps);
  CHECK(a.training.print_shapes == b.training.print_shapes);
  CHECK(a.distributed.backend == b.distributed.backend);
  CHECK(a.distributed.bucket_cap_mb == b.distributed.bucket_cap_mb);
  CHECK(a.distributed.first_bucket_mb == b.distributed.first_bucket_mb);
  CHECK(a.distributed.shared_memory == b.distributed.shared_memory);
  CHECK(a.distributed.gpus == b.distributed.gpus);
  CHECK(a.distributed.nccl_algo == b.distributed.nccl_algo);
  CHECK(a.distributed.timeout_s == b.distributed.timeout_s);
  CHECK(a.output.dir == b.output.dir);
  CHECK(a.output.save_model == b.output.save_model);
  CHECK(a.output.trace == b.output.trace);
  CHECK(a.output.trace_steps == b.output.trace_steps);
  CHECK(a.output.flight_recorder == b.output.flight_recorder);
  CHECK(a.output.flight_record_at_exit == b.output.flight_record_at_exit);
  CHECK(a.output.straggler_threshold == b.output.straggler_threshold);
  CHECK(a.output.peak_tflops == b.output.peak_tflops);
  CHECK(a.training.resume == b.training.resume);
  CHECK(a.training.nan_policy == b.training.nan_policy);
  CHECK(a.checkpoint.dir == b.checkpoint.dir);
  CHECK(a.checkpoint.every_steps == b.checkpoint.every_steps);
  CHECK(a.checkpoint.every_epochs == b.checkpoint.every_epochs);
  CHECK(a.checkpoint.keep_last == b.checkpoint.keep_last);
}

}  // namespace

TEST_CASE("config: keys left out keep the struct defaults", "[config]") {
  TrainConfig c = parse(kMinimal);
  TrainConfig expected;  // the header's defaults are the reference
  expected.model.layers = {4, 3};
  expected.data.train.samples = 10;
  expected.source = "run.yaml";
  require_same(c, expected);
  CHECK(c.source == "run.yaml");
  CHECK(c.optimizer.lr == 0.01);  // spot-check the header itself did not drift
  CHECK(c.distributed.bucket_cap_mb == 25.0);
  CHECK(c.output.dir == "runs/default");
}

TEST_CASE("config: an empty section is the same as a missing one", "[config]") {
  TrainConfig c = parse_min("training:\noptimizer: ~\n");
  CHECK(c.training.epochs == TrainConfig().training.epochs);
  CHECK(c.optimizer.lr == TrainConfig().optimizer.lr);
}

TEST_CASE("config: every key of every section is read", "[config]") {
  TempDir tmp;
  std::string init = tmp.file("init.safetensors");
  TrainConfig c = parse(
      "device: cpu\n"
      "model:\n  layers: [7, 5, 3, 2]\n  activation: relu\n  init_from: " +
      init +
      "\n"
      "data:\n  format: synthetic\n  dir: some/dir\n  train:\n    samples: 123\n  test:\n    "
      "samples: 45\n"
      "  shuffle: false\n  drop_last: true\n  seed: 18446744073709551615\n  prefetch: 5\n"
      "optimizer:\n  name: sgd\n  lr: 0.125\n  momentum: 0.9\n  dampening: 0.25\n"
      "  weight_decay: 1e-4\n  nesterov: false\n"
      "training:\n  epochs: 9\n  batch_size: 17\n  accumulate_steps: 3\n  seed: 42\n  log_every: "
      "0\n"
      "  max_steps: 1000\n  print_shapes: true\n"
      "distributed:\n  backend: mpi\n  bucket_cap_mb: 0.5\n  first_bucket_mb: 2.5\n"
      "  shared_memory: false\n"
      "output:\n  dir: out/x\n  save_model: false\n");
  CHECK(c.device == ddp::DeviceChoice::Cpu);
  CHECK(c.distributed.backend == ddp::BackendChoice::Mpi);
  CHECK(c.model.layers == std::vector<int64_t>{7, 5, 3, 2});
  CHECK(c.model.init_from == init);
  CHECK(c.data.dir == "some/dir");
  CHECK(c.data.train.samples == 123);
  CHECK(c.data.test.samples == 45);
  CHECK_FALSE(c.data.shuffle);
  CHECK(c.data.drop_last);
  CHECK(c.data.seed == 18446744073709551615ull);
  CHECK(c.data.prefetch == 5);
  CHECK(c.optimizer.lr == 0.125);
  CHECK(c.optimizer.momentum == 0.9);
  CHECK(c.optimizer.dampening == 0.25);
  CHECK(c.optimizer.weight_decay == 1e-4);
  CHECK(c.training.epochs == 9);
  CHECK(c.training.batch_size == 17);
  CHECK(c.training.accumulate_steps == 3);
  CHECK(c.training.seed == 42);
  CHECK(c.training.log_every == 0);
  CHECK(c.training.max_steps == 1000);
  CHECK(c.training.print_shapes);
  CHECK(c.distributed.bucket_cap_mb == 0.5);
  CHECK(c.distributed.first_bucket_mb == 2.5);
  CHECK_FALSE(c.distributed.shared_memory);
  CHECK(c.output.dir == "out/x");
  CHECK_FALSE(c.output.save_model);
}

TEST_CASE("config: idx and csv split keys are read", "[config]") {
  TempDir tmp;
  for (auto name : {"tr-img.gz", "tr-lab.gz", "te-img", "te-lab"}) tmp.file(name);
  TrainConfig idx = parse("model: {layers: [4, 3]}\ndata:\n  format: idx\n  dir: " + tmp.path() +
                          "\n  train: {images: tr-img.gz, labels: tr-lab.gz}\n"
                          "  test: {images: te-img, labels: te-lab}\n");
  CHECK(idx.data.format == ddp::DataFormat::Idx);
  CHECK(idx.data.train.images == "tr-img.gz");
  CHECK(idx.data.train.labels == "tr-lab.gz");
  CHECK(idx.data.test.images == "te-img");
  CHECK(idx.data.test.labels == "te-lab");

  std::string csv_file = tmp.file("d.csv", "1,2,0\n");
  TrainConfig csv = parse(
      "model: {layers: [2, 3]}\ndata:\n  format: csv\n  csv_header: true\n"
      "  train: {path: " +
      csv_file + "}\n  test: {path: " + csv_file + "}\n");
  CHECK(csv.data.train.path == csv_file);
  CHECK(csv.data.test.path == csv_file);
  CHECK(csv.data.csv_header);
}

TEST_CASE("config: --set overrides are parsed as YAML and create sections", "[config]") {
  TrainConfig c =
      parse_min("training:\n  epochs: 3\n",
                {"training.epochs=7", "optimizer.lr=0.5", " training.print_shapes = true",
                 "model.layers=[8, 6, 2]", "distributed.bucket_cap_mb=0.25", "output.dir=a=b"});
  CHECK(c.training.epochs == 7);  // the override beats the file
  CHECK(c.optimizer.lr == 0.5);
  CHECK(c.training.print_shapes);
  CHECK(c.model.layers == std::vector<int64_t>{8, 6, 2});
  CHECK(c.distributed.bucket_cap_mb == 0.25);  // no distributed section in the file
  CHECK(c.output.dir == "a=b");                // split at the first '='

  CHECK(parse_min("", {"training.epochs=2", "training.epochs=5"}).training.epochs == 5);
  CHECK(parse_min("training:\n", {"training.epochs=4"}).training.epochs == 4);
  TrainConfig whole = parse_min("", {"training={epochs: 6, batch_size: 8}"});
  CHECK(whole.training.epochs == 6);
  CHECK(whole.training.batch_size == 8);
  CHECK(parse("", {"model.layers=[3,2]", "data.train.samples=4"}).data.train.samples == 4);
  CHECK(parse_min("", {"model.init_from="}).model.init_from.empty());  // empty value: unset
}

TEST_CASE("config: malformed or bad --set overrides name the override", "[config]") {
  for (std::string bad :
       {"training.epochs", "=3", "training..epochs=3", ".epochs=3", "training.=3", " =1"}) {
    INFO(bad);
    CHECK(parse_error(kMinimal, {bad}) == "--set " + bad + ": expected key.path=value");
  }
  CHECK(parse_error(kMinimal, {"training.batch_size=abc"}) ==
        "--set training.batch_size: expected an integer, got 'abc'");
  CHECK(parse_error(kMinimal, {"training.epochs=0"}) ==
        "--set training.epochs: must be >= 1, got 0");
  CHECK(parse_error(kMinimal, {"model.layers=[4, 0, 3]"}) ==
        "--set model.layers: model.layers[1]: must be >= 1, got 0");
  CHECK(
      parse_error(kMinimal, {"training.bach_size=2"}) ==
      "--set training.bach_size: unknown key, did you mean 'batch_size'? (known keys in "
      "training: epochs, "
      "batch_size, accumulate_steps, seed, log_every, max_steps, print_shapes, resume, start_over, "
      "nan_policy, clip_grad_norm, precision, loss_scaling, loss_scale_init, "
      "loss_scale_growth_interval, cuda_graphs, bitwise_across_world_sizes, bitwise_chunk_size)");
  CHECK(parse_error(kMinimal, {"foo.bar=1"}) ==
        "--set foo.bar: foo: unknown key (known top-level keys: device, model, data, optimizer, "
        "scheduler, training, "
        "distributed, output, checkpoint)");
  CHECK(parse_error(kMinimal + "training:\n  epochs: 1\n", {"training.epochs.x=1"}) ==
        "--set training.epochs.x: training.epochs is '1', not a section, so it has no key 'x'");
  CHECK(parse_error(kMinimal, {"model.layers=[4, 3"}) ==
        "--set model.layers=[4, 3: invalid YAML value: end of sequence flow not found");
  // A bad key in the file is still blamed on the file when an override touches its section.
  CHECK(parse_error(kMinimal + "training:\n  bach_size: 2\n", {"training.epochs=3"})
            .rfind("run.yaml: training.bach_size: unknown key", 0) == 0);
}

TEST_CASE("config: unknown and repeated keys are errors at every level", "[config]") {
  CHECK(parse_error(kMinimal + "trainig:\n  epochs: 2\n") ==
        "run.yaml: trainig: unknown key, did you mean 'training'? (known top-level keys: device, "
        "model, "
        "data, optimizer, scheduler, training, distributed, output, checkpoint)");
  CHECK(parse_error(kMinimal + "zzz: 1\n") ==
        "run.yaml: zzz: unknown key (known top-level keys: device, model, data, optimizer, "
        "scheduler, training, "
        "distributed, output, checkpoint)");
  CHECK(parse_error(kMinimal + "training:\n  bach_size: 2\n") ==
        "run.yaml: training.bach_size: unknown key, did you mean 'batch_size'? (known keys in "
        "training: "
        "epochs, batch_size, accumulate_steps, seed, log_every, max_steps, print_shapes, resume, "
        "start_over, "
        "nan_policy, clip_grad_norm, precision, loss_scaling, loss_scale_init, "
        "loss_scale_growth_interval, cuda_graphs, bitwise_across_world_sizes, bitwise_chunk_size)");
  CHECK(parse_error("model: {layers: [4, 3]}\ndata:\n  train: {samples: 3, imgs: a}\n") ==
        "run.yaml: data.train.imgs: unknown key, did you mean 'images'? (known keys in data.train: "
        "images, features, labels, path, samples)");
  CHECK(parse_error(kMinimal + "training:\n  epochs: 2\n  epochs: 3\n") ==
        "run.yaml: training.epochs: duplicate key");
  CHECK(parse_error(kMinimal + "? [a, b]\n: 1\n") ==
        "run.yaml: (top level): keys must be plain names, got a list");
}

TEST_CASE("config: values of the wrong type name the key", "[config]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"training:\n  batch_size: abc\n", "training.batch_size: expected an integer, got 'abc'"},
      {"training:\n  epochs: 2.5\n", "training.epochs: expected an integer, got '2.5'"},
      {"training:\n  epochs: 1e3\n", "training.epochs: expected an integer, got '1e3'"},
      {"training:\n  epochs: {a: 1}\n", "training.epochs: expected an integer, got a map"},
      {"training:\n  epochs:\n", "training.epochs: expected an integer, got an empty value"},
      {"training:\n  seed: -1\n", "training.seed: must be >= 0, got -1"},
      {"training:\n  max_steps: 99999999999999999999\n",
       "training.max_steps: integer out of range, got '99999999999999999999'"},
      {"training:\n  print_shapes: yes\n",
       "training.print_shapes: expected true or false, got 'yes'"},
      {"training:\n  print_shapes: 1\n", "training.print_shapes: expected true or false, got '1'"},
      {"optimizer:\n  nesterov: [true]\n",
       "optimizer.nesterov: expected true or false, got a list"},
      {"optimizer:\n  lr: fast\n", "optimizer.lr: expected a finite number, got 'fast'"},
      {"optimizer:\n  lr: .inf\n", "optimizer.lr: expected a finite number, got '.inf'"},
      {"optimizer:\n  lr: 0x10\n", "optimizer.lr: expected a finite number, got '0x10'"},
      {"optimizer:\n  lr: [0.1]\n", "optimizer.lr: expected a number, got a list"},
      {"device: [cpu]\n", "device: expected a string, got a list"},
      {"output:\n  dir: {a: b}\n", "output.dir: expected a string, got a map"},
      {"training: 5\n", "training: expected a map of keys, got '5'"},
      {"distributed: [mpi]\n", "distributed: expected a map of keys, got a list"},
  };
  for (const auto& [extra, message] : cases) {
    INFO(extra);
    CHECK(parse_error(kMinimal + extra) == "run.yaml: " + message);
  }
  CHECK(parse_error("model:\n  layers: 784\n") ==
        "run.yaml: model.layers: expected a list of integers, got '784'");
  CHECK(parse_error("model:\n  layers: [4, x]\n") ==
        "run.yaml: model.layers[1]: expected an integer, got 'x'");
  CHECK(parse_error("model: {layers: [4, 3]}\ndata:\n  train: [1]\n") ==
        "run.yaml: data.train: expected a map of keys, got a list");
}

// Each change to a valid config is refused with exactly its message.
void require_each_refused(
    const std::vector<std::pair<std::function<void(TrainConfig&)>, std::string>>& cases) {
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO("case " << i << ": " << cases[i].second);
    TrainConfig c = valid_config();
    cases[i].first(c);
    CHECK(error_of([&] { ddp::validate_config(c); }) == "<config>: " + cases[i].second);
  }
}

TEST_CASE("config: each range rule rejects its first bad value and names the key", "[config]") {
  REQUIRE_NOTHROW(ddp::validate_config(valid_config()));
  using Mutate = std::function<void(TrainConfig&)>;
  const std::vector<std::pair<Mutate, std::string>> cases = {
      {[](TrainConfig& c) { c.model.layers = {4}; },
       "model.layers: needs at least 2 widths (input and output), got 1"},
      {[](TrainConfig& c) {
         c.model.layers = {4, 5, 0};
       },
       "model.layers[2]: must be >= 1, got 0"},
      {[](TrainConfig& c) { c.model.activation = "tanh"; },
       "model.activation: must be relu, got 'tanh'"},
      {[](TrainConfig& c) { c.data.train.samples = 0; }, "data.train.samples: must be >= 1, got 0"},
      {[](TrainConfig& c) { c.data.test.samples = -1; }, "data.test.samples: must be >= 0, got -1"},
      {[](TrainConfig& c) { c.data.prefetch = 0; }, "data.prefetch: must be >= 1, got 0"},
      {[](TrainConfig& c) { c.data.workers = -1; }, "data.workers: must be >= 0, got -1"},
      {[](TrainConfig& c) { c.optimizer.lr = 0; }, "optimizer.lr: must be > 0, got 0.0"},
      {[](TrainConfig& c) { c.optimizer.lr = -0.5; }, "optimizer.lr: must be > 0, got -0.5"},
      {[](TrainConfig& c) { c.optimizer.lr = std::nan(""); }, "optimizer.lr: must be > 0, got nan"},
      {[](TrainConfig& c) { c.optimizer.momentum = -0.1; },
       "optimizer.momentum: must be >= 0, got -0.1"},
      {[](TrainConfig& c) { c.optimizer.dampening = -1; },
       "optimizer.dampening: must be >= 0, got -1.0"},
      {[](TrainConfig& c) { c.optimizer.weight_decay = -1e-4; },
       "optimizer.weight_decay: must be >= 0, got -0.0001"},
      {[](TrainConfig& c) { c.training.epochs = 0; }, "training.epochs: must be >= 1, got 0"},
      {[](TrainConfig& c) { c.training.batch_size = 0; },
       "training.batch_size: must be >= 1, got 0"},
      {[](TrainConfig& c) { c.training.accumulate_steps = 0; },
       "training.accumulate_steps: must be >= 1, got 0"},
      {[](TrainConfig& c) { c.training.log_every = -1; },
       "training.log_every: must be >= 0, got -1"},
      {[](TrainConfig& c) { c.training.max_steps = -1; },
       "training.max_steps: must be >= 0, got -1"},
      {[](TrainConfig& c) {
         c.device = ddp::DeviceChoice::Cuda;
         c.distributed.backend = ddp::BackendChoice::Mpi;
         c.distributed.shard_optimizer = true;
       },
       ddp::cuda_built()
           ? "distributed.shard_optimizer: on GPUs needs distributed.backend: nccl (or auto); mpi "
             "stages the buckets through host memory and has no sharded path"
           : "device: cuda is not available in this build (built without the CUDA toolkit); "
             "use cpu or auto"},
      {[](TrainConfig& c) {
         c.distributed.hierarchical = ddp::Hierarchy::On;
         c.distributed.shard_optimizer = true;
       },
       "distributed.hierarchical: on does not apply to distributed.shard_optimizer, whose "
       "reduce-scatter and allgather are flat (use auto or off)"},
      {[](TrainConfig& c) {
         c.distributed.hierarchical = ddp::Hierarchy::On;
         c.distributed.shared_memory = false;
       },
       "distributed.hierarchical: on sums each node's buckets in shared memory and needs "
       "distributed.shared_memory: true"},
      {[](TrainConfig& c) { c.distributed.compression_on_node = true; },
       "distributed.compression_on_node: true needs distributed.compression: bf16 or fp16 (it "
       "is none)"},
      {[](TrainConfig& c) {
         c.device = ddp::DeviceChoice::Cpu;
         c.distributed.backend = ddp::BackendChoice::Nccl;
       },
       ddp::cuda_built()
           ? "distributed.backend: nccl moves GPU memory and needs device: cuda (or "
             "auto); with device: cpu use mpi"
           : "distributed.backend: nccl needs the CUDA build; this build supports mpi"},
      {[](TrainConfig& c) {
         c.device = ddp::DeviceChoice::Cpu;
         c.training.precision = ddp::Precision::Fp16;
       },
       "training.precision: fp16 runs on GPUs only (with loss scaling); on device: cpu use bf16 "
       "or fp32"},
      {[](TrainConfig& c) {
         c.distributed.gpus = {0, -1};
       },
       "distributed.gpus[1]: must be >= 0, got -1"},
      {[](TrainConfig& c) { c.distributed.timeout_s = 0; },
       "distributed.timeout_s: must be > 0, got 0.0"},
      {[](TrainConfig& c) { c.output.trace_steps = -1; },
       "output.trace_steps: must be >= 0, got -1"},
      {[](TrainConfig& c) { c.output.flight_recorder = -1; },
       "output.flight_recorder: must be >= 0, got -1"},
      {[](TrainConfig& c) { c.output.straggler_threshold = -1; },
       "output.straggler_threshold: must be 0 (off) or > 1.0, got -1.0"},
      {[](TrainConfig& c) { c.output.straggler_threshold = 1; },
       "output.straggler_threshold: must be 0 (off) or > 1.0, got 1.0"},
      {[](TrainConfig& c) { c.output.straggler_threshold = 0.5; },
       "output.straggler_threshold: must be 0 (off) or > 1.0, got 0.5"},
      {[](TrainConfig& c) { c.output.peak_tflops = -0.5; },
       "output.peak_tflops: must be >= 0, got -0.5"},
      {[](TrainConfig& c) { c.distributed.bucket_cap_mb = 0; },
       "distributed.bucket_cap_mb: must be >= 9.5367431640625e-07 (one byte), got 0.0"},
      {[](TrainConfig& c) { c.distributed.first_bucket_mb = -1; },
       "distributed.first_bucket_mb: must be >= 9.5367431640625e-07 (one byte), got -1.0"},
      {[](TrainConfig& c) { c.output.dir = ""; }, "output.dir: must not be empty"},
      {[](TrainConfig& c) { c.checkpoint.every_steps = -1; },
       "checkpoint.every_steps: must be >= 0, got -1"},
      {[](TrainConfig& c) { c.checkpoint.every_epochs = -2; },
       "checkpoint.every_epochs: must be >= 0, got -2"},
      {[](TrainConfig& c) { c.checkpoint.keep_last = -1; },
       "checkpoint.keep_last: must be >= 0, got -1"},
      {[](TrainConfig& c) {
         c.checkpoint.every_steps = 10;
         c.checkpoint.every_epochs = 1;
       },
       "checkpoint.every_epochs: set either checkpoint.every_steps or checkpoint.every_epochs, "
       "not both"},
      {[](TrainConfig& c) {
         c.training.start_over = true;
         c.training.resume = "auto";
       },
       "training.start_over: starts a fresh run; training.resume 'auto' continues one: not both"},
  };
  require_each_refused(cases);
}

TEST_CASE("config: optimizer keys: ranges, and a key of one optimizer set for another",
          "[config][adam]") {
  require_each_refused({
      {[](TrainConfig& c) {
         c.optimizer.name = ddp::OptimizerName::Adam;
         c.optimizer.betas = {0.9, 1.0};
       },
       "optimizer.betas[1]: must be in [0, 1), got 1.0"},
      {[](TrainConfig& c) {
         c.optimizer.name = ddp::OptimizerName::AdamW;
         c.optimizer.betas = {-0.1, 0.9};
       },
       "optimizer.betas[0]: must be in [0, 1), got -0.1"},
      {[](TrainConfig& c) {
         c.optimizer.name = ddp::OptimizerName::Adam;
         c.optimizer.eps = -1e-8;
       },
       "optimizer.eps: must be >= 0, got -1e-08"},
      {[](TrainConfig& c) {
         c.optimizer.name = ddp::OptimizerName::Adam;
         c.optimizer.momentum = 0.9;
       },
       "optimizer.momentum: applies to sgd only, not to optimizer.name adam"},
      {[](TrainConfig& c) {
         c.optimizer.name = ddp::OptimizerName::AdamW;
         c.optimizer.nesterov = true;
       },
       "optimizer.nesterov: applies to sgd only, not to optimizer.name adamw"},
      {[](TrainConfig& c) {
         c.optimizer.name = ddp::OptimizerName::AdamW;
         c.optimizer.dampening = 0.5;
       },
       "optimizer.dampening: applies to sgd only, not to optimizer.name adamw"},
      {[](TrainConfig& c) {
         c.optimizer.betas = {0.8, 0.999};
       },
       "optimizer.betas: applies to adam and adamw only, not to optimizer.name sgd"},
      {[](TrainConfig& c) { c.optimizer.eps = 1e-6; },
       "optimizer.eps: applies to adam and adamw only, not to optimizer.name sgd"},
      {[](TrainConfig& c) { c.optimizer.amsgrad = true; },
       "optimizer.amsgrad: applies to adam and adamw only, not to optimizer.name sgd"},
  });
}

TEST_CASE("config: loss scaling keys are read; auto scales the loss exactly with fp16",
          "[config][loss_scale]") {
  const TrainConfig c = parse(kMinimal +
                              "training: {loss_scaling: on, loss_scale_init: 1024, "
                              "loss_scale_growth_interval: 7}\n");
  CHECK(c.training.loss_scaling == ddp::LossScaling::On);
  CHECK(c.training.loss_scale_init == 1024);
  CHECK(c.training.loss_scale_growth_interval == 7);
  CHECK(c.training.scales_loss());
  const TrainConfig d = parse(kMinimal);
  CHECK(d.training.loss_scaling == ddp::LossScaling::Auto);
  CHECK(d.training.loss_scale_init == 65536);
  CHECK(d.training.loss_scale_growth_interval == 2000);
  ddp::TrainingConfig t;
  for (const ddp::Precision p :
       {ddp::Precision::Fp32, ddp::Precision::Bf16, ddp::Precision::Fp16}) {
    t.precision = p;
    t.loss_scaling = ddp::LossScaling::Auto;
    CHECK(t.scales_loss() == (p == ddp::Precision::Fp16));
    t.loss_scaling = ddp::LossScaling::On;
    CHECK(t.scales_loss());
    t.loss_scaling = ddp::LossScaling::Off;
    CHECK_FALSE(t.scales_loss());
  }
}

TEST_CASE("config: scheduler keys are read, and each one's misuse is refused by name",
          "[config][schedule]") {
  const TrainConfig c = parse(
      "model: {layers: [4, 2]}\ndata: {train: {samples: 8}}\noptimizer: {lr: 0.1}\n"
      "scheduler: {name: cosine, warmup_steps: 10, warmup_start_factor: 0.25, min_lr: 0.001, "
      "total_steps: 500}\ntraining: {clip_grad_norm: 1.5}\n");
  CHECK(c.scheduler.name == ddp::SchedulerName::Cosine);
  CHECK(c.scheduler.warmup_steps == 10);
  CHECK(c.scheduler.warmup_start_factor == 0.25);
  CHECK(c.scheduler.min_lr == 0.001);
  CHECK(c.scheduler.total_steps == 500);
  CHECK(c.training.clip_grad_norm == 1.5);
  const TrainConfig s = parse(
      "model: {layers: [4, 2]}\ndata: {train: {samples: 8}}\n"
      "scheduler: {name: step, step_size: 30, gamma: 0.5}\n");
  CHECK(s.scheduler.step_size == 30);
  CHECK(s.scheduler.gamma == 0.5);
  using ddp::SchedulerName;
  require_each_refused({
      {[](TrainConfig& c) { c.scheduler.name = SchedulerName::Step; },
       "scheduler.step_size: required (>= 1) for scheduler.name step"},
      {[](TrainConfig& c) { c.scheduler.step_size = 10; },
       "scheduler.step_size: applies to step only, not to scheduler.name constant"},
      {[](TrainConfig& c) {
         c.scheduler.name = SchedulerName::Cosine;
         c.scheduler.gamma = 0.5;
       },
       "scheduler.gamma: applies to step only, not to scheduler.name cosine"},
      {[](TrainConfig& c) {
         c.scheduler.name = SchedulerName::Step;
         c.scheduler.step_size = 5;
         c.scheduler.min_lr = 0.001;
       },
       "scheduler.min_lr: applies to cosine and linear only, not to scheduler.name step"},
      {[](TrainConfig& c) { c.scheduler.total_steps = 100; },
       "scheduler.total_steps: applies to cosine and linear only, not to scheduler.name constant"},
      {[](TrainConfig& c) { c.scheduler.warmup_start_factor = 0.5; },
       "scheduler.warmup_start_factor: applies to a warmup only; set scheduler.warmup_steps > 0"},
      {[](TrainConfig& c) {
         c.scheduler.warmup_steps = 5;
         c.scheduler.warmup_start_factor = 0.0;
       },
       "scheduler.warmup_start_factor: must be in (0, 1], got 0.0"},
      {[](TrainConfig& c) {
         c.scheduler.name = SchedulerName::Linear;
         c.scheduler.min_lr = 1.0;
       },
       "scheduler.min_lr: 1.0 is above optimizer.lr 0.01: the schedule decays from optimizer.lr "
       "to min_lr"},
      {[](TrainConfig& c) {
         c.scheduler.name = SchedulerName::Cosine;
         c.scheduler.warmup_steps = 50;
         c.scheduler.total_steps = 50;
       },
       "scheduler.total_steps: 50 leaves no steps to decay after scheduler.warmup_steps 50"},
      {[](TrainConfig& c) { c.scheduler.warmup_steps = -1; },
       "scheduler.warmup_steps: must be >= 0, got -1"},
      {[](TrainConfig& c) { c.training.clip_grad_norm = -1.0; },
       "training.clip_grad_norm: must be >= 0, got -1.0"},
      {[](TrainConfig& c) { c.training.loss_scale_init = 0; },
       "training.loss_scale_init: must be >= 1.1754943508222875e-38 (2^-126), got 0.0"},
      {[](TrainConfig& c) { c.training.loss_scale_init = 1e-39; },
       "training.loss_scale_init: must be >= 1.1754943508222875e-38 (2^-126), got 1e-39"},
      {[](TrainConfig& c) { c.training.loss_scale_growth_interval = 0; },
       "training.loss_scale_growth_interval: must be >= 1, got 0"},
  });
}

TEST_CASE("config: data.normalize is none, standardize or [mean, std], and prints back",
          "[config][normalize]") {
  using Mode = ddp::Normalization::Mode;
  const std::string model = "model: {layers: [4, 2]}\n";
  CHECK(parse(model + "data: {train: {samples: 8}}\n").data.normalize.mode == Mode::None);
  const TrainConfig s = parse(model + "data: {train: {samples: 8}, normalize: standardize}\n");
  CHECK(s.data.normalize.mode == Mode::Standardize);
  const TrainConfig f = parse(model + "data: {train: {samples: 8}, normalize: [0.25, 0.5]}\n");
  CHECK(f.data.normalize.mode == Mode::Fixed);
  CHECK(f.data.normalize.mean == 0.25);
  CHECK(f.data.normalize.std == 0.5);
  for (const TrainConfig& c : {s, f}) {
    CHECK(ddp::parse_config(ddp::to_yaml(c), "printed").data.normalize == c.data.normalize);
  }
  CHECK(ddp::to_yaml(f).find("normalize: [0.25, 0.5]") != std::string::npos);
  const std::string data = model + "data:\n  train: {samples: 8}\n  normalize: ";
  CHECK(parse_error(data + "zscore\n") ==
        "run.yaml: data.normalize: must be none, standardize or [mean, std]; got 'zscore'");
  CHECK(parse_error(data + "[1]\n") ==
        "run.yaml: data.normalize: expected a list of 2 numbers, got 1 entry");
  CHECK(parse_error(data + "[0.5, 0]\n") ==
        "run.yaml: data.normalize[1]: std must be > 0, got 0.0");
  CHECK(parse_error(data + "{mean: 1}\n") ==
        "run.yaml: data.normalize: must be none, standardize or [mean, std], got a map");
}

TEST_CASE("config: enumerated keys take only their names, read once", "[config]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"device: tpu\n", "device: must be one of cpu, cuda, auto; got 'tpu'"},
      {"device:\n", "device: must be one of cpu, cuda, auto; got ''"},
      {"device: CPU\n", "device: must be one of cpu, cuda, auto; got 'CPU'"},
      {"distributed: {backend: gloo}\n",
       "distributed.backend: must be one of auto, mpi, nccl; got 'gloo'"},
      {"distributed: {nccl_algo: tree}\n",
       "distributed.nccl_algo: must be ring or auto; got 'tree'"},
      {"distributed: {hierarchical: yes}\n",
       "distributed.hierarchical: must be one of auto, on, off; got 'yes'"},
      {"distributed: {compression: int8}\n",
       "distributed.compression: must be one of none, bf16, fp16, powersgd; got 'int8'"},
      {"training: {loss_scaling: dynamic}\n",
       "training.loss_scaling: must be one of auto, on, off; got 'dynamic'"},
      {"optimizer: {name: lion}\n", "optimizer.name: must be one of sgd, adam, adamw; got 'lion'"},
      {"optimizer: {name: adam, betas: [0.9]}\n",
       "optimizer.betas: expected a list of 2 numbers, got 1 entry"},
      {"optimizer: {name: adam, betas: 0.9}\n",
       "optimizer.betas: expected a list of 2 numbers, got '0.9'"},
      {"optimizer: {name: adam, betas: [0.9, x]}\n",
       "optimizer.betas[1]: expected a finite number, got 'x'"},
      {"training: {nan_policy: ignore}\n",
       "training.nan_policy: must be abort or skip_step; got 'ignore'"},
      {"training: {nan_policy: [abort]}\n", "training.nan_policy: expected a string, got a list"},
  };
  for (const auto& [extra, message] : cases) {
    INFO(extra);
    CHECK(parse_error(kMinimal + extra) == "run.yaml: " + message);
  }
  CHECK(parse_error("model: {layers: [4, 3]}\ndata: {format: parquet}\n") ==
        "run.yaml: data.format: must be one of idx, synthetic, csv, npy; got 'parquet'");
  CHECK(parse_error(kMinimal, {"device=tpu"}) ==
        "--set device: must be one of cpu, cuda, auto; got 'tpu'");
  const TrainConfig c = parse_min(
      "device: auto\ndistributed: {backend: mpi, nccl_algo: ring}\n"
      "training: {nan_policy: skip_step}\n");
  CHECK(c.device == ddp::DeviceChoice::Auto);
  CHECK(c.distributed.backend == ddp::BackendChoice::Mpi);
  CHECK(c.distributed.nccl_algo == ddp::NcclAlgo::Ring);
  // NCCL's own choice unless a fixed algorithm is asked for.
  CHECK(parse_min("device: auto\n").distributed.nccl_algo == ddp::NcclAlgo::Auto);
  CHECK(c.training.nan_policy == ddp::NanPolicy::SkipStep);
  CHECK(std::string(ddp::to_string(ddp::NanPolicy::SkipStep)) == "skip_step");
  CHECK(std::string(ddp::to_string(ddp::DataFormat::Synthetic)) == "synthetic");
  CHECK(std::string(ddp::to_string(ddp::BackendChoice::Nccl)) == "nccl");
}

TEST_CASE("config: device cuda and auto, and what each build says about them", "[config]") {
  TrainConfig c = valid_config();
  c.device = ddp::DeviceChoice::Auto;
  CHECK_NOTHROW(ddp::validate_config(c));  // auto falls back to the CPU in any build
  c.device = ddp::DeviceChoice::Cuda;
  if (ddp::cuda_built()) {
    CHECK_NOTHROW(ddp::validate_config(c));  // whether a GPU is visible is decided at startup
    c.distributed.backend = ddp::BackendChoice::Nccl;
    CHECK_NOTHROW(ddp::validate_config(c));
  } else {
    CHECK(error_of([&] { ddp::validate_config(c); }) ==
          "<config>: device: cuda is not available in this build (built without the CUDA "
          "toolkit); use cpu or auto");
  }
  CHECK(
      parse_min("distributed: {gpus: [1, 0], nccl_algo: auto, timeout_s: 5}\n").distributed.gpus ==
      std::vector<int64_t>{1, 0});
  CHECK(parse_min("output: {trace: true, trace_steps: 0}\n").output.trace);
}

TEST_CASE("config: checkpoint section, resume and nan_policy", "[config]") {
  const TrainConfig c = parse_min(
      "checkpoint: {every_steps: 50, keep_last: 0}\n"
      "training: {resume: auto, nan_policy: skip_step}\n");
  CHECK(c.checkpoint.every_steps == 50);
  CHECK(c.checkpoint.keep_last == 0);
  CHECK(c.checkpoint.periodic());
  CHECK(c.checkpoint.directory("runs/x") == "runs/x/checkpoints");
  CHECK(c.training.resume == "auto");
  CHECK(c.training.nan_policy == ddp::NanPolicy::SkipStep);
  ddp::CheckpointConfig own;
  own.dir = "/scratch/ckpt";
  CHECK(own.directory("runs/x") == "/scratch/ckpt");
  CHECK_FALSE(own.periodic());
}

TEST_CASE("config: range boundaries that are allowed pass", "[config]") {
  TrainConfig c = valid_config();
  c.model.layers = {1, 1};
  c.data.train.samples = 1;
  c.data.test.samples = 0;
  c.data.prefetch = 1;
  c.optimizer.lr = 1e-12;
  c.training.epochs = c.training.batch_size = c.training.accumulate_steps = 1;
  c.training.log_every = c.training.max_steps = 0;
  c.distributed.bucket_cap_mb = c.distributed.first_bucket_mb = 1e-6;
  CHECK_NOTHROW(ddp::validate_config(c));
}

TEST_CASE("config: range errors from a file name the file", "[config]") {
  CHECK(parse_error(kMinimal + "training:\n  epochs: 0\n") ==
        "run.yaml: training.epochs: must be >= 1, got 0");
  CHECK(parse_error("model: {layers: [4, 0, 3]}\n") ==
        "run.yaml: model.layers[1]: must be >= 1, got 0");
  TrainConfig c = valid_config();
  c.source = "mine.yaml";
  c.training.batch_size = -2;
  CHECK(error_of([&] { ddp::validate_config(c); }) ==
        "mine.yaml: training.batch_size: must be >= 1, got -2");
}

// Each bounded key, set just above its bound through --set, is refused naming the key and the
// bound; the list is pinned against the schema, so a key cannot lose its bound unnoticed.
TEST_CASE("config: every numeric key has an upper bound, and a value above it names the key",
          "[config][bounds]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model.layers=[4, 1000000001]",
       "--set model.layers: model.layers[1]: must be <= "
       "1000000000, got 1000000001"},
      {"data.train.samples=1000000000001",
       "--set data.train.samples: must be <= 1000000000000, got 1000000000001"},
      {"data.test.samples=1000000000001",
       "--set data.test.samples: must be <= 1000000000000, got 1000000000001"},
      {"data.prefetch=65537", "--set data.prefetch: must be <= 65536, got 65537"},
      {"data.workers=65", "--set data.workers: must be <= 64, got 65"},
      {"optimizer.lr=1e39", "--set optimizer.lr: must be <= 3.4028234663852886e+38, got 1e+39"},
      {"optimizer.momentum=1e39",
       "--set optimizer.momentum: must be <= 3.4028234663852886e+38, got 1e+39"},
      {"optimizer.dampening=1e39",
       "--set optimizer.dampening: must be <= 3.4028234663852886e+38, got 1e+39"},
      {"optimizer.weight_decay=1e39",
       "--set optimizer.weight_decay: must be <= 3.4028234663852886e+38, got 1e+39"},
      {"optimizer.eps=1e39", "--set optimizer.eps: must be <= 3.4028234663852886e+38, got 1e+39"},
      {"scheduler.warmup_steps=1000000000001",
       "--set scheduler.warmup_steps: must be <= 1000000000000, got 1000000000001"},
      {"scheduler.total_steps=1000000000001",
       "--set scheduler.total_steps: must be <= 1000000000000, got 1000000000001"},
      {"scheduler.step_size=1000000000001",
       "--set scheduler.step_size: must be <= 1000000000000, got 1000000000001"},
      {"training.epochs=1000000001",
       "--set training.epochs: must be <= 1000000000, got 1000000001"},
      {"training.batch_size=1000000001",
       "--set training.batch_size: must be <= 1000000000, got 1000000001"},
      {"training.accumulate_steps=4611686018427387904",
       "--set training.accumulate_steps: must be <= 1000000, got 4611686018427387904"},
      {"training.log_every=1000000000001",
       "--set training.log_every: must be <= 1000000000000, got 1000000000001"},
      {"training.max_steps=9223372036854775807",
       "--set training.max_steps: must be <= 1000000000000, got 9223372036854775807"},
      {"training.clip_grad_norm=1e300",
       "--set training.clip_grad_norm: must be <= 3.4028234663852886e+38, got 1e+300"},
      {"training.loss_scale_init=1e38",
       "--set training.loss_scale_init: must be <= 8.507059173023462e+37, got 1e+38"},
      {"training.loss_scale_growth_interval=1000000000001",
       "--set training.loss_scale_growth_interval: must be <= 1000000000000, got 1000000000001"},
      {"training.bitwise_chunk_size=1000000001",
       "--set training.bitwise_chunk_size: must be <= 1000000000, got 1000000001"},
      {"distributed.bucket_cap_mb=1e300",
       "--set distributed.bucket_cap_mb: must be <= 1e+09, got 1e+300"},
      {"distributed.first_bucket_mb=1.000001e9",
       "--set distributed.first_bucket_mb: must be <= 1e+09, got 1.000001e+09"},
      {"distributed.powersgd_rank=65537",
       "--set distributed.powersgd_rank: must be <= 65536, got 65537"},
      {"distributed.powersgd_start_step=1000000000001",
       "--set distributed.powersgd_start_step: must be <= 1000000000000, got 1000000000001"},
      {"distributed.gpus=[0, 65536]",
       "--set distributed.gpus: distributed.gpus[1]: must be <= 65535, got 65536"},
      {"distributed.timeout_s=1e10", "--set distributed.timeout_s: must be <= 1e+09, got 1e+10"},
      {"output.trace_steps=1000000000001",
       "--set output.trace_steps: must be <= 1000000000000, got 1000000000001"},
      {"output.flight_recorder=1000001",
       "--set output.flight_recorder: must be <= 1000000, got 1000001"},
      {"output.straggler_threshold=1.000001e6",
       "--set output.straggler_threshold: must be <= 1e+06, got 1000001.0"},
      {"output.peak_tflops=2e9", "--set output.peak_tflops: must be <= 1e+09, got 2e+09"},
      {"checkpoint.every_steps=4611686018427387904",
       "--set checkpoint.every_steps: must be <= 1000000000000, got 4611686018427387904"},
      {"checkpoint.every_epochs=1000000001",
       "--set checkpoint.every_epochs: must be <= 1000000000, got 1000000001"},
      {"checkpoint.keep_last=1000001",
       "--set checkpoint.keep_last: must be <= 1000000, got 1000001"},
  };
  std::vector<std::string> refused;
  for (const auto& [set, message] : cases) {
    INFO("--set " << set);
    CHECK(parse_error(kMinimal, {set}) == message);
    refused.push_back(set.substr(0, set.find('=')));
  }
  // Numeric keys without an upper bound: seeds (any 64-bit value names a stream), numbers whose
  // rule bounds them already, min_lr (at most optimizer.lr) and gamma (a step schedule's lr
  // leaving float32 is the non-finite check's to stop, as any divergence is).
  const std::vector<std::string> unbounded = {
      "data.seed",        "optimizer.betas", "scheduler.warmup_start_factor",
      "scheduler.min_lr", "scheduler.gamma", "training.seed"};
  std::vector<std::string> bounded, numeric_unbounded;
  for (const ddp::KeyRow& row : ddp::config_schema()) {
    if (!row.maximum.empty()) bounded.push_back(row.path);
    const bool numeric = row.type == "integer" || row.type == "number" ||
                         row.type == "list of integers" || row.type == "list of 2 numbers";
    if (numeric && row.maximum.empty()) numeric_unbounded.push_back(row.path);
  }
  CHECK(bounded == refused);
  CHECK(numeric_unbounded == unbounded);
}

TEST_CASE("config: the bounds themselves are allowed", "[config][bounds]") {
  TrainConfig c = valid_config();
  c.data.prefetch = 65536;
  c.data.workers = 64;
  c.optimizer.lr = c.optimizer.momentum = c.optimizer.weight_decay = FLT_MAX;
  c.scheduler.name = ddp::SchedulerName::Cosine;
  c.scheduler.warmup_steps = 1000000000000 - 1;
  c.scheduler.total_steps = 1000000000000;
  c.training.epochs = 1000000000;
  c.training.accumulate_steps = 1000000;
  c.training.log_every = c.training.max_steps = 1000000000000;
  c.training.clip_grad_norm = FLT_MAX;
  c.training.loss_scale_init = 0x1p126;
  c.training.loss_scale_growth_interval = 1000000000000;
  c.distributed.bucket_cap_mb = 1e9;
  c.distributed.first_bucket_mb = 1.0 / 1048576;
  c.distributed.gpus = {65535};
  c.distributed.timeout_s = 1e9;
  c.output.trace_steps = c.checkpoint.every_steps = 1000000000000;
  c.checkpoint.keep_last = c.output.flight_recorder = 1000000;
  c.output.straggler_threshold = 1e6;
  c.output.peak_tflops = 1e9;
  CHECK(error_of([&] { ddp::validate_config(c); }) == "(no error)");
  c.checkpoint.every_steps = 0;
  c.checkpoint.every_epochs = 1000000000;
  c.data.test.samples = 1;
  c.optimizer.dampening = FLT_MAX;
  CHECK(error_of([&] { ddp::validate_config(c); }) == "(no error)");
  c.distributed.first_bucket_mb = std::nextafter(1.0 / 1048576, 0.0);  // rounds to 0 bytes
  CHECK(error_of([&] { ddp::validate_config(c); }) ==
        "<config>: distributed.first_bucket_mb: must be >= 9.5367431640625e-07 (one byte), got "
        "9.536743164062499e-07");
  CHECK(parse_error(kMinimal, {"distributed.bucket_cap_mb=1e-300"}) ==
        "--set distributed.bucket_cap_mb: must be >= 9.5367431640625e-07 (one byte), got 1e-300");
}

TEST_CASE("config: data.normalize's mean and std must be usable as float32", "[config][bounds]") {
  const std::string head = "model: {layers: [4, 2]}\ndata:\n  train: {samples: 8}\n  normalize: ";
  const std::string std_message =
      "run.yaml: data.normalize[1]: std must be a normal float32 (from 1.1754943508222875e-38 to "
      "3.4028234663852886e+38) with a finite reciprocal, got ";
  // 1e-320 is 0 in float32, 1e-40 subnormal (its reciprocal is inf), 1e39 is inf.
  for (const std::string std : {"1e-320", "1e-40", "1.1754942e-38", "1e39"}) {
    INFO("std " << std);
    const std::string shown = std == "1.1754942e-38" ? "1.1754942e-38"
                              : std == "1e39"        ? "1e+39"
                                                     : std;
    CHECK(parse_error(head + "[0, " + std + "]\n") == std_message + shown);
  }
  CHECK(parse_error(head + "[1e39, 1]\n") ==
        "run.yaml: data.normalize[0]: mean must be finite as a float32 (at most "
        "3.4028234663852886e+38 in magnitude), got 1e+39");
  CHECK(parse_error(head + "[-1e39, 1]\n") ==
        "run.yaml: data.normalize[0]: mean must be finite as a float32 (at most "
        "3.4028234663852886e+38 in magnitude), got -1e+39");
  CHECK(parse_error(head + "[0, -1e-320]\n") ==
        "run.yaml: data.normalize[1]: std must be > 0, got -1e-320");
  // The extremes of float32's normal range are allowed, and so is the largest mean.
  for (const std::string ok : {"[0, 1.1754943508222875e-38]", "[0, 3.4028234663852886e+38]",
                               "[-3.4028234663852886e+38, 1]"}) {
    INFO(ok);
    CHECK(parse_error(head + ok + "\n") == "(no error)");
  }
}

// The products of several keys: what memory_demands computes for a small config, in bytes.
TEST_CASE("config: memory_demands are the products of the keys, and overflows are flagged",
          "[config][bounds]") {
  TrainConfig c = valid_config();
  c.model.layers = {20, 10, 3};
  c.training.batch_size = 50;
  c.data.train.samples = 2000;
  c.data.test.samples = 100;
  c.optimizer.momentum = 0.9;
  std::vector<ddp::MemoryDemand> d = ddp::memory_demands(c);
  REQUIRE(d.size() == 5);
  CHECK(d[0].bytes == 50 * 20 * 4);
  CHECK(d[0].product == "training.batch_size 50 x model.layers[0] 20 x 4 bytes");
  CHECK(d[1].bytes == (20 * 10 + 10 + 10 * 3 + 3) * 12);
  CHECK(d[1].product ==
        "243 in model.layers x 12 bytes (weight, gradient and 1 optimizer state(s))");
  CHECK(d[2].bytes == 5 * 50 * 20 * 4);
  CHECK(d[2].product ==
        "(data.prefetch 4 + 1) x training.batch_size 50 x model.layers[0] 20 x 4 bytes");
  CHECK(d[3].bytes == 2000 * 21 * 4);
  CHECK(d[3].keys == std::vector<std::string>{"data.train.samples", "model.layers[0]"});
  CHECK(d[4].bytes == 100 * 21 * 4);
  for (const auto& x : d) CHECK_FALSE(x.overflows);

  c.model.layers = {3, 1000, 2};
  c.optimizer = {};
  c.optimizer.name = ddp::OptimizerName::Adam;
  c.optimizer.amsgrad = true;
  c.data.test.samples = 0;
  d = ddp::memory_demands(c);
  REQUIRE(d.size() == 4);
  CHECK(d[0].keys == std::vector<std::string>{"training.batch_size", "model.layers[1]"});
  CHECK(d[1].bytes == (3 * 1000 + 1000 + 1000 * 2 + 2) * 20);
  c.distributed.shard_optimizer = true;  // the state is split over the ranks: not counted
  CHECK(ddp::memory_demands(c)[1].bytes == (3 * 1000 + 1000 + 1000 * 2 + 2) * 8);

  c.model.layers = {1000000000, 1000000000, 1000000000};
  c.training.batch_size = 1000000000;
  c.data.prefetch = 65536;
  c.data.train.samples = 1000000000000;
  d = ddp::memory_demands(c);
  CHECK_FALSE(d[0].overflows);  // 1e9 x 1e9 x 4 fits
  CHECK(d[1].overflows);        // 2e18 parameters fit, their bytes do not
  CHECK(d[1].product == "2000000002000000000 in model.layers x 8 bytes (weight and gradient)");
  CHECK(d[2].overflows);
  CHECK(d[3].overflows);
  c.model.layers = std::vector<int64_t>(11, 1000000000);  // 1e19 parameters
  CHECK(ddp::memory_demands(c)[1].product ==
        "(the sum of in x out + out over model.layers) x 8 bytes (weight and gradient)");
  c.data.format = ddp::DataFormat::Csv;  // the data's size is the file's, not the config's
  CHECK(ddp::memory_demands(c).size() == 3);
}

TEST_CASE("config: bitwise_across_world_sizes keeps a gradient per chunk, a memory demand",
          "[config][bounds][bitwise]") {
  TrainConfig c = valid_config();
  c.model.layers = {20, 10, 3};
  c.data.format = ddp::DataFormat::Csv;
  c.training.batch_size = 64;
  c.training.accumulate_steps = 3;
  c.training.bitwise_across_world_sizes = true;
  c.training.bitwise_chunk_size = 16;
  std::vector<ddp::MemoryDemand> d = ddp::memory_demands(c);
  REQUIRE(d.size() == 4);
  CHECK(d[3].bytes == 4 * 3 * 243 * 4);
  CHECK(d[3].product ==
        "(training.batch_size 64 / training.bitwise_chunk_size 16) x training.accumulate_steps 3 "
        "x 243 parameters x 4 bytes");
  CHECK(d[3].keys.front() == "training.bitwise_chunk_size");
  c.model.layers = {100000, 100000, 100000};  // 2e10 parameters: 4 x 3 x 4 x 2e10 bytes fits
  c.training.batch_size = 1000000000;
  c.training.bitwise_chunk_size = 1;
  CHECK(ddp::memory_demands(c)[3].overflows);  // 1e9 x 3 chunks of 2e10 floats do not
}

TEST_CASE("config: a product of keys beyond int64 or the machine's memory is refused by name",
          "[config][bounds]") {
  const int64_t memory = ddp::physical_memory_bytes();
  REQUIRE(memory > 0);
  const std::string more = " of this machine's physical memory";
  using Catch::Matchers::EndsWith;
  using Catch::Matchers::StartsWith;
  // The parameters of layers of 1e9 overflow, whatever the machine; the override is named.
  CHECK(parse_error(kMinimal, {"model.layers=[1, 1000000000, 1000000000, 1000000000]"}) ==
        "--set model.layers: the parameters overflow 64-bit integers: 2000000004000000000 in "
        "model.layers x 8 bytes (weight and gradient)");
  CHECK(
      parse_error(kMinimal, {"data.train.samples=1000000000000", "model.layers=[1000000000, 3]"}) ==
      "--set model.layers: model.layers[0]: the generated train samples overflow 64-bit "
      "integers: data.train.samples 1000000000000 x (model.layers[0] 1000000000 + 1 label) x 4 "
      "bytes");
  // One micro-batch's activations of a layer of 1e9: 4e18 bytes, more than any machine has.
  std::string e =
      parse_error(kMinimal, {"model.layers=[4, 1000000000, 3]", "training.batch_size=1000000000"});
  CHECK_THAT(
      e,
      StartsWith("--set training.batch_size: the activations of one micro-batch need "
                 "4000000000000000000 bytes (3725290298.5 GiB) (training.batch_size 1000000000 x "
                 "model.layers[1] 1000000000 x 4 bytes), more than the " +
                 std::to_string(memory) + " bytes (") &&
          EndsWith(more));
  // The same product named by the layer when the layers were set last.
  e = parse_error(kMinimal, {"training.batch_size=1000000000", "model.layers=[4, 1000000000, 3]"});
  CHECK_THAT(e,
             StartsWith("--set model.layers: model.layers[1]: the activations of one micro-batch"));
  // 24 TB of batches prefetched, where one batch's activations take 0.4 GB.
  e = parse_error(kMinimal,
                  {"model.layers=[100, 3]", "data.prefetch=65536", "training.batch_size=1000000"});
  CHECK_THAT(e,
             StartsWith("--set training.batch_size: the loader's batches need 26214800000000 bytes "
                        "(24414.4 GiB) ((data.prefetch 65536 + 1) x training.batch_size 1000000 x "
                        "model.layers[0] 100 x 4 bytes), more than the ") &&
                 EndsWith(more));
  e = parse_error("model: {layers: [1000, 3]}\ndata: {train: {samples: 1000000000000}}\n");
  CHECK_THAT(
      e,
      StartsWith("run.yaml: data.train.samples: the generated train samples need 4004000000000000 "
                 "bytes (3729015.6 GiB) (data.train.samples 1000000000000 x (model.layers[0] 1000 "
                 "+ 1 label) x 4 bytes), more than the ") &&
          EndsWith(more));

  // The comparison is against this machine's memory to the byte: a micro-batch of one layer of
  // `width` that fills it passes, one more sample does not.
  const int64_t width = 1000 * (1 + memory / 4000000000000);
  const int64_t batch = memory / (4 * width);
  REQUIRE(batch >= 1);
  const std::string layers = "model.layers=[1, " + std::to_string(width) + "]";
  CHECK(parse_error(kMinimal, {layers, "training.batch_size=" + std::to_string(batch)}) ==
        "(no error)");
  e = parse_error(kMinimal, {layers, "training.batch_size=" + std::to_string(batch + 1)});
  CHECK_THAT(e, StartsWith("--set training.batch_size: the activations of one micro-batch need ") &&
                    EndsWith(more));
}

TEST_CASE("config: a run's optimizer steps on generated data fit in 64 bits", "[config][bounds]") {
  // 1e9 epochs of up to ceil(1e12 / 108) steps overflow, whatever the machine's memory.
  CHECK(parse_error(kMinimal, {"data.train.samples=1000000000000", "training.batch_size=108",
                               "training.epochs=1000000000"}) ==
        "--set training.epochs: training.epochs 1000000000 x up to 9259259260 optimizer steps per "
        "epoch (data.train.samples 1000000000000 / training.batch_size 108) overflow 64-bit "
        "integers");
  CHECK(parse_error(kMinimal, {"training.epochs=1000000000", "training.batch_size=1",
                               "data.train.samples=1000000000000"}) ==
        "--set data.train.samples: training.epochs 1000000000 x up to 1000000000000 optimizer "
        "steps per epoch (data.train.samples 1000000000000 / training.batch_size 1) overflow "
        "64-bit integers");
  // 1e9 epochs of 10 steps are fine; so are 1e9 epochs of any file's data (known once read).
  CHECK(parse_error(kMinimal, {"training.epochs=1000000000", "training.batch_size=1"}) ==
        "(no error)");
}

TEST_CASE("config: a rank's samples per optimizer step keep the global batch in 64 bits",
          "[config][bounds]") {
  CHECK(parse_error(kMinimal, {"training.batch_size=65536", "training.accumulate_steps=65536"}) ==
        "(no error)");
  CHECK(parse_error(kMinimal, {"training.batch_size=65536", "training.accumulate_steps=65537"}) ==
        "--set training.accumulate_steps: training.batch_size 65536 x training.accumulate_steps "
        "65537 samples per rank and optimizer step is more than 4294967296, which keeps the global "
        "batch over any number of ranks in 64 bits");
  CHECK(parse_error(kMinimal,
                    {"training.accumulate_steps=1000000", "training.batch_size=1000000000"}) ==
        "--set training.batch_size: training.batch_size 1000000000 x training.accumulate_steps "
        "1000000 samples per rank and optimizer step is more than 4294967296, which keeps the "
        "global batch over any number of ranks in 64 bits");
}

TEST_CASE("config: nesterov needs momentum and no dampening, as in PyTorch", "[config]") {
  CHECK(
      parse_error(kMinimal + "optimizer: {nesterov: true}\n") ==
      "run.yaml: optimizer.nesterov: requires momentum > 0 and dampening == 0 (as in PyTorch), got "
      "momentum 0.0, dampening 0.0");
  CHECK(
      parse_error(kMinimal + "optimizer: {nesterov: true, momentum: 0.9, dampening: 0.1}\n") ==
      "run.yaml: optimizer.nesterov: requires momentum > 0 and dampening == 0 (as in PyTorch), got "
      "momentum 0.9, dampening 0.1");
  CHECK(parse_min("optimizer: {nesterov: true, momentum: 0.9}\n").optimizer.nesterov);
}

TEST_CASE("config: unreadable and malformed files", "[config]") {
  TempDir tmp;
  CHECK(error_of([&] { ddp::load_config(tmp.path() + "/nope.yaml"); }) ==
        "config file '" + tmp.path() + "/nope.yaml': cannot open (No such file or directory)");
  CHECK(error_of([&] { ddp::load_config(tmp.path()); }) ==
        "config file '" + tmp.path() + "': not a regular file (a directory)");

  std::string bad = tmp.file("bad.yaml", "model:\n  layers: [4, 3\ntraining:\n  epochs: 2\n");
  CHECK(error_of([&] { ddp::load_config(bad); }) ==
        bad + ":3:9: invalid YAML: end of sequence flow not found");
  CHECK(parse_error("model: {layers: [4, 3]}\ntraining: epochs: 2\n") ==
        "run.yaml:2:17: invalid YAML: illegal map value");
  CHECK(parse_error("- 1\n- 2\n") ==
        "run.yaml: expected a map of sections (device, model, data, ...) at the "
        "top level, got a list");
  CHECK(parse_error(kMinimal + "---\n" + kMinimal) ==
        "run.yaml: expected one YAML document, found 2");
  // yaml-cpp would produce empty documents forever here; the count stops.
  for (const char* stray : {",", ", 3]}", "- a\n,"}) {
    INFO(stray);
    CHECK_THAT(parse_error(stray),
               Catch::Contains("found more than 100") && Catch::Contains("stray ','"));
  }
  std::string empty = tmp.file("empty.yaml", "# nothing yet\n");
  CHECK(error_of([&] { ddp::load_config(empty); }) ==
        empty + ": model.layers: needs at least 2 widths (input and output), got 0");

  std::string good = tmp.file("good.yaml", kMinimal);
  TrainConfig c = ddp::load_config(good, {"training.epochs=2"});
  CHECK(c.source == good);
  CHECK(c.training.epochs == 2);
}

TEST_CASE("config: npy data files must exist, and no key of another format is taken", "[config]") {
  TempDir tmp;
  tmp.file("x.npy");
  tmp.file("y.npy");
  std::string head = "model: {layers: [4, 3]}\ndata:\n  format: npy\n  dir: " + tmp.path() + "\n";
  const TrainConfig c = parse(head + "  train: {features: x.npy, labels: y.npy}\n");
  CHECK(c.data.format == ddp::DataFormat::Npy);
  CHECK(c.data.train.features == "x.npy");
  CHECK(parse_error(head + "  train: {labels: y.npy}\n") ==
        "run.yaml: data.train.features: required for data.format npy");
  CHECK(parse_error(head + "  train: {features: x.npy}\n") ==
        "run.yaml: data.train.labels: required for data.format npy");
  CHECK(parse_error(head + "  train: {features: no.npy, labels: y.npy}\n") ==
        "run.yaml: data.train.features: file not found: " + tmp.path() + "/no.npy");
  CHECK(
      parse_error(head + "  train: {features: x.npy, labels: y.npy}\n  test: {labels: y.npy}\n") ==
      "run.yaml: data.test.features: required when data.test.labels is set (a test split needs "
      "both features and labels)");
  CHECK(parse_error(head + "  train: {features: x.npy, labels: y.npy}\n"
                           "  test: {features: x.npy, labels: ty.npy}\n") ==
        "run.yaml: data.test.labels: file not found: " + tmp.path() + "/ty.npy");
  CHECK(parse_error(head + "  train: {features: x.npy, labels: y.npy, images: x.npy}\n") ==
        "run.yaml: data.train.images: does not apply to data.format npy (only to idx)");
  CHECK(parse_error("model: {layers: [4, 3]}\ndata:\n  train: {samples: 3, features: x.npy}\n") ==
        "run.yaml: data.train.features: does not apply to data.format synthetic (only to npy)");
}

TEST_CASE("config: idx data files must exist, resolved against data.dir", "[config]") {
  TempDir tmp;
  tmp.file("img.gz");
  tmp.file("lab.gz");
  std::string head = "model: {layers: [4, 3]}\ndata:\n  format: idx\n  dir: " + tmp.path() + "\n";
  CHECK_NOTHROW(parse(head + "  train: {images: img.gz, labels: lab.gz}\n"));
  CHECK(parse_error(head + "  train: {images: nope.gz, labels: lab.gz}\n") ==
        "run.yaml: data.train.images: file not found: " + tmp.path() + "/nope.gz");
  CHECK(parse_error(head + "  train: {images: img.gz}\n") ==
        "run.yaml: data.train.labels: required for data.format idx");
  CHECK(
      parse_error(head + "  train: {images: img.gz, labels: lab.gz}\n  test: {images: img.gz}\n") ==
      "run.yaml: data.test.labels: required when data.test.images is set (a test split needs both "
      "images "
      "and labels)");
  CHECK(
      parse_error(head + "  train: {images: img.gz, labels: lab.gz}\n  test: {labels: lab.gz}\n") ==
      "run.yaml: data.test.images: required when data.test.labels is set (a test split needs both "
      "images "
      "and labels)");
  CHECK(parse_error(head + "  train: {images: img.gz, labels: lab.gz}\n"
                           "  test: {images: t.gz, labels: lab.gz}\n") ==
        "run.yaml: data.test.images: file not found: " + tmp.path() + "/t.gz");
  fs::create_directory(tmp.path() + "/sub");
  CHECK(parse_error(head + "  train: {images: sub, labels: lab.gz}\n") ==
        "run.yaml: data.train.images: not a regular file: " + tmp.path() + "/sub");

  // Absolute paths ignore data.dir; relative ones with no data.dir resolve against the cwd.
  CHECK_NOTHROW(
      parse("model: {layers: [4, 3]}\ndata:\n  format: idx\n  dir: /nonexistent\n"
            "  train: {images: " +
            tmp.path() + "/img.gz, labels: " + tmp.path() + "/lab.gz}\n"));
  CHECK(parse_error(
            "model: {layers: [4, 3]}\ndata:\n  format: idx\n  train: {images: no-such-dir/i.gz, "
            "labels: no-such-dir/l.gz}\n") ==
        "run.yaml: data.train.images: file not found: " +
            (fs::current_path() / "no-such-dir/i.gz").string());
}

TEST_CASE("config: csv and init_from files must exist", "[config]") {
  TempDir tmp;
  std::string csv = tmp.file("d.csv", "1,2,0\n");
  std::string head = "model: {layers: [2, 3]}\ndata:\n  format: csv\n";
  CHECK(parse_error(head) == "run.yaml: data.train.path: required for data.format csv");
  CHECK(parse_error(head + "  train: {path: " + tmp.path() + "/x.csv}\n") ==
        "run.yaml: data.train.path: file not found: " + tmp.path() + "/x.csv");
  CHECK(parse_error(head + "  train: {path: " + csv + "}\n  test: {path: " + tmp.path() +
                    "/t.csv}\n") ==
        "run.yaml: data.test.path: file not found: " + tmp.path() + "/t.csv");
  CHECK(parse_error(kMinimal, {"model.init_from=" + tmp.path() + "/w.safetensors"}) ==
        "--set model.init_from: file not found: " + tmp.path() + "/w.safetensors");
}

TEST_CASE("config: keys of another data.format are rejected", "[config]") {
  TempDir tmp;
  std::string img = tmp.file("img"), lab = tmp.file("lab"), csv = tmp.file("d.csv");
  CHECK(parse_error(kMinimal, {"data.train.images=" + img}) ==
        "--set data.train.images: does not apply to data.format synthetic (only to idx)");
  CHECK(parse_error(
            "model: {layers: [4, 3]}\ndata:\n  train: {samples: 5}\n  test: {path: x.csv}\n") ==
        "run.yaml: data.test.path: does not apply to data.format synthetic (only to csv)");
  std::string idx = "model: {layers: [4, 3]}\ndata:\n  format: idx\n  train: {images: " + img +
                    ", labels: " + lab + "}\n";
  CHECK(parse_error(idx, {"data.train.samples=100"}) ==
        "--set data.train.samples: does not apply to data.format idx (only to synthetic)");
  CHECK(parse_error(idx, {"data.csv_header=true"}) ==
        "--set data.csv_header: does not apply to data.format idx (only to csv)");
  std::string csv_head =
      "model: {layers: [2, 3]}\ndata:\n  format: csv\n  train: {path: " + csv + "}\n";
  CHECK(parse_error(csv_head, {"data.test.labels=" + lab}) ==
        "--set data.test.labels: does not apply to data.format csv (only to idx or npy)");
  CHECK(
      parse_error(csv_head, {"data.seed=3"}) ==
      "--set data.seed: does not apply to data.format csv (only to synthetic; the shuffle seed is "
      "training.seed)");
  CHECK_NOTHROW(parse(csv_head, {"data.seed=0", "data.csv_header=true"}));
}

TEST_CASE("config: to_yaml prints every key and parses back to the same config", "[config]") {
  TempDir tmp;
  std::string init = tmp.file("in it \"q\".safetensors");
  TrainConfig syn = valid_config();
  syn.model.layers = {7, 5, 3, 2};
  syn.model.init_from = init;
  syn.data.dir = "some dir";
  syn.data.train.samples = 123;
  syn.data.test.samples = 45;
  syn.data.shuffle = false;
  syn.data.drop_last = true;
  syn.data.seed = 18446744073709551615ull;
  syn.data.prefetch = 5;
  syn.optimizer.lr = 0.1;
  syn.optimizer.momentum = 1.0 / 3.0;
  syn.optimizer.nesterov = true;
  syn.optimizer.weight_decay = 1e-7;
  syn.training = {9, 17, 3, 42, 0, 1000, true, "auto", false, ddp::NanPolicy::SkipStep};
  syn.checkpoint = {"ckpt dir: x", 0, 2, 0};
  syn.distributed.bucket_cap_mb = 0.25;
  syn.distributed.first_bucket_mb = 2.5;
  syn.distributed.shared_memory = false;
  syn.output = {"runs/a \"b\": c\\d #x\ty", false};

  TrainConfig idx = valid_config();
  idx.data.format = ddp::DataFormat::Idx;
  idx.data.dir = tmp.path();
  idx.data.train.samples = 0;
  idx.data.train.images = tmp.file("a");
  idx.data.train.labels = "b";
  tmp.file("b");
  idx.data.test.images = "a";
  idx.data.test.labels = "b";
  idx.optimizer.dampening = 0.75;

  TrainConfig csv = valid_config();
  csv.data.format = ddp::DataFormat::Csv;
  csv.data.train.samples = 0;
  csv.data.train.path = tmp.file("d.csv");
  csv.data.csv_header = true;

  TrainConfig npy = valid_config();
  npy.data.format = ddp::DataFormat::Npy;
  npy.data.train.samples = 0;
  npy.data.dir = tmp.path();
  npy.data.train.features = "x.npy";
  npy.data.train.labels = "y.npy";
  npy.data.test.features = tmp.file("tx.npy");
  npy.data.test.labels = "ty.npy";
  for (const char* name : {"x.npy", "y.npy", "ty.npy"}) tmp.file(name);

  for (const TrainConfig* c : {&syn, &idx, &csv, &npy}) {
    std::string text = ddp::to_yaml(*c);
    INFO(text);
    TrainConfig back = ddp::parse_config(text, "x");
    require_same(back, *c);
    CHECK(back.source == "x");
    CHECK((text.find("images:") != std::string::npos) == (c->data.format == ddp::DataFormat::Idx));
    CHECK((text.find("samples:") != std::string::npos) ==
          (c->data.format == ddp::DataFormat::Synthetic));
    CHECK((text.find("path:") != std::string::npos) == (c->data.format == ddp::DataFormat::Csv));
    CHECK((text.find("features:") != std::string::npos) ==
          (c->data.format == ddp::DataFormat::Npy));
  }
  std::string defaults = ddp::to_yaml(TrainConfig());
  for (auto line : {"device: \"cpu\"", "  bucket_cap_mb: 25.0", "  save_model: true", "  lr: 0.01",
                    "  layers: []", "  accumulate_steps: 1", "  seed: 0", "  prefetch: 4"}) {
    INFO(line);
    CHECK(defaults.find(std::string(line) + "\n") != std::string::npos);
  }
}

TEST_CASE("config: resolve_data_path", "[config]") {
  ddp::DataConfig d;
  CHECK(ddp::resolve_data_path(d, "a/b.gz") == "a/b.gz");
  d.dir = "/data/x";
  CHECK(ddp::resolve_data_path(d, "a/b.gz") == "/data/x/a/b.gz");
  CHECK(ddp::resolve_data_path(d, "/abs/b.gz") == "/abs/b.gz");
  d.dir = "rel/";
  CHECK(ddp::resolve_data_path(d, "b.gz") == "rel/b.gz");
}

TEST_CASE("config: configs/seed.yaml and configs/csv_example.yaml load", "[config]") {
  TrainConfig seed = ddp::load_config(kSourceDir + "/configs/seed.yaml");
  CHECK(seed.model.layers == std::vector<int64_t>{20, 10, 3});
  CHECK(seed.data.format == ddp::DataFormat::Synthetic);
  CHECK(seed.data.train.samples == 2000);
  CHECK(seed.training.batch_size == 50);
  CHECK(seed.training.epochs == 10);
  CHECK(seed.optimizer.lr == 0.001);
  CHECK(seed.training.print_shapes);
  CHECK(seed.output.dir == "runs/seed");

  // Its data path is relative to the repository root, where the docs say to run it from.
  TrainConfig csv =
      ddp::load_config(kSourceDir + "/configs/csv_example.yaml", {"data.dir=" + kSourceDir});
  CHECK(csv.data.format == ddp::DataFormat::Csv);
  CHECK(csv.model.layers.front() == 4);
  CHECK(csv.model.layers.back() == 3);
}

TEST_CASE("config: configs/fashion_mnist.yaml loads where the dataset is installed", "[config]") {
  if (!fs::exists("/usr/share/datasets/fashion-mnist")) {
    WARN("skipped: /usr/share/datasets/fashion-mnist not present");
    return;
  }
  TrainConfig c = ddp::load_config(kSourceDir + "/configs/fashion_mnist.yaml");
  CHECK(c.data.format == ddp::DataFormat::Idx);
  CHECK(c.model.layers == std::vector<int64_t>{784, 256, 256, 10});
  CHECK(c.optimizer.momentum == 0.9);
  CHECK(c.distributed.first_bucket_mb == 0.25);
  CHECK(c.data.test.configured());
}
