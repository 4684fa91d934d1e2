// The directories a run writes to, held by one job at a time. Rank 0 makes output.dir (and a
// checkpoint.dir of its own), locks them for the run's life (io/directory_lock.h) and decides
// what an earlier run's files there mean: a fresh run refuses to start beside an earlier run's
// checkpoints (its progress would be pruned or resumed by mistake) unless training.start_over
// moves the earlier run's files aside; nothing is ever deleted but the temporary files of
// interrupted writes whose writer is gone.
#pragma once

#include <string>
#include <vector>

#include "ddp/config.h"
#include "io/directory_lock.h"

namespace ddp {

/// The files a run writes in output.dir (besides checkpoint.dir's checkpoints).
struct RunFiles {
  static constexpr const char* kMetrics = "metrics.jsonl";
  static constexpr const char* kConfig = "config.yaml";
  static constexpr const char* kModel = "model.safetensors";
  static constexpr const char* kTrace = "trace.json";
  static constexpr const char* kAll[] = {kMetrics, kConfig, kModel, kTrace};
  /// "<output.dir>/<name>".
  static std::string in(const TrainConfig& cfg, const char* name) {
    return cfg.output.dir + "/" + name;
  }
};

class RunDirectory {
 public:
  /// Rank 0, before the run writes anything. Throws ddp::Error naming the key: the directory
  /// is another live job's, a link planted by another user, or holds an earlier run's
  /// checkpoints while this run starts fresh without training.start_over.
  void claim(const TrainConfig& cfg);
  /// What the log should say: locks taken over, files moved aside or swept.
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  void lock(const std::string& dir, const std::string& key);
  void start_over(const TrainConfig& cfg, const std::string& checkpoint_dir);

  std::vector<DirectoryLock> locks_;
  std::vector<std::string> notes_;
};

/// Moves `paths` (files of `dir`) into a new folder "<dir>/<prefix>-<UTC time>" by renaming:
/// never a copy, never a deletion. Returns the folder. Throws naming the file that would not move.
std::string set_aside(const std::vector<std::string>& paths, const std::string& dir,
                      const std::string& prefix);

}  // namespace ddp
