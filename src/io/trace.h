// The training timeline as a Chrome trace (Trace Event Format JSON, opened by ui.perfetto.dev or
// chrome://tracing): each rank records spans, instants and counters in memory on named tracks,
// and rank 0 writes every rank's events into one file at the end.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace ddp {

/// One argument value of an event: a number or a string.
struct TraceValue {
  template <typename T, typename std::enable_if<std::is_arithmetic<T>::value, int>::type = 0>
  TraceValue(T value) : is_number(true), number(static_cast<double>(value)) {}  // NOLINT
  TraceValue(std::string value) : text(std::move(value)) {}                     // NOLINT
  TraceValue(const char* value) : text(value) {}                                // NOLINT

  bool is_number = false;
  double number = 0.0;
  std::string text;
};

/// The "args" of an event, in the order given (a flat map; later duplicates win).
using TraceArgs = std::vector<std::pair<std::string, TraceValue>>;

/// Records spans and instants of one rank's run on named tracks, in memory, thread-safe.
class Tracer {
 public:
  using Args = TraceArgs;

  /// Disabled: every call is a cheap no-op, enabled() == false, track() returns -1.
  Tracer();
  /// Enabled recorder for `rank`; `origin` is the seconds_now()-clock time that becomes ts 0
  /// (ranks pass a time taken right after a barrier so their tracks line up).
  Tracer(int rank, std::string process_name, double origin);

  ~Tracer();
  // Movable (e.g. a member enabled after construction), but not while other threads record.
  Tracer(Tracer&&) noexcept;
  Tracer& operator=(Tracer&&) noexcept;

  bool enabled() const { return state_ != nullptr; }
  /// The rank given at construction; -1 when disabled.
  int rank() const;

  /// A track (shown as one thread row), e.g. "train thread", "comm thread", "compute stream";
  /// same name -> same id (0, 1, ... in order of creation, which is also the display order).
  int track(const std::string& name);
  /// A complete event ("ph":"X") [begin, end] in seconds on the seconds_now() clock; end < begin
  /// records a zero duration. Throws ddp::Error for a track id this tracer did not hand out.
  void span(int track, const std::string& name, double begin, double end, const Args& args = {});
  /// An instant event ("ph":"i", thread scope), e.g. "bucket 2 ready".
  void instant(int track, const std::string& name, double t, const Args& args = {});
  /// A counter sample ("ph":"C", args {"value": v}), e.g. samples/s. A non-finite value (a
  /// diverged loss) cannot be plotted and is skipped, leaving a gap.
  void counter(const std::string& name, double t, double value);

  /// Recorded spans, instants and counter samples (metadata not counted).
  size_t event_count() const;
  /// This rank's events as a JSON array text, one event a line: metadata first (process_name
  /// "rank R (<process_name>)" and process_sort_index R on tid 0, then thread_name and
  /// thread_sort_index per track), then the events in time order (at equal start, longer spans
  /// first). pid = rank + 1 (Perfetto reserves pid 0), tid = track id + 1 (counters: 0); ts and dur
  /// in microseconds since the origin, rounded to whole nanoseconds; whole-number args print as
  /// integers.
  std::string events_json() const;

 private:
  struct State;
  std::unique_ptr<State> state_;  // null when disabled
};

/// Writes a complete trace file {"traceEvents":[...], "displayTimeUnit":"ms", "otherData":{...}}
/// from several ranks' events_json() texts (in rank order; "[]" for a rank without events),
/// atomically (through AtomicFile, core/atomic_file.h). The texts are spliced, not
/// parsed again. Throws ddp::Error naming the path when a text is not bracketed as a JSON array
/// or the file cannot be written (directory missing or not writable, disk full); no temp file is
/// left behind.
void write_trace_file(const std::string& path, const std::vector<std::string>& rank_events,
                      const std::map<std::string, std::string>& other_data);

}  // namespace ddp
