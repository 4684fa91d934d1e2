// The NCCL communicator's collectives in the rank's flight recorder (comm/flight_recorder.h).
// They run on the comm stream, in the order they were queued, where the host sees them end only
// when it asks: a Work synchronized (it and every collective before it ended), or the recorder's
// probe, which polls their end events when a record is written (a SIGUSR2 dump of a rank that
// is not waiting on them). Collectives queued while a step graph is captured are not run then;
// they are kept as the graph's, and numbered at each of its launches, ending with its fence.
// Included by nccl_communicator.cu only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/flight_recorder.h"
#include "comm/work.h"
#include "kernels/cuda/cuda_api.h"

namespace ddp {

class NcclFlightLedger {
 public:
  struct Collective {
    std::string what;
    size_t bytes = 0;
    std::string wire;
  };

  NcclFlightLedger() = default;
  NcclFlightLedger(const NcclFlightLedger&) = delete;
  NcclFlightLedger& operator=(const NcclFlightLedger&) = delete;
  ~NcclFlightLedger() { set_recorder(nullptr); }

  /// Numbers the collectives from now on in `recorder` (null: none), which must outlive this.
  void set_recorder(FlightRecorder* recorder) {
    if (recorder_ != nullptr) recorder_->set_probe(nullptr);  // waits for a probe running
    recorder_ = recorder;
    if (recorder_ != nullptr) recorder_->set_probe([this] { probe(); });
  }

  /// See CapturableCommunicator::set_capturing.
  void set_capturing(bool capturing) {
    if (capturing) graph_.clear();
    capturing_ = capturing;
  }

  /// A collective about to be queued on the comm stream: its number (0: not numbered, as
  /// none is kept or it is captured into a graph). Then queued() or, if queuing it failed,
  /// failed().
  uint64_t number(Collective c) {
    if (recorder_ == nullptr) return 0;
    if (capturing_) {
      graph_.push_back({std::move(c), recorder_->bucket()});
      return 0;
    }
    return recorder_->issued(std::move(c.what), c.bytes, std::move(c.wire));
  }
  /// Collective `seq` is queued, ending at `end` (an event that `keep` holds until then).
  void queued(uint64_t seq, cudaEvent_t end, std::shared_ptr<Work> keep) {
    if (seq == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    drop_ended_locked();
    pending_.push_back({seq, end, std::move(keep), false});
  }
  /// Queuing collective `seq` failed (NCCL refused it, or a peer's abort surfaced).
  void failed(uint64_t seq) {
    if (seq != 0) recorder_->ended(seq, false);
  }

  /// A step graph just launched: its collectives, numbered as issued now, all ending at `end`
  /// (the fence behind it, which `keep` holds). The number of the last (0: none).
  uint64_t replayed(cudaEvent_t end, const std::shared_ptr<Work>& keep) {
    if (recorder_ == nullptr) return 0;
    std::lock_guard<std::mutex> lock(mu_);
    drop_ended_locked();
    uint64_t seq = 0;
    for (const Captured& c : graph_) {
      seq = recorder_->issued(c.collective.what, c.collective.bytes, c.collective.wire, c.bucket);
      pending_.push_back({seq, end, keep, false});
    }
    return seq;
  }

  /// Collective `seq` ended on the host's watch, so did every one before it (one stream).
  void completed_through(uint64_t seq) {
    if (recorder_ == nullptr || seq == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    for (Pending& p : pending_) {
      if (p.seq > seq) break;
      end_locked(p);
    }
    drop_ended_locked();
  }

  /// Collective `seq`, seen ended, began and ended at these times on the device.
  void device_times(uint64_t seq, double started, double ended) {
    if (recorder_ != nullptr && seq != 0) recorder_->device_times(seq, started, ended);
  }

  /// A wait on the comm stream gave up (after the timeout, or on a NCCL error): the first
  /// collective that had not ended is the one that did not complete. After an error the end
  /// events say nothing (the stream runs on past a failed collective), so only the waits that
  /// succeeded count; after a timeout the events say which ended.
  void gave_up(bool timed_out) {
    if (recorder_ == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (timed_out) probe_locked();
    gave_up_ = true;  // events that pass from now on (an aborted communicator's) say nothing
    for (const Pending& p : pending_) {
      if (p.ended) continue;
      if (timed_out) {
        recorder_->timed_out(p.seq);
      } else {
        recorder_->ended(p.seq, false);
      }
      return;
    }
    if (timed_out) recorder_->timed_out(0);  // none pending: still, a wait timed out
  }

 private:
  struct Captured {
    Collective collective;
    int64_t bucket = -1;
  };
  struct Pending {
    uint64_t seq = 0;
    cudaEvent_t end = nullptr;
    std::shared_ptr<Work> keep;  // the Work whose event `end` is
    bool ended = false;
  };

  void probe() {
    std::lock_guard<std::mutex> lock(mu_);
    probe_locked();
  }
  // The collectives whose end events have passed, in stream order, up to the first that has not.
  void probe_locked() {
    if (gave_up_) return;
    for (Pending& p : pending_) {
      if (p.ended) continue;
      const cudaError_t state = cudaEventQuery(p.end);
      if (state != cudaSuccess) {
        (void)cudaGetLastError();  // not ready (or failed: the wait that follows reports it)
        return;
      }
      end_locked(p);
    }
  }
  void end_locked(Pending& p) {
    if (p.ended) return;
    recorder_->ended(p.seq, true);
    p.ended = true;
  }
  // Only on the training thread: releasing the last hold of a Work gives its events back.
  void drop_ended_locked() {
    while (!pending_.empty() && pending_.front().ended) pending_.pop_front();
  }

  FlightRecorder* recorder_ = nullptr;
  bool capturing_ = false;
  bool gave_up_ = false;
  std::vector<Captured> graph_;  // the step graph's collectives, from its capture
  std::mutex mu_;                // pending_, between the training thread and the probe
  std::deque<Pending> pending_;  // numbered, not yet seen ended (or not yet dropped)
};

}  // namespace ddp
