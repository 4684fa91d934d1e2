// What a run shows its user: rank 0's progress lines, <output.dir>/metrics.jsonl (one JSON
// object per line: train, epoch, eval, checkpoint, resume, skipped_step, summary) and the
// per-rank timeline <output.dir>/trace.json. Loss and accuracy are tallied per rank and
// reduced over ranks when a line is due.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "comm/process_group.h"
#include "core/atomic_file.h"
#include "ddp/config.h"
#include "ddp/train_summary.h"
#include "io/trace.h"
#include "kernels/backend.h"

namespace ddp {

class DeviceContext;

/// Sums of a phase's loss, correct predictions and sample count; reduced over ranks on demand.
struct Tally {
  double loss_sum = 0, correct = 0, count = 0;
  void add(const XentResult& r, int64_t rows);
  Tally reduced(ProcessGroup& comm) const;
  double loss() const { return count > 0 ? loss_sum / count : 0.0; }
  double accuracy() const { return count > 0 ? correct / count : 0.0; }
};

/// "12345 samples/s", "86.1%".
std::string format_rate(double samples_per_sec);
std::string percent(double fraction);

/// "MFU 12.3% of 1.20 TFLOP/s per rank (measured GEMM ceiling)", or why it is unknown.
std::string describe_mfu(const TrainSummary& sum);
/// "straggler: rank 1 was slowest at 9 of 10 logged steps past 1.5x (compute+data 2.4x the
/// median)"; for a summary that names one (straggler_rank >= 0).
std::string describe_straggler(const TrainSummary& sum);

class Reporter {
 public:
  /// log: where rank 0 prints (nullptr: silent).
  Reporter(const TrainConfig& cfg, ProcessGroup& comm, std::ostream* log);

  /// Rank 0, in output.dir (made and locked by RunDirectory): opens metrics.jsonl (continued on
  /// resume) and writes the effective config.yaml beside it, both through AtomicFile.
  void open_outputs();
  /// Collective when output.trace is set: the ranks' timelines start at (nearly) one moment.
  void start_trace(const DeviceContext& ctx);
  /// Collective: every rank's events into rank 0's trace.json.
  void write_trace(const std::string& device);

  /// A line on rank 0's log / a record in rank 0's metrics.jsonl.
  void say(const std::string& line) const;
  void record(const nlohmann::json& j);
  /// Collective: rank 0 prints one line per rank, in rank order.
  void say_each_rank(const std::string& mine);

  /// The run's last line and "summary" record; `overlap`: the share of allreduce time hidden
  /// behind backward over all ranks.
  void summary(const TrainSummary& sum, double overlap, const std::string& device);

  /// Collective: the global batch's and each replica's input and output shapes (the seed
  /// tutorial's "In Model" lines).
  void print_shapes(int64_t rows, int64_t features, int64_t classes);

  Tracer& tracer() { return *tracer_; }
  int compute_track() const { return track_compute_; }
  int comm_track() const { return track_comm_; }
  int data_track() const { return track_data_; }

 private:
  const TrainConfig& cfg_;
  ProcessGroup& comm_;
  std::ostream* log_;
  std::unique_ptr<AtomicFile> metrics_;  // published at once: readable while it grows
  std::unique_ptr<Tracer> tracer_ = std::make_unique<Tracer>();  // disabled unless output.trace
  int track_compute_ = -1, track_comm_ = -1, track_data_ = -1;
};

}  // namespace ddp
