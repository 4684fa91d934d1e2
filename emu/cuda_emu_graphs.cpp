// Stream capture and graphs: cudaStreamBeginCapture/EndCapture record the work queued on a
// stream (and on the streams an event forked from it) as graph nodes instead of running it;
// cudaGraphLaunch replays the nodes on a stream. The rules of capture and the errors of the
// calls it prohibits follow the CUDA Programming Guide, "CUDA Graphs" > "Prohibited and
// Unhandled Operations", and the runtime reference (cudaStreamBeginCapture,
// cudaStreamEndCapture, cudaStreamIsCapturing, cudaThreadExchangeStreamCaptureMode,
// cudaGraphInstantiate, cudaGraphLaunch).
#include <algorithm>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cuda_emu_internal.h"

namespace ddp_emu {
namespace {

// The calling thread's capture interaction mode (cudaThreadExchangeStreamCaptureMode).
thread_local cudaStreamCaptureMode t_capture_mode = cudaStreamCaptureModeGlobal;

bool valid_mode(int mode) {
  return mode == cudaStreamCaptureModeGlobal || mode == cudaStreamCaptureModeThreadLocal ||
         mode == cudaStreamCaptureModeRelaxed;
}

bool takes_part_blocking(const Capture& c) {
  for (const auto& [s, tail] : c.tails) {
    if ((s->flags & cudaStreamNonBlocking) == 0) return true;
  }
  return false;
}

// Every stream leaves the capture; an event last recorded in it is unusable until recorded
// again.
void end_capture_locked(Registry& r, const std::shared_ptr<Capture>& c) {
  for (auto& [s, tail] : c->tails) s->capture.reset();
  for (CUevent_st* e : r.events) {
    if (e->capture == c) {
      e->capture.reset();
      e->captured_deps.clear();
      e->orphaned = true;
    }
  }
  r.captures.erase(std::find(r.captures.begin(), r.captures.end(), c));
}

// Whether every forked stream rejoined the origin: its last nodes are nodes the origin's next
// node would depend on, directly or through others.
bool joined(const Capture& c) {
  const GraphNodes& nodes = *c.nodes;
  std::vector<bool> reached(nodes.size(), false);
  std::vector<size_t> todo = c.tails.at(c.origin);
  while (!todo.empty()) {
    const size_t n = todo.back();
    todo.pop_back();
    if (reached[n]) continue;
    reached[n] = true;
    todo.insert(todo.end(), nodes[n].deps.begin(), nodes[n].deps.end());
  }
  for (const auto& [s, tail] : c.tails) {
    for (size_t n : tail) {
      if (!reached[n]) return false;
    }
  }
  return true;
}

// Runs the nodes in capture order, a topological order of their dependencies.
void run_nodes(const GraphNodes& nodes) {
  for (const GraphNode& n : nodes) n.run();
}

}  // namespace

namespace detail {

void invalidate_locked(Capture& c) { c.invalidated = true; }

cudaError_t captured_event_use_locked(CUevent_st& event) {
  invalidate_locked(*event.capture);
  return cudaErrorCapturedEvent;
}

// cudaStreamWaitEvent where the event or the stream is in a capture: a fork (the stream joins
// the event's capture), a join (within one capture), or a dependency across the boundary of a
// capture, which the guide forbids.
cudaError_t wait_captured_locked(Registry& r, cudaStream_t stream, CUevent_st* event) {
  if (stream == nullptr) {
    // The legacy stream cannot take part in a capture (CUDA 13 answers Implicit even when the
    // capturing streams are non-blocking).
    invalidate_locked(*event->capture);
    (void)legacy_stream_use_locked(r);
    return cudaErrorStreamCaptureImplicit;
  }
  const std::shared_ptr<Capture> waiter = stream->capture, recorded = event->capture;
  if (!recorded) {
    // A never-recorded event stands for no work: waiting on it is a no-op, in a capture too.
    if (!event->recorded) return cudaSuccess;
    // "It is invalid to wait on a non-captured event from a stream which is being captured."
    invalidate_locked(*waiter);
    return cudaErrorStreamCaptureIsolation;
  }
  if (waiter && waiter != recorded) {
    invalidate_locked(*waiter);
    invalidate_locked(*recorded);
    return cudaErrorStreamCaptureMerge;
  }
  if (recorded->invalidated) return cudaErrorStreamCaptureInvalidated;
  std::vector<size_t>& tail = recorded->tails[stream];
  if (!waiter) {
    stream->capture = recorded;  // a fork: from now on the stream's work is captured
    tail = event->captured_deps;
    return cudaSuccess;
  }
  for (size_t n : event->captured_deps) {
    if (std::find(tail.begin(), tail.end(), n) == tail.end()) tail.push_back(n);
  }
  return cudaSuccess;
}

cudaError_t legacy_stream_use_locked(Registry& r) {
  cudaError_t e = cudaSuccess;
  for (const std::shared_ptr<Capture>& c : r.captures) {
    if (takes_part_blocking(*c)) {
      invalidate_locked(*c);
      e = cudaErrorStreamCaptureImplicit;
    }
  }
  return e;
}

// cudaThreadExchangeStreamCaptureMode: Global forbids it during this thread's own captures not
// begun Relaxed and during other threads' Global captures; ThreadLocal only during this
// thread's own; Relaxed never.
cudaError_t unsafe_call_locked(Registry& r) {
  if (t_capture_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
  const std::thread::id me = std::this_thread::get_id();
  cudaError_t e = cudaSuccess;
  for (const std::shared_ptr<Capture>& c : r.captures) {
    const bool own = c->thread == me && c->mode != cudaStreamCaptureModeRelaxed;
    const bool other = c->thread != me && c->mode == cudaStreamCaptureModeGlobal &&
                       t_capture_mode == cudaStreamCaptureModeGlobal;
    if (own || other) {
      invalidate_locked(*c);
      e = cudaErrorStreamCaptureUnsupported;
    }
  }
  return e;
}

cudaError_t device_sync_locked(Registry& r) {
  for (const std::shared_ptr<Capture>& c : r.captures) invalidate_locked(*c);
  return r.captures.empty() ? cudaSuccess : cudaErrorStreamCaptureUnsupported;
}

cudaError_t capture_locked(CUstream_st* s, std::string what, std::function<void()> run) {
  Capture& c = *s->capture;
  if (c.invalidated) return cudaErrorStreamCaptureInvalidated;
  std::vector<size_t>& tail = c.tails[s];
  c.nodes->push_back(GraphNode{std::move(what), tail, std::move(run)});
  tail.assign(1, c.nodes->size() - 1);
  return cudaSuccess;
}

}  // namespace detail

std::vector<CapturedNode> graph_nodes(cudaGraph_t graph) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.graphs.count(graph) == 0) throw std::invalid_argument("graph_nodes: not a live graph");
  std::vector<CapturedNode> out;
  for (const GraphNode& n : *graph->nodes) out.push_back(CapturedNode{n.what, n.deps});
  return out;
}

cudaError_t host_work_capture(cudaStream_t stream, bool* capturing) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  *capturing = false;
  if (stream == nullptr) return legacy_stream_use_locked(r);
  if (r.streams.count(stream) == 0) return cudaErrorInvalidResourceHandle;
  if (!stream->capture) return cudaSuccess;
  if (stream->capture->invalidated) return cudaErrorStreamCaptureInvalidated;
  *capturing = true;
  return cudaSuccess;
}

}  // namespace ddp_emu

using ddp_emu::record;
using ddp_emu::registry;

// Where the reference is silent, the errors are what CUDA 13 answers on a device: the legacy
// stream cannot capture (cudaErrorStreamCaptureUnsupported), a capturing stream cannot begin
// again (cudaErrorIllegalState, and its capture goes on).
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  DDP_EMU_COUNT_CALL();
  if (!ddp_emu::valid_mode(mode)) return record(cudaErrorInvalidValue);
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (!ddp_emu::stream_valid_locked(r, stream)) return record(cudaErrorInvalidResourceHandle);
  if (stream == nullptr) return record(cudaErrorStreamCaptureUnsupported);
  if (stream->capture) return record(cudaErrorIllegalState);
  auto c = std::make_shared<ddp_emu::Capture>();
  c->id = r.next_serial++;
  c->origin = stream;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->tails[stream] = {};
  stream->capture = c;
  r.captures.push_back(c);
  return cudaSuccess;
}

// Ends the capture on its origin stream (every stream leaves it, whatever the result): the
// graph, or a null graph and why there is none (invalidated, a fork never joined, the wrong
// thread). As CUDA 13 does: a stream not capturing is cudaErrorIllegalState; a stream the
// capture forked is cudaErrorStreamCaptureUnmatched and invalidates it; the wrong thread ends
// it.
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  DDP_EMU_COUNT_CALL();
  if (pGraph == nullptr) return record(cudaErrorInvalidValue);
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (!ddp_emu::stream_valid_locked(r, stream)) return record(cudaErrorInvalidResourceHandle);
  if (stream == nullptr || !stream->capture) return record(cudaErrorIllegalState);
  const std::shared_ptr<ddp_emu::Capture> c = stream->capture;
  if (c->origin != stream) {
    ddp_emu::invalidate_locked(*c);
    return record(cudaErrorStreamCaptureUnmatched);
  }
  const bool all_joined = ddp_emu::joined(*c);
  ddp_emu::end_capture_locked(r, c);
  *pGraph = nullptr;
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id()) {
    return record(cudaErrorStreamCaptureWrongThread);
  }
  if (c->invalidated) return record(cudaErrorStreamCaptureInvalidated);
  if (!all_joined) return record(cudaErrorStreamCaptureUnjoined);
  *pGraph = new CUgraph_st{c->nodes};
  r.graphs.insert(*pGraph);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* pCaptureStatus) {
  DDP_EMU_COUNT_CALL();
  if (pCaptureStatus == nullptr) return record(cudaErrorInvalidValue);
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (!ddp_emu::stream_valid_locked(r, stream)) return record(cudaErrorInvalidResourceHandle);
  if (stream == nullptr) {
    // Asking about the legacy stream does not invalidate the blocking stream's capture.
    for (const auto& c : r.captures) {
      if (ddp_emu::takes_part_blocking(*c)) return record(cudaErrorStreamCaptureImplicit);
    }
    *pCaptureStatus = cudaStreamCaptureStatusNone;
    return cudaSuccess;
  }
  if (!stream->capture) {
    *pCaptureStatus = cudaStreamCaptureStatusNone;
  } else {
    *pCaptureStatus = stream->capture->invalidated ? cudaStreamCaptureStatusInvalidated
                                                   : cudaStreamCaptureStatusActive;
  }
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  DDP_EMU_COUNT_CALL();
  if (mode == nullptr || !ddp_emu::valid_mode(*mode)) return record(cudaErrorInvalidValue);
  std::swap(*mode, ddp_emu::t_capture_mode);
  return cudaSuccess;
}

// The emulation has no allocation nodes and no device-side launches, so the flags change
// nothing; cudaGraphInstantiateFlagUpload is only for cudaGraphInstantiateWithParams.
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
                                 unsigned long long flags) {
  DDP_EMU_COUNT_CALL();
  constexpr unsigned long long kFlags = cudaGraphInstantiateFlagAutoFreeOnLaunch |
                                        cudaGraphInstantiateFlagDeviceLaunch |
                                        cudaGraphInstantiateFlagUseNodePriority;
  if (pGraphExec == nullptr || (flags & ~kFlags) != 0) return record(cudaErrorInvalidValue);
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.graphs.count(graph) == 0) return record(cudaErrorInvalidValue);
  *pGraphExec = new CUgraphExec_st{graph->nodes};
  r.execs.insert(*pGraphExec);
  return cudaSuccess;
}

// Replays the nodes on `stream` like work queued there: at once in immediate mode (and on the
// legacy stream, after what it waits for), queued in deferred mode, recorded as one node when
// the stream captures. A kernel that faults is an asynchronous error, as on a device.
cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  DDP_EMU_COUNT_CALL();
  ddp_emu::count_graph_launch();
  ddp_emu::Registry& r = registry();
  std::unique_lock<std::mutex> lk(r.mu);
  if (r.execs.count(graphExec) == 0) return record(cudaErrorInvalidValue);
  if (!ddp_emu::stream_valid_locked(r, stream)) return record(cudaErrorInvalidResourceHandle);
  const std::shared_ptr<const ddp_emu::GraphNodes> nodes = graphExec->nodes;
  if (stream != nullptr && stream->capture) {
    return record(ddp_emu::capture_locked(stream, "cudaGraphLaunch",
                                          [nodes] { ddp_emu::run_nodes(*nodes); }));
  }
  if (stream == nullptr) {
    const cudaError_t e = ddp_emu::legacy_stream_use_locked(r);
    if (e != cudaSuccess) return record(e);
  }
  if (stream != nullptr && ddp_emu::deferred()) {
    for (size_t i = 0; i < nodes->size(); ++i) {
      ddp_emu::enqueue_locked(stream, [nodes, i] { (*nodes)[i].run(); });
    }
    return cudaSuccess;
  }
  lk.unlock();
  if (stream == nullptr) ddp_emu::before_legacy_op();
  ddp_emu::run_nodes(*nodes);
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  DDP_EMU_COUNT_CALL();
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.execs.erase(graphExec) == 0) return record(cudaErrorInvalidValue);
  delete graphExec;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  DDP_EMU_COUNT_CALL();
  ddp_emu::Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.graphs.erase(graph) == 0) return record(cudaErrorInvalidValue);
  delete graph;
  return cudaSuccess;
}
