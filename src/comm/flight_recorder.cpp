// The flight recorder (flight_recorder.h).
#include "comm/flight_recorder.h"

#include "core/clock.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace ddp {

namespace {

// A time of the record: seconds, or null where it is not known.
double now_or(double at) { return at == FlightRecorder::kNow ? seconds_now() : at; }

}  // namespace

const char* to_string(FlightRecorder::State s) {
  switch (s) {
    case FlightRecorder::State::Queued:
      return "queued";
    case FlightRecorder::State::Started:
      return "started";
    case FlightRecorder::State::Completed:
      return "completed";
    case FlightRecorder::State::Failed:
      return "failed";
    case FlightRecorder::State::TimedOut:
      return "timed_out";
  }
  return "unknown";
}

double unix_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

FlightRecorder::FlightRecorder(size_t capacity)
    : unix_offset_(unix_seconds() - seconds_now()), ring_(capacity) {}

uint64_t FlightRecorder::issued(std::string what, size_t bytes, std::string wire,
                                std::optional<int64_t> bucket) {
  const double now = seconds_now();
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t seq = ++issued_;
  open_.push_back(false);
  if (ring_.empty()) return seq;
  Entry& e = ring_[(seq - 1) % ring_.size()];
  e = Entry{};
  e.seq = seq;
  e.what = std::move(what);
  e.wire = std::move(wire);
  e.bytes = bytes;
  e.bucket = bucket ? *bucket : bucket_.load(std::memory_order_relaxed);
  e.step = step_.load(std::memory_order_relaxed);
  e.enqueued = now;
  return seq;
}

FlightRecorder::Entry* FlightRecorder::find_locked(uint64_t seq) {
  if (ring_.empty() || seq == 0) return nullptr;
  Entry& e = ring_[(seq - 1) % ring_.size()];
  return e.seq == seq ? &e : nullptr;
}

void FlightRecorder::started(uint64_t seq, double at) {
  const double time = now_or(at);
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* e = find_locked(seq); e != nullptr && e->state == State::Queued) {
    e->state = State::Started;
    e->started = time;
  }
}

void FlightRecorder::ended(uint64_t seq, bool ok, double at) {
  const double time = now_or(at);
  std::lock_guard<std::mutex> lock(mu_);
  end_locked(seq, ok ? State::Completed : State::Failed, time);
}

void FlightRecorder::device_times(uint64_t seq, double started, double ended) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* e = find_locked(seq); e != nullptr && e->state == State::Completed) {
    e->started = started;
    e->ended = ended;
  }
}

void FlightRecorder::timed_out(uint64_t seq) {
  saw_timeout_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* e = find_locked(seq); e != nullptr && e->state != State::Completed)
    e->state = State::TimedOut;
}

// Marks `seq` ended (once); a completed one moves completed_ over every seq that has
// completed. A failed one stays open: the job is ending, and the analysis must see that it did
// not complete (a timed-out one keeps saying so).
void FlightRecorder::end_locked(uint64_t seq, State state, double at) {
  if (seq <= completed_ || seq > issued_) return;
  if (Entry* e = find_locked(seq); e != nullptr) {
    if (e->state != State::TimedOut) e->state = state;
    e->ended = at;
  }
  if (state != State::Completed) return;
  open_[seq - completed_ - 1] = true;
  while (!open_.empty() && open_.front()) {
    open_.pop_front();
    ++completed_;
  }
}

uint64_t FlightRecorder::last_issued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return issued_;
}

uint64_t FlightRecorder::completed_through() const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_;
}

void FlightRecorder::set_probe(std::function<void()> probe) {
  std::lock_guard<std::mutex> lock(probe_mu_);
  probe_ = std::move(probe);
}

nlohmann::json FlightRecorder::snapshot() {
  {
    std::lock_guard<std::mutex> probing(probe_mu_);
    if (probe_) probe_();
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto unix_or_null = [this](double t) {
    return t > 0 ? nlohmann::json(t + unix_offset_) : nlohmann::json();
  };
  nlohmann::json entries = nlohmann::json::array();
  const uint64_t kept = std::min<uint64_t>(issued_, ring_.size());
  for (uint64_t seq = issued_ - kept + 1; seq <= issued_; ++seq) {
    const Entry& e = ring_[(seq - 1) % ring_.size()];
    entries.push_back({{"seq", e.seq},
                       {"what", e.what},
                       {"bucket", e.bucket},
                       {"bytes", e.bytes},
                       {"wire", e.wire},
                       {"step", e.step},
                       {"state", to_string(e.state)},
                       {"enqueued", unix_or_null(e.enqueued)},
                       {"started", unix_or_null(e.started)},
                       {"ended", unix_or_null(e.ended)}});
  }
  return {{"step", step_.load(std::memory_order_relaxed)},
          {"issued", issued_},
          {"completed", completed_},
          {"capacity", ring_.size()},
          {"entries", std::move(entries)}};
}

}  // namespace ddp
