// The flight recorder of a rank: a ring of its last N collectives (control messages and gradient
// buckets alike, numbered in the order the training thread issued them, so collective k is the
// same on every rank unless the ranks fell out of step), with the step and bucket they belong
// to, when they were queued, started and ended, and how they ended. The communicators record
// into it; it is written as <output.dir>/flight/rank-<R>.json on a timeout, a fatal error,
// SIGUSR2 or at exit, and read back by the hang analysis (io/flight_analysis.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ddp {

class FlightRecorder {
 public:
  enum class State { Queued, Started, Completed, Failed, TimedOut };
  static constexpr double kNow = -1.0;

  /// Keeps the last `capacity` collectives (0: counts them, keeps none).
  explicit FlightRecorder(size_t capacity);

  /// What the training thread is doing, stamped on the collectives it issues from now on: the
  /// global optimizer step (0 before the first) and the gradient bucket (-1: not a bucket).
  void set_step(int64_t step) { step_.store(step, std::memory_order_relaxed); }
  void set_bucket(int64_t bucket) { bucket_.store(bucket, std::memory_order_relaxed); }
  int64_t bucket() const { return bucket_.load(std::memory_order_relaxed); }

  /// A collective issued now (in the order every rank issues them); its number, from 1. Its
  /// bucket is the one set_bucket() named, unless given (a replayed graph's collectives).
  uint64_t issued(std::string what, size_t bytes, std::string wire,
                  std::optional<int64_t> bucket = std::nullopt);
  /// It began executing (on the host; a device collective's start may never be known), at
  /// `at` on the seconds_now() clock (core/clock.h; default: now) — the time its Work reports,
  /// so that the record and the trace tell the same times.
  void started(uint64_t seq, double at = kNow);
  /// It ended: completed, or failed with an error (at `at`, as above).
  void ended(uint64_t seq, bool ok, double at = kNow);
  /// A device collective that completed: its own start and end (its events' times, on the
  /// same clock), which replace the moment the host saw it end.
  void device_times(uint64_t seq, double started, double ended);
  /// Waiting for it gave up after the timeout.
  void timed_out(uint64_t seq);
  /// Whether some wait of this rank timed out (the hang analysis is worth running).
  bool saw_timeout() const { return saw_timeout_.load(std::memory_order_relaxed); }

  /// Asks the device's collectives which of them have ended: a collective on a device stream
  /// whose Work nobody waits for on the host ends there unseen. snapshot() calls it first, on
  /// the thread that writes the record; it may call ended(). Empty: none. Set and cleared by
  /// the device communicator, which must clear it before it goes.
  void set_probe(std::function<void()> probe);

  /// The record (io/flight_analysis.h has the format): every field but the job's identity
  /// (format, version, run, rank, world_size, host, pid, reason, error, written_at), which the
  /// writer adds. Probes the device's collectives first.
  nlohmann::json snapshot();

  /// The last collective issued and the highest number up to which all completed.
  uint64_t last_issued() const;
  uint64_t completed_through() const;

 private:
  struct Entry {
    uint64_t seq = 0;
    std::string what, wire;
    size_t bytes = 0;
    int64_t bucket = -1, step = 0;
    State state = State::Queued;
    double enqueued = 0, started = 0, ended = 0;  // seconds_now() clock; 0: not (yet) known
  };
  Entry* find_locked(uint64_t seq);  // nullptr once it left the ring (or never was)
  void end_locked(uint64_t seq, State state, double at);

  // The records' times are unix seconds: comparable across ranks, where seconds_now() (steady)
  // is not. Taken once, so that times within a record keep the steady clock's differences.
  const double unix_offset_;
  std::mutex probe_mu_;  // held while the probe runs, so that clearing it waits for it
  std::function<void()> probe_;
  mutable std::mutex mu_;
  std::vector<Entry> ring_;  // seq s at ring_[(s - 1) % capacity]
  uint64_t issued_ = 0;
  // Every seq <= completed_ has ended; open_[i] says whether seq completed_ + 1 + i has (they
  // may end out of order: a bucket on the device after a later control message on the host).
  uint64_t completed_ = 0;
  std::deque<bool> open_;
  std::atomic<int64_t> step_{0}, bucket_{-1};
  std::atomic<bool> saw_timeout_{false};
};

const char* to_string(FlightRecorder::State s);

/// Unix time in seconds (the recorder's clock: comparable across the ranks' records).
double unix_seconds();

}  // namespace ddp
