// Resuming from a checkpoint (resume.h).
#include "train/resume.h"

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <type_traits>
#include <vector>

#include "comm/agreement.h"
#include "config/fingerprint.h"
#include "core/check.h"
#include "train/powersgd_state.h"
#include "train/run_directory.h"

namespace ddp {

namespace {

// Collective: rank 0's position on every rank (counts travel as exact doubles, far below 2^53).
void broadcast_state(ProcessGroup& comm, TrainingState& st) {
  std::vector<double> numbers;
  visit_training_state(st, [&](const char*, auto& value) {
    if constexpr (!std::is_same_v<std::decay_t<decltype(value)>, std::string>)
      numbers.push_back(static_cast<double>(value));
  });
  comm.broadcast(numbers.data(), numbers.size() * sizeof(double), 0);
  size_t next = 0;
  visit_training_state(st, [&](const char*, auto& value) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, std::string>) {
      value = broadcast_string(comm, value, 0);
    } else {
      value = static_cast<T>(numbers[next++]);
    }
  });
}

// Rank 0: what a run resumes from, and the newer checkpoints that could not continue it.
struct Resumable {
  std::string path;  ///< "" when there is nothing to resume
  TrainingCheckpoint ckpt;
  std::vector<std::string> skipped;  ///< "<reason>" per checkpoint passed over, newest first
  std::string set_aside;             ///< where those were moved ("" if none)
};

TrainingCheckpoint read_resumable(const std::string& path, const ResumeExpectation& expected) {
  std::error_code ec;
  DDP_CHECK(std::filesystem::exists(path, ec),
            "training.resume: checkpoint file not found: " << path << " (on rank 0)");
  TrainingCheckpoint ck = read_checkpoint(path);
  check_resumable(ck, path, expected);
  return ck;
}

// training.resume auto: the newest checkpoint that validates (checksum, shapes, settings);
// the newer ones that do not are set aside, so this run never writes over them. Throws when
// there are checkpoints and none can continue this run.
Resumable newest_resumable(const std::string& dir, const ResumeExpectation& expected) {
  const auto all = list_checkpoints(dir);
  Resumable r;
  std::vector<std::string> passed_over;
  for (auto it = all.rbegin(); it != all.rend() && r.path.empty(); ++it) {
    try {
      r.ckpt = read_resumable(it->second, expected);
      r.path = it->second;
    } catch (const Error& e) {
      r.skipped.push_back(e.message());
      passed_over.push_back(it->second);
    }
  }
  if (r.path.empty() && !all.empty()) {
    std::ostringstream why;
    for (const std::string& reason : r.skipped) why << "\n  " << reason;
    DDP_THROW("training.resume auto: none of the " << all.size() << " checkpoint(s) in " << dir
                                                   << " can continue this run:" << why.str());
  }
  if (!passed_over.empty()) r.set_aside = set_aside(passed_over, dir, "skipped");
  return r;
}

// What this run needs of a checkpoint to continue from it.
ResumeExpectation expectation(const TrainConfig& cfg, const Replica& replica,
                              int64_t train_samples) {
  ResumeExpectation expected;
  expected.parameters = replica.shapes();
  expected.optimizer_state = optimizer_state_names(cfg.optimizer);
  expected.train_samples = train_samples;
  expected.config = resume_fingerprint(cfg);
  expected.defaults = resume_fingerprint(TrainConfig{});
  return expected;
}

// Rank 0's log: each checkpoint passed over and why, and where they went.
void report_skipped(Reporter& report, const Resumable& found) {
  for (const std::string& reason : found.skipped) report.say("resume: skipped " + reason);
  if (!found.set_aside.empty())
    report.say("resume: the " + std::to_string(found.skipped.size()) +
               " checkpoint(s) skipped are kept in " + found.set_aside);
}

void report_resume(const TrainConfig& cfg, ProcessGroup& comm, Reporter& report,
                   const std::string& path, const TrainingState& start) {
  std::ostringstream line;
  line << "resume: " << path << ": epoch " << start.epoch + 1 << " step " << start.step_in_epoch
       << " (" << start.global_step << " steps done)";
  report.say(line.str());
  const int64_t global_batch = cfg.global_batch(comm.size());
  DDP_CHECK(!cfg.training.bitwise_across_world_sizes || start.global_batch == global_batch,
            "training.bitwise_across_world_sizes: "
                << path << " was written with a global batch of " << start.global_batch
                << " samples per step and this run's is " << global_batch << " = "
                << cfg.training.batch_size << " per rank x " << comm.size() << " rank(s) x "
                << cfg.training.accumulate_steps
                << " accumulation step(s): set training.batch_size to keep the global batch");
  if (start.global_batch != global_batch) {
    report.say("warning: the global batch changes from " + std::to_string(start.global_batch) +
               " samples per step (" + std::to_string(start.world_size) +
               " rank(s) in the checkpoint) to " + std::to_string(global_batch) + " = " +
               std::to_string(cfg.training.batch_size) + " per rank x " +
               std::to_string(comm.size()) + " rank(s) x " +
               std::to_string(cfg.training.accumulate_steps) +
               " accumulation step(s): training continues, but not as the uninterrupted run "
               "would (keep training.batch_size x ranks the same to keep the global batch)");
  } else if (start.world_size != comm.size()) {
    report.say("resume: " + std::to_string(start.world_size) + " rank(s) in the checkpoint, " +
               std::to_string(comm.size()) + " now; the global batch stays " +
               std::to_string(global_batch));
  }
  report.record({{"type", "resume"},
                 {"checkpoint", path},
                 {"epoch", start.epoch + 1},
                 {"step", start.step_in_epoch},
                 {"global_step", start.global_step},
                 {"checkpoint_world_size", start.world_size},
                 {"world_size", comm.size()}});
}

}  // namespace

bool resume_training(const TrainConfig& cfg, ProcessGroup& comm, Replica& replica, Reporter& report,
                     const std::string& checkpoint_dir, int64_t train_samples, TrainingState& at) {
  if (cfg.training.resume.empty()) return false;
  const size_t numel = replica.plan().total_numel;
  std::vector<float> weights(numel, 0.0f);
  const std::vector<std::string> state_names = optimizer_state_names(cfg.optimizer);
  // Zero where the checkpoint has no state yet (no update taken): as the optimizer starts.
  std::vector<std::vector<float>> state(state_names.size(), std::vector<float>(numel, 0.0f));
  Resumable found;
  run_agreed(comm, [&] {
    if (comm.rank() != 0) return;
    const ResumeExpectation expected = expectation(cfg, replica, train_samples);
    if (cfg.training.resume == "auto") {
      found = newest_resumable(checkpoint_dir, expected);
    } else {
      found.path = cfg.training.resume;
      found.ckpt = read_resumable(found.path, expected);
    }
    if (found.path.empty()) return;
    replica.place(found.ckpt.weights, weights);
    for (const OptimizerState& stored : found.ckpt.optimizer) {
      const auto at = std::find(state_names.begin(), state_names.end(), stored.name);
      replica.place(stored.tensors, state[static_cast<size_t>(at - state_names.begin())]);
    }
  });
  report_skipped(report, found);
  const std::string path = broadcast_string(comm, found.path, 0);
  if (path.empty()) {
    report.say("resume: no checkpoint in " + checkpoint_dir + ", starting from the beginning");
    return false;
  }
  TrainingState start = found.ckpt.state;
  comm.broadcast(weights.data(), weights.size() * sizeof(float), 0);
  for (std::vector<float>& array : state)
    comm.broadcast(array.data(), array.size() * sizeof(float), 0);
  broadcast_state(comm, start);
  replica.restore(weights, state, start.optimizer_steps);
  report_resume(cfg, comm, report, path, start);
  const std::string afresh =
      resume_powersgd_state(comm, replica, found.ckpt.powersgd, start.global_step);
  if (!afresh.empty()) report.say(afresh);
  at = start;
  return true;
}

}  // namespace ddp
