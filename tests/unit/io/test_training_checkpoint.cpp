// Training checkpoints: exact round trips of weights, momentum and state; every single-bit
// flip and every truncation of a checkpoint refused; mismatched models and configs refused
// naming what differs; listing, pruning (keep_last) and a full disk that leaves the previous
// checkpoint intact.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/check.h"
#include "io/training_checkpoint.h"
#include "temp_files.h"
#include "test_helpers.h"

using Catch::Contains;
using ddp::NamedTensor;
using ddp::TrainingCheckpoint;
using ddp_test::TempDir;

namespace {

// state: the optimizer's arrays ({"momentum"}, {"exp_avg", "exp_avg_sq"}, or none).
TrainingCheckpoint sample_checkpoint(std::vector<std::string> state = {"momentum"}) {
  TrainingCheckpoint c;
  c.weights = {{"layers.0.weight", {3, 2}, {0.1f, -0.2f, 0.3f, 1e-30f, -4.5f, 6.0f}},
               {"layers.0.bias", {3}, {0.5f, -0.5f, 0.0f}},
               {"layers.1.weight", {2, 3}, {1, 2, 3, 4, 5, 6}},
               {"layers.1.bias", {2}, {-1.0f, 1.0f}}};
  float offset = 1e-3f;
  for (const std::string& name : state) {
    ddp::OptimizerState array{name, {}};
    for (const NamedTensor& w : c.weights) {
      NamedTensor m = w;
      for (float& v : m.data) v = v * 0.25f + offset;
      array.tensors.push_back(m);
    }
    c.optimizer.push_back(array);
    offset *= 2.0f;
  }
  c.state.epoch = 2;
  c.state.step_in_epoch = 7;
  c.state.epoch_position = 56;
  c.state.global_step = 31;
  c.state.optimizer_steps = 30;
  c.state.skipped_steps = 1;
  c.state.world_size = 4;
  c.state.global_batch = 8;
  c.state.train_samples = 100;
  c.state.epoch_loss_sum = 0.1 + 1e-17;
  c.state.epoch_correct = 17.0;
  c.state.epoch_count = 56.0;
  c.state.config = "model.layers = [2, 3, 2]\noptimizer.lr = 0.1\ntraining.batch_size = 2\n";
  return c;
}

ddp::ResumeExpectation expectation_of(const TrainingCheckpoint& c) {
  ddp::ResumeExpectation e;
  for (const NamedTensor& w : c.weights) e.parameters.emplace_back(w.name, w.shape);
  for (const ddp::OptimizerState& o : c.optimizer) e.optimizer_state.push_back(o.name);
  e.train_samples = c.state.train_samples;
  e.config = c.state.config;
  return e;
}

void require_same_tensors(const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].name == b[i].name);
    CHECK(a[i].shape == b[i].shape);
    REQUIRE(a[i].data.size() == b[i].data.size());
    CHECK(std::memcmp(a[i].data.data(), b[i].data.data(), a[i].data.size() * sizeof(float)) == 0);
  }
}

// The same arrays, whatever order the file lists them in.
void require_same_state(const std::vector<ddp::OptimizerState>& a,
                        const std::vector<ddp::OptimizerState>& b) {
  REQUIRE(a.size() == b.size());
  for (const ddp::OptimizerState& x : b) {
    const auto it =
        std::find_if(a.begin(), a.end(), [&](const auto& y) { return y.name == x.name; });
    REQUIRE(it != a.end());
    require_same_tensors(it->tensors, x.tensors);
  }
}

using ddp_test::error_of;

}  // namespace

TEST_CASE("checkpoint round trip is exact", "[checkpoint]") {
  TempDir dir("ddp_ckpt");
  const std::vector<std::vector<std::string>> optimizers = {
      {"momentum"}, {}, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}};
  for (const auto& state : optimizers) {
    TrainingCheckpoint c = sample_checkpoint(state);
    c.state.loss_scale = 1048576.0;  // loss scaling's state: 2^20, 17 clean steps
    c.state.loss_scale_growth_tracker = 17;
    const std::string path = ddp::checkpoint_path(dir.path().string(), c.state.global_step);
    CHECK(path == dir.path().string() + "/step-000000031.safetensors");
    ddp::write_checkpoint(path, c);
    const TrainingCheckpoint r = ddp::read_checkpoint(path);
    require_same_tensors(r.weights, c.weights);
    require_same_state(r.optimizer, c.optimizer);
    CHECK(r.state.epoch == 2);
    CHECK(r.state.step_in_epoch == 7);
    CHECK(r.state.epoch_position == 56);
    CHECK(r.state.global_step == 31);
    CHECK(r.state.optimizer_steps == 30);
    CHECK(r.state.skipped_steps == 1);
    CHECK(r.state.scaler_skipped_steps == 0);
    CHECK(r.state.loss_scale == 1048576.0);
    CHECK(r.state.loss_scale_growth_tracker == 17);
    CHECK(r.state.world_size == 4);
    CHECK(r.state.global_batch == 8);
    CHECK(r.state.train_samples == 100);
    CHECK(r.state.epoch_loss_sum == c.state.epoch_loss_sum);  // exact, not rounded to text
    CHECK(r.state.epoch_correct == 17.0);
    CHECK(r.state.epoch_count == 56.0);
    CHECK(r.state.config == c.state.config);
    CHECK_NOTHROW(ddp::check_resumable(r, path, expectation_of(c)));
  }
}

TEST_CASE("checkpoint: the model tensors load as plain safetensors", "[checkpoint]") {
  TempDir dir("ddp_ckpt");
  const std::string path = dir.file("c.safetensors");
  ddp::write_checkpoint(path, sample_checkpoint());
  std::map<std::string, std::string> metadata;
  const auto tensors = ddp::load_safetensors(path, &metadata);
  REQUIRE(tensors.size() == 8);
  CHECK(tensors[0].name == "layers.0.weight");
  CHECK(tensors[4].name == "optimizer.momentum.layers.0.weight");
  CHECK(metadata["format"] == "pt");
  CHECK(metadata["ddp.global_step"] == "31");
}

TEST_CASE("checkpoint: every single-bit flip and every truncation is refused", "[checkpoint]") {
  TempDir dir("ddp_ckpt");
  const std::string good = dir.file("good.safetensors");
  ddp::write_checkpoint(good, sample_checkpoint());
  const std::string bytes = ddp_test::read_bytes(good);
  const std::string bad = dir.file("bad.safetensors");
  size_t refused = 0, checksum = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string flipped = bytes;
      flipped[i] = static_cast<char>(flipped[i] ^ (1 << bit));
      ddp_test::write_bytes(bad, flipped);
      const std::string msg = error_of([&] { ddp::read_checkpoint(bad); });
      INFO("byte " << i << " bit " << bit << ": " << msg);
      CHECK(msg != "(no error)");
      CHECK(msg.find(bad) != std::string::npos);
      refused += msg != "(no error)";
      checksum += msg.find("checksum mismatch") != std::string::npos;
    }
  }
  CHECK(refused == 8 * bytes.size());
  CHECK(checksum > 8 * 4 * 24);  // at least every flip in the tensor data
  for (size_t n = 0; n < bytes.size(); n += 7) {
    ddp_test::write_bytes(bad, bytes.substr(0, n));
    INFO("truncated to " << n << " bytes");
    CHECK_THAT(error_of([&] { ddp::read_checkpoint(bad); }), Contains("unreadable or corrupt"));
  }
}

namespace {

// sample_checkpoint with PowerSGD's state of its 4 ranks: each rank's error feedback and the
// first weight's Q [2, 1] (rank-1 factors of the 3 x 2 weight).
TrainingCheckpoint with_powersgd(TrainingCheckpoint c) {
  for (int rank = 0; rank < c.state.world_size; ++rank) {
    std::vector<NamedTensor> error = c.weights;
    for (NamedTensor& t : error)
      for (float& v : t.data) v = v * 0.5f - 0.125f * static_cast<float>(rank);
    c.powersgd.error.push_back(error);
  }
  c.powersgd.q = {{"layers.0.weight", {2, 1}, {0.6f, -0.8f}}};
  return c;
}

}  // namespace

TEST_CASE("checkpoint: PowerSGD's state round trips, and malformed state is refused",
          "[checkpoint][powersgd]") {
  TempDir dir("ddp_ckpt");
  const std::string path = dir.file("powersgd.safetensors");
  const TrainingCheckpoint c = with_powersgd(sample_checkpoint());
  ddp::write_checkpoint(path, c);
  const TrainingCheckpoint r = ddp::read_checkpoint(path);
  require_same_tensors(r.weights, c.weights);
  require_same_state(r.optimizer, c.optimizer);
  REQUIRE(r.powersgd.error.size() == 4);
  for (size_t rank = 0; rank < 4; ++rank)
    require_same_tensors(r.powersgd.error[rank], c.powersgd.error[rank]);
  require_same_tensors(r.powersgd.q, c.powersgd.q);
  CHECK_NOTHROW(ddp::check_resumable(r, path, expectation_of(c)));
  CHECK(ddp::read_checkpoint((ddp::write_checkpoint(path, sample_checkpoint()), path))
            .powersgd.empty());

  const auto refusal = [&](const std::function<void(TrainingCheckpoint&)>& change) {
    TrainingCheckpoint bad = with_powersgd(sample_checkpoint());
    change(bad);
    ddp::write_checkpoint(path, bad);
    return error_of([&] { ddp::read_checkpoint(path); });
  };
  CHECK_THAT(refusal([](auto& b) { b.powersgd.error.pop_back(); }),
             Contains("PowerSGD error feedback is stored for 3 of 4 ranks"));
  CHECK_THAT(refusal([](auto& b) { b.powersgd.error.emplace_back(b.weights); }),
             Contains("'powersgd.error.4.layers.0.weight' is the error feedback of rank 4, and "
                      "the run had 4 rank(s)"));
  CHECK_THAT(refusal([](auto& b) { b.powersgd.error[2].pop_back(); }),
             Contains("PowerSGD error feedback of rank 2 is stored for 3 of 4 tensors"));
  CHECK_THAT(refusal([](auto& b) {
               b.powersgd.error[1][1].shape = {1, 3};
             }),
             Contains("PowerSGD error feedback of rank 1 tensor 'layers.0.bias' has shape "
                      "[1, 3], its weight [3]"));
  CHECK_THAT(refusal([](auto& b) {
               b.powersgd.q[0] = {"layers.0.weight", {3, 1}, {1, 0, 0}};
             }),
             Contains("PowerSGD Q tensor 'layers.0.weight' has shape [3, 1], which is not "
                      "[in, r] for its weight [3, 2]"));
  CHECK_THAT(refusal([](auto& b) { b.powersgd.q[0].name = "layers.0.bias"; }),
             Contains("is not [in, r] for its weight [3]"));
  CHECK_THAT(refusal([](auto& b) { b.powersgd.q[0].name = "layers.7.weight"; }),
             Contains("PowerSGD Q tensor 'layers.7.weight' has no weight of that name"));
  CHECK_THAT(refusal([](auto& b) {
               b.weights.push_back({"powersgd.error.x.layers.0.bias", {3}, {0, 0, 0}});
             }),
             Contains("tensor 'powersgd.error.x.layers.0.bias' is not "
                      "powersgd.error.<rank>.<weight>"));
  CHECK_THAT(refusal([](auto& b) { b.powersgd.error[0][3].data[1] = std::nanf(""); }),
             Contains("powersgd.error.0.layers.1.bias"));
}

TEST_CASE("checkpoint: a model file and malformed state are refused", "[checkpoint]") {
  TempDir dir("ddp_ckpt");
  const std::string model = dir.file("model.safetensors");
  ddp::save_safetensors(model, sample_checkpoint().weights, {{"format", "pt"}});
  CHECK_THAT(error_of([&] { ddp::read_checkpoint(model); }),
             Contains("not a training checkpoint") && Contains("model.init_from"));
  CHECK_THAT(error_of([&] { ddp::read_checkpoint(dir.file("none.safetensors")); }),
             Contains("unreadable or corrupt") && Contains("No such file"));

  TrainingCheckpoint c = sample_checkpoint();
  c.state.epoch_position = 100;  // not inside 100 samples
  const std::string path = dir.file("pos.safetensors");
  ddp::write_checkpoint(path, c);
  CHECK_THAT(error_of([&] { ddp::read_checkpoint(path); }),
             Contains("'ddp.epoch_position' 100 is not inside the training set of 100"));
  c = sample_checkpoint();
  c.state.optimizer_steps = 40;
  ddp::write_checkpoint(path, c);
  CHECK_THAT(error_of([&] { ddp::read_checkpoint(path); }), Contains("step counters disagree"));
  c = sample_checkpoint();
  c.state.scaler_skipped_steps = 1;  // 30 applied + 1 + 1 skipped > 31
  ddp::write_checkpoint(path, c);
  CHECK_THAT(error_of([&] { ddp::read_checkpoint(path); }), Contains("step counters disagree"));
  for (const double scale : {1e38, 3.3, -2.0, 1e-39}) {  // beyond 2^126, not float32, ...
    c = sample_checkpoint();
    c.state.loss_scale = scale;
    ddp::write_checkpoint(path, c);
    CHECK_THAT(error_of([&] { ddp::read_checkpoint(path); }),
               Contains("metadata 'ddp.loss_scale' is") &&
                   Contains("not 0 or a float32 value in [2^-126, 2^126]"));
  }
  c = sample_checkpoint();
  c.optimizer[0].tensors[1].shape = {1, 3};
  ddp::write_checkpoint(path, c);
  CHECK_THAT(
      error_of([&] { ddp::read_checkpoint(path); }),
      Contains("optimizer momentum tensor 'layers.0.bias' has shape [1, 3], its weight [3]"));
  c = sample_checkpoint({"exp_avg", "exp_avg_sq"});
  c.optimizer[1].tensors.pop_back();
  ddp::write_checkpoint(path, c);
  CHECK_THAT(error_of([&] { ddp::read_checkpoint(path); }),
             Contains("optimizer exp_avg_sq is stored for 3 of 4 tensors"));
  c = sample_checkpoint();
  c.optimizer[0].tensors[0].name = "layers.9.weight";
  ddp::write_checkpoint(path, c);
  CHECK_THAT(error_of([&] { ddp::read_checkpoint(path); }),
             Contains("optimizer momentum tensor 'layers.9.weight' has no weight of that name"));
  c = sample_checkpoint();
  c.optimizer[0].name = "bad.name";
  CHECK_THAT(error_of([&] { ddp::write_checkpoint(path, c); }),
             Contains("optimizer state name 'bad.name' is empty or has a dot"));
  // A tensor under optimizer. that names no state.
  c = sample_checkpoint({});
  c.weights.push_back({"optimizer.stray", {1}, {0.0f}});
  ddp::write_checkpoint(path, c);
  CHECK_THAT(error_of([&] { ddp::read_checkpoint(path); }),
             Contains("tensor 'optimizer.stray' is not optimizer.<state>.<weight>"));
}

TEST_CASE("checkpoint: a NaN or an infinity in the weights or the momentum is refused",
          "[checkpoint]") {
  TempDir dir("ddp_ckpt");
  const std::string path = dir.file("nan.safetensors");
  TrainingCheckpoint c = sample_checkpoint();
  c.optimizer[0].tensors[2].data[4] = std::numeric_limits<float>::quiet_NaN();
  ddp::write_checkpoint(path, c);  // the checksum covers it: only the value check can tell
  CHECK(
      error_of([&] { ddp::read_checkpoint(path); }) ==
      "checkpoint '" + path +
          "': tensor 'optimizer.momentum.layers.1.weight' holds nan at index 4 (row 1, column 1)");
}

TEST_CASE("checkpoint: a different model, data or config is refused naming it", "[checkpoint]") {
  TempDir dir("ddp_ckpt");
  const std::string path = dir.file("c.safetensors");
  const TrainingCheckpoint c = sample_checkpoint();
  ddp::write_checkpoint(path, c);
  const TrainingCheckpoint r = ddp::read_checkpoint(path);
  auto refusal = [&](const std::function<void(ddp::ResumeExpectation&)>& change) {
    ddp::ResumeExpectation e = expectation_of(c);
    change(e);
    return error_of([&] { ddp::check_resumable(r, path, e); });
  };
  CHECK_THAT(refusal([](auto& e) {
               e.parameters[2].second = {2, 4};
             }),
             Contains("tensor 'layers.1.weight' has shape [2, 3], the model's is [2, 4]"));
  CHECK_THAT(refusal([](auto& e) {
               e.parameters.push_back({"layers.2.weight", {1, 2}});
             }),
             Contains("has no tensor 'layers.2.weight' (the model differs)"));
  CHECK_THAT(refusal([](auto& e) { e.parameters.pop_back(); }),
             Contains("tensor 'layers.1.bias' is not a parameter of the model"));
  CHECK_THAT(
      refusal([](auto& e) { e.optimizer_state.clear(); }),
      Contains("holds optimizer state 'momentum', which this run's optimizer does not keep"));
  CHECK_THAT(refusal([](auto& e) {
               e.optimizer_state = {"momentum", "exp_avg"};
             }),
             Contains("has no optimizer state 'exp_avg', which this run's optimizer keeps (after "
                      "30 updates)"));
  CHECK_THAT(
      refusal([](auto& e) {
        e.optimizer_state = {"exp_avg", "exp_avg_sq"};
      }),
      Contains("holds optimizer state 'momentum', which this run's optimizer does not keep"));
  CHECK_THAT(refusal([](auto& e) { e.train_samples = 99; }),
             Contains("training set of 100 samples, this run's has 99"));
  CHECK_THAT(refusal([](auto& e) {
               e.config =
                   "model.layers = [2, 3, 2]\noptimizer.lr = 0.01\ntraining.batch_size = 2\n";
             }),
             Contains("optimizer.lr: the checkpoint was written with 0.1, this run has 0.01"));
  CHECK_THAT(refusal([](auto& e) { e.config += "training.seed = 3\n"; }),
             Contains("training.seed: not recorded in the checkpoint (this run has 3)"));
  // A key added after the checkpoint was written: accepted at its default only.
  CHECK_THAT(refusal([](auto& e) {
               e.config += "optimizer.eps = 1e-08\n";
               e.defaults = "optimizer.eps = 1e-08\n";
             }),
             Contains("(no error)"));
  CHECK_THAT(refusal([](auto& e) {
               e.config += "optimizer.eps = 0.001\n";
               e.defaults = "optimizer.eps = 1e-08\n";
             }),
             Contains("optimizer.eps: not recorded in the checkpoint (this run has 0.001)"));
  CHECK_THAT(refusal([](auto& e) { e.config = "model.layers = [2, 3, 2]\noptimizer.lr = 0.1\n"; }),
             Contains("training.batch_size: set to 2 in the checkpoint, unknown to this run"));
  CHECK_THAT(refusal([](auto&) {}), Contains("(no error)"));
}

TEST_CASE("checkpoint listing, keep_last of this run only and interrupted writes", "[checkpoint]") {
  TempDir dir("ddp_ckpt");
  const std::string d = dir.path().string();
  CHECK(ddp::list_checkpoints(d + "/missing").empty());
  TrainingCheckpoint c = sample_checkpoint();
  const std::string mine = "0123456789abcdef", theirs = "fedcba9876543210";
  auto write_step = [&](int64_t step, const std::string& run) {
    c.state.global_step = step;
    c.state.step_in_epoch = 0;
    c.state.optimizer_steps = 0;
    c.state.skipped_steps = 0;
    c.state.run = run;
    ddp::write_checkpoint(ddp::checkpoint_path(d, step), c);
  };
  for (int64_t step : {5, 40, 10, 1000000000}) write_step(step, mine);
  write_step(20, theirs);
  write_step(2000000000, theirs);  // an earlier run's, further along
  write_step(7, "");               // written before runs were named
  // What writers killed mid-write leave (one gone, one still running), and other files.
  const std::string torn = d + "/step-000000050.safetensors.tmp." +
                           std::to_string(ddp_test::dead_pid()) + ".0123456789abcdef";
  const std::string live =
      d + "/step-000000060.safetensors.tmp." + std::to_string(::getppid()) + ".0123456789abcdef";
  ddp_test::write_bytes(torn, "torn");
  ddp_test::write_bytes(live, "being written");
  ddp_test::write_bytes(d + "/step-12x.safetensors", "x");
  ddp_test::write_bytes(d + "/notes.txt", "x");
  const auto all = ddp::list_checkpoints(d);
  std::vector<int64_t> steps;
  for (const auto& [step, path] : all) steps.push_back(step);
  CHECK(steps == std::vector<int64_t>{5, 7, 10, 20, 40, 1000000000, 2000000000});
  CHECK(ddp::checkpoint_run(ddp::checkpoint_path(d, 40)) == mine);
  CHECK(ddp::checkpoint_run(ddp::checkpoint_path(d, 7)).empty());
  CHECK(ddp::checkpoint_run(d + "/notes.txt").empty());
  // Step 40 was just written (a run resumed from an older checkpoint): it stays, with the
  // newest other one of this run.
  auto removed = ddp::prune_checkpoints(d, 2, mine, ddp::checkpoint_path(d, 40));
  std::sort(removed.begin(), removed.end());
  CHECK(removed ==
        std::vector<std::string>{ddp::checkpoint_path(d, 5), ddp::checkpoint_path(d, 10), torn});
  CHECK(ddp_test::dir_entries(dir.path()) ==
        std::vector<std::string>{
            "notes.txt", "step-000000007.safetensors", "step-000000020.safetensors",
            "step-000000040.safetensors",
            "step-000000060.safetensors.tmp." + std::to_string(::getppid()) + ".0123456789abcdef",
            "step-1000000000.safetensors", "step-12x.safetensors", "step-2000000000.safetensors"});
  CHECK(ddp::prune_checkpoints(d, 0, mine, "").empty());  // 0 keeps everything
  CHECK(ddp::prune_checkpoints(d, 1, "", "").empty());    // an unnamed run prunes nothing
  CHECK(ddp::prune_checkpoints(d, 1, mine, ddp::checkpoint_path(d, 40)) ==
        std::vector<std::string>{ddp::checkpoint_path(d, 1000000000)});
}

TEST_CASE("checkpoint counters beyond 2^53 and malformed run names are refused", "[checkpoint]") {
  TempDir dir("ddp_ckpt");
  const std::string path = dir.file("step-000000031.safetensors");
  TrainingCheckpoint c = sample_checkpoint();
  c.state.global_step = int64_t{1} << 53;
  c.state.step_in_epoch = 0;
  ddp::write_checkpoint(path, c);
  CHECK_NOTHROW(ddp::read_checkpoint(path));
  c.state.global_step = INT64_MAX - 1;
  ddp::write_checkpoint(path, c);
  CHECK_THAT(error_of([&] { ddp::read_checkpoint(path); }),
             Contains("metadata 'ddp.global_step' is 9223372036854775806, more than the largest "
                      "count a run can reach (2^53)"));
  c = sample_checkpoint();
  c.state.run = "../../etc";
  ddp::write_checkpoint(path, c);
  CHECK_THAT(error_of([&] { ddp::read_checkpoint(path); }),
             Contains("metadata 'ddp.run' is not a run name"));
}

TEST_CASE("new run names are 16 hex digits and differ", "[checkpoint]") {
  const std::string a = ddp::new_run_name(), b = ddp::new_run_name();
  CHECK(a.size() == 16);
  CHECK(a.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(a != b);
}

TEST_CASE("checkpoint: a full disk during a write leaves the previous one intact", "[checkpoint]") {
  TempDir dir("ddp_ckpt");
  const std::string d = dir.path().string();
  TrainingCheckpoint c = sample_checkpoint();
  const std::string first = ddp::checkpoint_path(d, 31);
  ddp::write_checkpoint(first, c);
  const std::string before = ddp_test::read_bytes(first);
  c.state.global_step = 40;
  const std::string second = ddp::checkpoint_path(d, 40);
  {
    ddp_test::FileSizeLimit limit(before.size() / 2);
    CHECK_THAT(error_of([&] { ddp::write_checkpoint(second, c); }),
               Contains(second) && Contains("File too large"));
  }
  CHECK(ddp_test::dir_entries(dir.path()) ==
        std::vector<std::string>{"step-000000031.safetensors"});
  CHECK(ddp::list_checkpoints(d).back().second == first);
  CHECK(ddp_test::read_bytes(first) == before);
  CHECK_NOTHROW(ddp::read_checkpoint(first));
  // A real full file system, where mounting one is allowed.
  const std::string small = d + "/small";
  std::filesystem::create_directory(small);
  ddp_test::TinyTmpfs fs(small, "size=4k");
  if (!fs.ok()) {
    WARN("tmpfs part skipped: mounting needs root (the file-size limit above covers the path)");
    return;
  }
  ddp::write_checkpoint(small + "/step-000000031.safetensors", sample_checkpoint());
  CHECK_THAT(error_of([&] { ddp::write_checkpoint(small + "/step-000000040.safetensors", c); }),
             Contains("No space left on device"));
  CHECK(ddp::list_checkpoints(small).back().second == small + "/step-000000031.safetensors");
  CHECK_NOTHROW(ddp::read_checkpoint(small + "/step-000000031.safetensors"));
}
