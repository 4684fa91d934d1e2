// Streams and events: the stream mode (immediate or deferred), the queues of deferred mode and
// which call runs what, the registry of streams, events and allocations, and the stream and
// event calls of the runtime.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cuda_emu_internal.h"

namespace ddp_emu {
namespace {

std::atomic<int> g_mode{-1};  // a StreamMode, or -1 before the environment was read

StreamMode mode_now() {
  const int m = g_mode.load(std::memory_order_acquire);
  if (m >= 0) return static_cast<StreamMode>(m);
  static const int from_env = [] {
    try {
      return static_cast<int>(parse_stream_mode(std::getenv("DDP_EMU_STREAMS")));
    } catch (const std::exception& e) {
      // A misspelt mode must not silently test something else.
      std::fprintf(stderr, "cuda emulation: %s\n", e.what());
      std::abort();
    }
  }();
  int expected = -1;
  g_mode.compare_exchange_strong(expected, from_env);
  return static_cast<StreamMode>(g_mode.load());
}

bool alive_locked(const Registry& r, CUstream_st* s, uint64_t serial) {
  return r.streams.count(s) > 0 && s->serial == serial;
}

struct Pending {
  CUstream_st* stream;
  uint64_t serial;
  uint64_t target;
};

// The most recent record of e if it may not have run yet (stream null when it has).
Pending pending_record_locked(const Registry& r, const CUevent_st* e) {
  if (e->stream != nullptr && alive_locked(r, e->stream, e->stream_serial) &&
      e->stream->completed < e->seq) {
    return Pending{e->stream, e->stream_serial, e->seq};
  }
  return Pending{nullptr, 0, 0};
}

}  // namespace

namespace detail {

// Never destroyed: work still queued at exit is neither run nor freed, and whatever a stream or
// event points to stays reachable for the leak checker.
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

bool stream_valid_locked(Registry& r, cudaStream_t s) { return !s || r.streams.count(s) > 0; }

bool stream_valid(cudaStream_t s) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  return stream_valid_locked(r, s);
}

bool deferred() { return mode_now() == StreamMode::kDeferred; }

void enqueue_locked(CUstream_st* s, std::function<void()> run) {
  s->queue.push_back(
      detail::QueuedOp{++s->enqueued, std::move(run), std::chrono::steady_clock::now()});
  start_device_thread();
}

// Runs stream s (if it still exists as `serial`) until its operation `target` has finished.
// Another thread running s meanwhile is waited for, then s's next operation is taken again.
void run_until(CUstream_st* s, uint64_t serial, uint64_t target) {
  Registry& r = registry();
  std::unique_lock<std::mutex> lk(r.mu);
  for (;;) {
    // Gone: cudaStreamDestroy ran its queue first.
    if (!alive_locked(r, s, serial) || s->completed >= target) return;
    if (s->running || s->queue.empty()) {
      r.cv.wait(lk);
      continue;
    }
    detail::QueuedOp op = std::move(s->queue.front());
    s->queue.pop_front();
    s->running = true;
    lk.unlock();
    op.run();
    op.run = nullptr;  // releases the operation's state (kernel arguments) outside the lock
    lk.lock();
    // cudaStreamDestroy waits while `running`, so s is still there.
    s->completed = op.seq;
    s->running = false;
    r.cv.notify_all();
  }
}

// Runs what is queued now on every stream (blocking ones only: what the legacy default stream
// waits for), oldest stream first, so that runs repeat exactly (not in address order).
void run_streams(bool blocking_only) {
  std::vector<Pending> todo;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    for (CUstream_st* s : r.streams) {
      if (blocking_only && (s->flags & cudaStreamNonBlocking) != 0) continue;
      if (s->enqueued > s->completed) todo.push_back(Pending{s, s->serial, s->enqueued});
    }
  }
  std::sort(todo.begin(), todo.end(),
            [](const Pending& a, const Pending& b) { return a.serial < b.serial; });
  for (const Pending& p : todo) run_until(p.stream, p.serial, p.target);
}

// What an operation on the legacy default stream, or a synchronous call, waits for first.
void before_legacy_op() {
  if (deferred()) run_streams(true);
}

}  // namespace detail

StreamMode parse_stream_mode(const char* value) {
  if (value == nullptr || *value == '\0' || std::strcmp(value, "immediate") == 0) {
    return StreamMode::kImmediate;
  }
  if (std::strcmp(value, "deferred") == 0) return StreamMode::kDeferred;
  throw std::invalid_argument(std::string("DDP_EMU_STREAMS='") + value +
                              "' is not a stream mode (immediate or deferred)");
}

StreamMode stream_mode() { return mode_now(); }

void set_stream_mode(StreamMode mode) {
  if (mode_now() == StreamMode::kDeferred && mode != StreamMode::kDeferred) run_streams(false);
  g_mode.store(static_cast<int>(mode), std::memory_order_release);
}

int64_t queued_operations(cudaStream_t stream) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (!stream_valid_locked(r, stream)) return -1;
  return stream ? static_cast<int64_t>(stream->enqueued - stream->completed) : 0;
}

bool stream_exists(cudaStream_t stream) { return stream_valid(stream); }

bool enqueue_host_work(cudaStream_t stream, std::function<void()> work) {
  auto guarded = [work = std::move(work)] {
    try {
      work();
    } catch (const std::exception& e) {
      async_fault(cudaErrorLaunchFailure, std::string("queued host work threw: ") + e.what());
    }
  };
  if (stream) {
    Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    if (r.streams.count(stream) > 0 && stream->capture) {
      // An invalidated capture drops it: cudaStreamEndCapture fails anyway.
      (void)capture_locked(stream, "host work", std::move(guarded));
      return true;
    }
    if (r.streams.count(stream) > 0 && deferred()) {
      enqueue_locked(stream, std::move(guarded));
      return true;
    }
  }
  if (!deferred()) return false;
  before_legacy_op();
  return false;
}

}  // namespace ddp_emu

using ddp_emu::record;
using ddp_emu::registry;

cudaError_t cudaDeviceSynchronize() {
  DDP_EMU_COUNT_CALL();
  {
    ddp_emu::Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    const cudaError_t e = ddp_emu::device_sync_locked(r);
    if (e != cudaSuccess) return record(e);
  }
  if (ddp_emu::deferred()) ddp_emu::run_streams(false);
  return ddp_emu::take_async_error();
}

namespace {
cudaError_t create_stream(cudaStream_t* stream, unsigned int flags) {
  if (!stream || (flags & ~cudaStreamNonBlocking) != 0) return record(cudaErrorInvalidValue);
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  *stream = new CUstream_st(flags, r.next_serial++);
  r.streams.insert(*stream);
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  DDP_EMU_COUNT_CALL();
  return create_stream(stream, flags);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  DDP_EMU_COUNT_CALL();
  return create_stream(stream, cudaStreamDefault);
}

namespace {
constexpr int kLeastStreamPriority = 0, kGreatestStreamPriority = -5;
}  // namespace

cudaError_t cudaDeviceGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  DDP_EMU_COUNT_CALL();
  if (leastPriority) *leastPriority = kLeastStreamPriority;
  if (greatestPriority) *greatestPriority = kGreatestStreamPriority;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
  DDP_EMU_COUNT_CALL();
  const cudaError_t rc = create_stream(stream, flags);
  if (rc != cudaSuccess) return rc;
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  (*stream)->priority = std::min(kLeastStreamPriority, std::max(kGreatestStreamPriority, priority));
  return cudaSuccess;
}

cudaError_t cudaStreamGetPriority(cudaStream_t stream, int* priority) {
  DDP_EMU_COUNT_CALL();
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (!priority) return record(cudaErrorInvalidValue);
  if (!ddp_emu::stream_valid_locked(r, stream)) return record(cudaErrorInvalidResourceHandle);
  *priority = stream ? stream->priority : kLeastStreamPriority;
  return cudaSuccess;
}

// Runs what is queued first, as CUDA lets a destroyed stream's work finish. A stream taking
// part in a capture stays (the emulation's choice: its capture is invalidated instead).
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  DDP_EMU_COUNT_CALL();
  ddp_emu::Registry& r = registry();
  std::unique_lock<std::mutex> lk(r.mu);
  for (;;) {
    if (!stream || r.streams.count(stream) == 0) return record(cudaErrorInvalidResourceHandle);
    if (stream->capture) {
      ddp_emu::invalidate_locked(*stream->capture);
      return record(cudaErrorStreamCaptureUnsupported);
    }
    if (stream->queue.empty() && !stream->running) break;
    const uint64_t serial = stream->serial, target = stream->enqueued;
    lk.unlock();
    ddp_emu::run_until(stream, serial, target);
    lk.lock();
  }
  r.streams.erase(stream);
  delete stream;
  r.cv.notify_all();
  return cudaSuccess;
}

// A capturing stream holds nothing to wait for: synchronising it is prohibited.
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  DDP_EMU_COUNT_CALL();
  uint64_t serial = 0, target = 0;
  {
    ddp_emu::Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    if (!ddp_emu::stream_valid_locked(r, stream)) return record(cudaErrorInvalidResourceHandle);
    if (stream && stream->capture) {
      ddp_emu::invalidate_locked(*stream->capture);
      return record(cudaErrorStreamCaptureUnsupported);
    }
    if (!stream) {
      const cudaError_t e = ddp_emu::legacy_stream_use_locked(r);
      if (e != cudaSuccess) return record(e);
    }
    if (stream) {
      serial = stream->serial;
      target = stream->enqueued;
    }
  }
  if (stream) {
    ddp_emu::run_until(stream, serial, target);
  } else {
    ddp_emu::before_legacy_op();
  }
  return ddp_emu::take_async_error();
}

// Captures the event's most recent record now; the stream runs up to it when it gets there.
// In a capture: a fork, a join or an error (cuda_emu_graphs.cpp).
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  DDP_EMU_COUNT_CALL();
  ddp_emu::Registry& r = registry();
  std::unique_lock<std::mutex> lk(r.mu);
  if (!ddp_emu::stream_valid_locked(r, stream) || r.events.count(event) == 0) {
    return record(cudaErrorInvalidResourceHandle);
  }
  if (event->orphaned) return record(cudaErrorInvalidValue);
  if (event->capture || (stream && stream->capture)) {
    return record(ddp_emu::wait_captured_locked(r, stream, event));
  }
  if (!stream) {
    const cudaError_t e = ddp_emu::legacy_stream_use_locked(r);
    if (e != cudaSuccess) return record(e);
  }
  if (!ddp_emu::deferred()) return cudaSuccess;
  const ddp_emu::Pending p = ddp_emu::pending_record_locked(r, event);
  if (stream) {
    // Nothing to wait for (never recorded, or already run): a no-op, as in CUDA.
    if (p.stream != nullptr) {
      ddp_emu::enqueue_locked(stream, [p] { ddp_emu::run_until(p.stream, p.serial, p.target); });
    }
    return cudaSuccess;
  }
  lk.unlock();
  ddp_emu::before_legacy_op();
  if (p.stream != nullptr) ddp_emu::run_until(p.stream, p.serial, p.target);
  return cudaSuccess;
}

namespace {
cudaError_t create_event(cudaEvent_t* event, unsigned int flags) {
  if (!event || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)) != 0) {
    return record(cudaErrorInvalidValue);
  }
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  *event = new CUevent_st(flags, r.next_serial++);
  r.events.insert(*event);
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  DDP_EMU_COUNT_CALL();
  return create_event(event, flags);
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  DDP_EMU_COUNT_CALL();
  return create_event(event, cudaEventDefault);
}

// A record still queued finds the event gone and does nothing.
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  DDP_EMU_COUNT_CALL();
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.events.erase(event) == 0) return record(cudaErrorInvalidResourceHandle);
  delete event;
  return cudaSuccess;
}

// In a capturing stream the event stands for the stream's last nodes (what a wait on it will
// depend on), and no node is recorded.
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  DDP_EMU_COUNT_CALL();
  ddp_emu::Registry& r = registry();
  std::unique_lock<std::mutex> lk(r.mu);
  if (r.events.count(event) == 0 || !ddp_emu::stream_valid_locked(r, stream)) {
    return record(cudaErrorInvalidResourceHandle);
  }
  if (stream && stream->capture) {
    if (stream->capture->invalidated) return record(cudaErrorStreamCaptureInvalidated);
    event->capture = stream->capture;
    event->captured_deps = stream->capture->tails[stream];
    event->orphaned = false;
    return cudaSuccess;
  }
  if (!stream) {
    const cudaError_t e = ddp_emu::legacy_stream_use_locked(r);
    if (e != cudaSuccess) return record(e);
  }
  event->capture.reset();
  event->captured_deps.clear();
  event->orphaned = false;
  const bool queued = stream && ddp_emu::deferred();
  if (!queued && stream == nullptr && ddp_emu::deferred()) {
    // On the legacy stream the record completes once the blocking streams' work ran.
    lk.unlock();
    ddp_emu::before_legacy_op();
    lk.lock();
    if (r.events.count(event) == 0) return record(cudaErrorInvalidResourceHandle);
  }
  event->recorded = true;
  const uint64_t generation = ++event->generation;
  if (!queued) {
    event->stream = nullptr;
    event->when = std::chrono::steady_clock::now();
    return cudaSuccess;
  }
  const uint64_t serial = event->serial;
  ddp_emu::enqueue_locked(stream, [event, serial, generation] {
    ddp_emu::Registry& reg = registry();
    std::lock_guard<std::mutex> held(reg.mu);
    // Destroyed, or recorded again since: that newer record sets the time.
    if (reg.events.count(event) == 0 || event->serial != serial ||
        event->generation != generation) {
      return;
    }
    event->when = std::chrono::steady_clock::now();
  });
  event->stream = stream;
  event->stream_serial = stream->serial;
  event->seq = stream->enqueued;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  DDP_EMU_COUNT_CALL();
  ddp_emu::Pending p{nullptr, 0, 0};
  {
    ddp_emu::Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    if (r.events.count(event) == 0) return record(cudaErrorInvalidResourceHandle);
    if (event->capture) return record(ddp_emu::captured_event_use_locked(*event));
    if (event->orphaned) return record(cudaErrorInvalidValue);
    p = ddp_emu::pending_record_locked(r, event);
  }
  if (p.stream != nullptr) ddp_emu::run_until(p.stream, p.serial, p.target);
  return ddp_emu::take_async_error();
}

// Not ready (as the thread's last error too, so callers clear it) while the most recent record
// has not run; that record is run right away, so the next query succeeds.
cudaError_t cudaEventQuery(cudaEvent_t event) {
  DDP_EMU_COUNT_CALL();
  ddp_emu::Pending p{nullptr, 0, 0};
  {
    ddp_emu::Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    if (r.events.count(event) == 0) return record(cudaErrorInvalidResourceHandle);
    if (event->capture) return record(ddp_emu::captured_event_use_locked(*event));
    if (event->orphaned) return record(cudaErrorInvalidValue);
    p = ddp_emu::pending_record_locked(r, event);
    // A query never waits for the device: a thread running the stream stands for it, busy.
    if (p.stream != nullptr && p.stream->running) return record(cudaErrorNotReady);
  }
  if (p.stream == nullptr) return cudaSuccess;
  ddp_emu::run_until(p.stream, p.serial, p.target);
  return record(cudaErrorNotReady);
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  DDP_EMU_COUNT_CALL();
  if (!ms) return record(cudaErrorInvalidValue);
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  // An event of a capture, ongoing or ended, has no time (CUDA 13: cudaErrorInvalidValue).
  for (cudaEvent_t e : {start, end}) {
    if (r.events.count(e) > 0 && (e->capture || e->orphaned)) return record(cudaErrorInvalidValue);
  }
  if (r.events.count(start) == 0 || r.events.count(end) == 0 || !start->recorded ||
      !end->recorded || ((start->flags | end->flags) & cudaEventDisableTiming) != 0) {
    return record(cudaErrorInvalidResourceHandle);
  }
  if (ddp_emu::pending_record_locked(r, start).stream != nullptr ||
      ddp_emu::pending_record_locked(r, end).stream != nullptr) {
    return record(cudaErrorNotReady);
  }
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}
