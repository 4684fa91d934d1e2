// Chrome trace recording: events are kept as small structs under one mutex (the comm thread
// records too) and become JSON only when a rank's trace is serialised; the trace file is spliced
// from the ranks' JSON texts without parsing them again.
#include "io/trace.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/check.h"

namespace ddp {
namespace {

// Keeps fields in the order written, so a trace reads naturally as text.
using Json = nlohmann::ordered_json;

constexpr double kNanosPerSecond = 1e9;
constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

// Whole nanoseconds since the origin: the clock resolves no finer, and printing integer
// nanoseconds / 1000 drops the binary noise of the subtraction from the text. Rounding is
// monotonic and dur is taken between rounded ends, so spans that nest as recorded still nest as
// printed.
double nanos_since(double t, double origin) { return std::round((t - origin) * kNanosPerSecond); }

// Names come from the program, but a stray invalid UTF-8 byte must not make the trace unwritable.
std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// JSON has no NaN or infinity; such argument values (a diverged loss) are kept as text.
Json value_json(const TraceValue& value) {
  if (!value.is_number) return value.text;
  // Whole numbers (steps, bucket ids, bytes) print as integers.
  if (std::fabs(value.number) < kMaxExactInteger && std::floor(value.number) == value.number) {
    return static_cast<int64_t>(value.number);
  }
  if (std::isfinite(value.number)) return value.number;
  if (std::isnan(value.number)) return "nan";
  return value.number > 0 ? "inf" : "-inf";
}

Json metadata(const char* name, int pid, int tid, Json args) {
  return Json{{"name", name}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", std::move(args)}};
}

void require_finite(double t, const char* what, const std::string& name) {
  DDP_CHECK(std::isfinite(t),
            "trace " << what << " '" << name << "': time is not finite (" << t << ")");
}

// The entries of a JSON array text, without its brackets ("" for an empty array); throws when
// the text is not bracketed like an array.
std::string array_entries(const std::string& text, const std::string& path, size_t rank) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  const size_t last = text.find_last_not_of(" \t\r\n");
  DDP_CHECK(first != std::string::npos && text[first] == '[' && text[last] == ']',
            "cannot write trace file '" << path << "': the events of rank " << rank
                                        << " are not a JSON array");
  const size_t begin = text.find_first_not_of(" \t\r\n", first + 1);
  const size_t end = text.find_last_not_of(" \t\r\n", last - 1);
  if (begin >= last || end <= first) return "";
  return text.substr(begin, end - begin + 1);
}

enum class Phase : char { kSpan = 'X', kInstant = 'i', kCounter = 'C' };

struct Event {
  Phase phase;
  int track;  // -1 for counters
  std::string name;
  double begin;  // seconds, seconds_now() clock
  double end;    // spans: end time; counters: the value
  TraceArgs args;
};

}  // namespace

struct Tracer::State {
  State(int rank_in, std::string process_name_in, double origin_in)
      : rank(rank_in), process_name(std::move(process_name_in)), origin(origin_in) {}

  void record(Event event) {
    std::lock_guard<std::mutex> lock(mutex);
    if (event.phase != Phase::kCounter) {
      DDP_CHECK(event.track >= 0 && static_cast<size_t>(event.track) < tracks.size(),
                "trace event '" << event.name << "': unknown track id " << event.track << " (rank "
                                << rank << " has " << tracks.size() << " tracks)");
    }
    events.push_back(std::move(event));
  }

  const int rank;
  const std::string process_name;
  const double origin;
  mutable std::mutex mutex;  // guards tracks and events
  std::vector<std::string> tracks;
  std::vector<Event> events;
};

Tracer::Tracer(int rank, std::string process_name, double origin) {
  DDP_CHECK(rank >= 0, "trace rank must be >= 0, got " << rank);
  require_finite(origin, "origin of", process_name);
  state_ = std::make_unique<State>(rank, std::move(process_name), origin);
}

Tracer::Tracer() = default;
Tracer::~Tracer() = default;
Tracer::Tracer(Tracer&&) noexcept = default;
Tracer& Tracer::operator=(Tracer&&) noexcept = default;

int Tracer::rank() const { return state_ ? state_->rank : -1; }

int Tracer::track(const std::string& name) {
  if (!state_) return -1;
  std::lock_guard<std::mutex> lock(state_->mutex);
  std::vector<std::string>& tracks = state_->tracks;
  for (size_t i = 0; i < tracks.size(); ++i) {
    if (tracks[i] == name) return static_cast<int>(i);
  }
  tracks.push_back(name);
  return static_cast<int>(tracks.size() - 1);
}

void Tracer::span(int track, const std::string& name, double begin, double end, const Args& args) {
  if (!state_) return;
  require_finite(begin, "span", name);
  require_finite(end, "span", name);
  state_->record(Event{Phase::kSpan, track, name, begin, end < begin ? begin : end, args});
}

void Tracer::instant(int track, const std::string& name, double t, const Args& args) {
  if (!state_) return;
  require_finite(t, "instant", name);
  state_->record(Event{Phase::kInstant, track, name, t, t, args});
}

void Tracer::counter(const std::string& name, double t, double value) {
  if (!state_) return;
  require_finite(t, "counter", name);
  // A counter track plots numbers only; a non-finite sample is left out (a gap in the plot).
  if (!std::isfinite(value)) return;
  state_->record(Event{Phase::kCounter, -1, name, t, value, {}});
}

size_t Tracer::event_count() const {
  if (!state_) return 0;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->events.size();
}

std::string Tracer::events_json() const {
  if (!state_) return "[]";
  const State& st = *state_;
  std::lock_guard<std::mutex> lock(st.mutex);
  const int pid = st.rank + 1;  // Perfetto gives pid 0 a meaning of its own (the idle task)
  std::string out = "[";
  auto append = [&out](const Json& j) {
    out += out.size() == 1 ? "\n" : ",\n";
    out += dump(j);
  };
  // Metadata carry tid 0 (a process-level row no event uses); tracks are tid 1, 2, ...
  append(metadata("process_name", pid, 0,
                  {{"name", "rank " + std::to_string(st.rank) + " (" + st.process_name + ")"}}));
  append(metadata("process_sort_index", pid, 0, {{"sort_index", st.rank}}));
  for (size_t i = 0; i < st.tracks.size(); ++i) {
    const int tid = static_cast<int>(i) + 1;
    append(metadata("thread_name", pid, tid, {{"name", st.tracks[i]}}));
    append(metadata("thread_sort_index", pid, tid, {{"sort_index", tid}}));
  }

  // Time order, and at equal start the longer span first, so viewers that replay the events in
  // file order see a parent open before its child (children finish, so are recorded, first).
  // Sorted on the rounded times that are printed, so ties created by rounding sort right too.
  struct Key {
    double begin_ns;
    double end_ns;
    size_t index;
  };
  std::vector<Key> order;
  order.reserve(st.events.size());
  for (size_t i = 0; i < st.events.size(); ++i) {
    const Event& e = st.events[i];
    const double begin_ns = nanos_since(e.begin, st.origin);
    const double end_ns = e.phase == Phase::kSpan ? nanos_since(e.end, st.origin) : begin_ns;
    order.push_back({begin_ns, end_ns, i});
  }
  std::stable_sort(order.begin(), order.end(), [](const Key& x, const Key& y) {
    if (x.begin_ns != y.begin_ns) return x.begin_ns < y.begin_ns;
    return x.end_ns > y.end_ns;
  });

  for (const Key& key : order) {
    const Event& e = st.events[key.index];
    Json j{{"name", e.name},
           {"ph", std::string(1, static_cast<char>(e.phase))},
           {"pid", pid},
           {"tid", e.phase == Phase::kCounter ? 0 : e.track + 1},
           {"ts", key.begin_ns / 1000.0}};
    if (e.phase == Phase::kSpan) j["dur"] = (key.end_ns - key.begin_ns) / 1000.0;
    if (e.phase == Phase::kInstant) j["s"] = "t";
    if (e.phase == Phase::kCounter) j["args"] = {{"value", e.end}};
    if (!e.args.empty()) {
      Json args = Json::object();
      for (const auto& kv : e.args) args[kv.first] = value_json(kv.second);
      j["args"] = std::move(args);
    }
    append(j);
  }
  out += "\n]";
  return out;
}

void write_trace_file(const std::string& path, const std::vector<std::string>& rank_events,
                      const std::map<std::string, std::string>& other_data) {
  std::string text = "{\"traceEvents\":[";
  bool first = true;
  for (size_t r = 0; r < rank_events.size(); ++r) {
    const std::string entries = array_entries(rank_events[r], path, r);
    if (entries.empty()) continue;
    text += first ? "\n" : ",\n";
    text += entries;
    first = false;
  }
  Json other = Json::object();
  for (const auto& kv : other_data) other[kv.first] = kv.second;
  text += "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":" + dump(other) + "}\n";

  // Through the one file writer: a reader never sees half a trace, a planted name is not followed.
  AtomicFile file(path, "trace file");
  file.write(text);
  file.commit();
}

}  // namespace ddp
