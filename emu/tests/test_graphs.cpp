// Self-tests of stream capture and graphs in the CUDA emulator (cuda_emu_graphs.cpp): a captured
// sequence replays the bytes of eager execution, forks and joins across streams, every
// prohibited call returns CUDA's error and invalidates the capture, graphs in deferred mode;
// and the runtime-call counts.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuda_emu.h"
#include "deferred_streams.h"

namespace {

__global__ void iota_kernel(float* x, int n, float start) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] = start + static_cast<float>(i);
}

__global__ void axpy_kernel(const float* x, float* y, int n, float a) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] = a * x[i] + y[i];
}

__global__ void add_kernel(const float* a, const float* b, float* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = a[i] + b[i];
}

constexpr int kN = 300;
constexpr size_t kBytes = kN * sizeof(float);
const dim3 kGrid((kN + 127) / 128), kBlock(128);

cudaStream_t make_stream(unsigned flags) {
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, flags) == cudaSuccess);
  return s;
}

cudaEvent_t make_event() {
  cudaEvent_t e = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
  return e;
}

cudaStreamCaptureStatus capture_status(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  REQUIRE(cudaStreamIsCapturing(s, &status) == cudaSuccess);
  return status;
}

// Device arrays and a pinned input and output, freed at the end of the test (never during a
// capture: freeing is a prohibited call then).
struct Buffers {
  float* x = nullptr;
  float* y = nullptr;
  float* z = nullptr;
  float* in = nullptr;   // pinned
  float* out = nullptr;  // pinned
  Buffers() {
    for (float** d : {&x, &y, &z}) REQUIRE(cudaMalloc(d, kBytes) == cudaSuccess);
    REQUIRE(cudaMallocHost(&in, kBytes) == cudaSuccess);
    REQUIRE(cudaMallocHost(&out, kBytes) == cudaSuccess);
    for (int i = 0; i < kN; ++i) in[i] = 0.5f * static_cast<float>(i % 17);
  }
  ~Buffers() {
    for (float* d : {x, y, z}) cudaFree(d);
    cudaFreeHost(in);
    cudaFreeHost(out);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  // Every byte all-ones again (NaN), as after cudaMalloc, so a replay must write them all.
  void poison() {
    for (float* d : {x, y, z}) REQUIRE(cudaMemset(d, 0xFF, kBytes) == cudaSuccess);
    std::memset(out, 0xFF, kBytes);
  }
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> all(4 * kBytes);
    for (int k = 0; k < 3; ++k) {
      const float* d = k == 0 ? x : k == 1 ? y : z;
      REQUIRE(cudaMemcpy(all.data() + k * kBytes, d, kBytes, cudaMemcpyDeviceToHost) ==
              cudaSuccess);
    }
    std::memcpy(all.data() + 3 * kBytes, out, kBytes);
    return all;
  }
};

// Kernels, copies in every direction and a memset, each depending on the one before. The scale
// comes by reference, so that a test can change it after a capture took its value.
void step(Buffers& b, cudaStream_t s, const float& scale) {
  DDP_EMU_LAUNCH(iota_kernel, kGrid, kBlock, s, b.x, kN, 1.0f);
  REQUIRE(cudaMemsetAsync(b.y, 0, kBytes, s) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(b.z, b.in, kBytes, cudaMemcpyHostToDevice, s) == cudaSuccess);
  DDP_EMU_LAUNCH(axpy_kernel, kGrid, kBlock, s, b.x, b.y, kN, scale);
  DDP_EMU_LAUNCH(axpy_kernel, kGrid, kBlock, s, b.z, b.y, kN, 1.0f);
  REQUIRE(cudaMemcpyAsync(b.z, b.y, kBytes, cudaMemcpyDeviceToDevice, s) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(b.y, 0x40, kBytes / 2, s) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(b.out, b.z, kBytes, cudaMemcpyDeviceToHost, s) == cudaSuccess);
}

cudaGraphExec_t instantiate(cudaGraph_t graph) {
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  return exec;
}

}  // namespace

TEST_CASE("graphs: a captured sequence replays the bytes of eager execution, twice",
          "[emu][graph]") {
  Buffers b;
  cudaStream_t s = make_stream(cudaStreamNonBlocking);
  step(b, s, 3.0f);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  const std::vector<unsigned char> eager = b.bytes();

  b.poison();
  const int64_t launches = ddp_emu::launch_count();
  float scale = 3.0f;
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(capture_status(s) == cudaStreamCaptureStatusActive);
  step(b, s, scale);
  scale = 100.0f;  // kernel arguments were taken by value at the capture
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  REQUIRE(graph != nullptr);
  CHECK(capture_status(s) == cudaStreamCaptureStatusNone);
  CHECK(ddp_emu::launch_count() == launches);  // recorded, not run
  CHECK(b.bytes() != eager);

  const std::vector<ddp_emu::CapturedNode> nodes = ddp_emu::graph_nodes(graph);
  REQUIRE(nodes.size() == 8);
  CHECK(nodes[0].what == "kernel iota_kernel");
  CHECK(nodes[3].what == "kernel axpy_kernel");
  CHECK(nodes[1].what == "cudaMemsetAsync");
  CHECK(nodes[2].what == "cudaMemcpyAsync");
  CHECK(nodes[0].deps.empty());
  for (size_t i = 1; i < nodes.size(); ++i) CHECK(nodes[i].deps == std::vector<size_t>{i - 1});

  cudaGraphExec_t exec = instantiate(graph);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);  // the executable graph keeps its nodes
  for (int replay = 0; replay < 2; ++replay) {
    INFO("replay " << replay);
    b.poison();
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(b.bytes() == eager);
  }
  CHECK(ddp_emu::launch_count() == launches + 6);

  // Copies read their source when the graph runs: a new input gives a new result.
  b.in[0] = 1000.0f;
  REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(b.out[0] == 1000.0f + 3.0f * 1.0f);
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("graphs: an event forks a second stream into the capture and another joins it back",
          "[emu][graph]") {
  Buffers b;
  cudaStream_t origin = make_stream(cudaStreamDefault), side = make_stream(cudaStreamNonBlocking);
  cudaEvent_t forked = make_event(), done = make_event();
  REQUIRE(cudaStreamBeginCapture(origin, cudaStreamCaptureModeGlobal) == cudaSuccess);
  ddp_emu::launch(iota_kernel, kGrid, kBlock, origin, b.x, kN, 1.0f);
  REQUIRE(cudaEventRecord(forked, origin) == cudaSuccess);
  CHECK(capture_status(side) == cudaStreamCaptureStatusNone);
  REQUIRE(cudaStreamWaitEvent(side, forked, 0) == cudaSuccess);
  CHECK(capture_status(side) == cudaStreamCaptureStatusActive);
  REQUIRE(cudaMemsetAsync(b.y, 0, kBytes, side) == cudaSuccess);
  ddp_emu::launch(axpy_kernel, kGrid, kBlock, side, b.x, b.y, kN, 2.0f);  // y = 2x
  REQUIRE(cudaMemcpyAsync(b.z, b.x, kBytes, cudaMemcpyDeviceToDevice, origin) == cudaSuccess);
  REQUIRE(cudaEventRecord(done, side) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(origin, done, 0) == cudaSuccess);
  ddp_emu::launch(add_kernel, kGrid, kBlock, origin, b.y, b.z, b.z, kN);  // z = 3x
  REQUIRE(cudaMemcpyAsync(b.out, b.z, kBytes, cudaMemcpyDeviceToHost, origin) == cudaSuccess);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(origin, &graph) == cudaSuccess);
  CHECK(capture_status(side) == cudaStreamCaptureStatusNone);

  // 0 iota; on the side 1 memset, 2 axpy; 3 copy on the origin; 4 add after both branches.
  const std::vector<ddp_emu::CapturedNode> nodes = ddp_emu::graph_nodes(graph);
  REQUIRE(nodes.size() == 6);
  CHECK(nodes[1].deps == std::vector<size_t>{0});
  CHECK(nodes[2].deps == std::vector<size_t>{1});
  CHECK(nodes[3].deps == std::vector<size_t>{0});
  std::vector<size_t> joined = nodes[4].deps;
  std::sort(joined.begin(), joined.end());
  CHECK(joined == std::vector<size_t>{2, 3});

  // Launched on a third stream, the whole graph runs there.
  cudaStream_t third = make_stream(cudaStreamNonBlocking);
  cudaGraphExec_t exec = instantiate(graph);
  b.poison();
  REQUIRE(cudaGraphLaunch(exec, third) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(third) == cudaSuccess);
  for (int i = 0; i < kN; ++i) REQUIRE(b.out[i] == 3.0f * (1.0f + static_cast<float>(i)));
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  for (cudaEvent_t e : {forked, done}) CHECK(cudaEventDestroy(e) == cudaSuccess);
  for (cudaStream_t st : {origin, side, third}) CHECK(cudaStreamDestroy(st) == cudaSuccess);
}

TEST_CASE("graphs: a fork that never rejoins fails cudaStreamEndCapture", "[emu][graph]") {
  Buffers b;
  cudaStream_t origin = make_stream(cudaStreamNonBlocking),
               side = make_stream(cudaStreamNonBlocking);
  cudaEvent_t forked = make_event();
  REQUIRE(cudaStreamBeginCapture(origin, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(cudaEventRecord(forked, origin) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(side, forked, 0) == cudaSuccess);
  ddp_emu::launch(iota_kernel, kGrid, kBlock, side, b.x, kN, 1.0f);
  ddp_emu::launch(iota_kernel, kGrid, kBlock, origin, b.y, kN, 1.0f);
  cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(&b);  // must come back null
  CHECK(cudaStreamEndCapture(origin, &graph) == cudaErrorStreamCaptureUnjoined);
  CHECK(graph == nullptr);
  CHECK(cudaGetLastError() == cudaErrorStreamCaptureUnjoined);
  // Both streams left the capture and work again.
  CHECK(capture_status(side) == cudaStreamCaptureStatusNone);
  CHECK(capture_status(origin) == cudaStreamCaptureStatusNone);
  ddp_emu::launch(iota_kernel, kGrid, kBlock, side, b.x, kN, 1.0f);
  CHECK(cudaStreamSynchronize(side) == cudaSuccess);
  CHECK(cudaEventQuery(forked) == cudaErrorInvalidValue);  // recorded in a capture that ended
  CHECK(cudaEventRecord(forked, side) == cudaSuccess);
  CHECK(cudaEventSynchronize(forked) == cudaSuccess);
  CHECK(cudaEventDestroy(forked) == cudaSuccess);
  for (cudaStream_t st : {origin, side}) CHECK(cudaStreamDestroy(st) == cudaSuccess);
}

namespace {

// What a prohibited call gets: the capturing stream (blocking: the legacy stream depends on
// it), an event recorded in the capture, one recorded before it, and device memory.
struct CaptureScene {
  cudaStream_t s;
  cudaStream_t side;  // not in the capture
  cudaEvent_t captured;
  cudaEvent_t outside;
  float* device;
};

struct Prohibited {
  const char* what;
  cudaError_t expected;
  std::function<cudaError_t(const CaptureScene&)> call;
};

cudaError_t launch_on_legacy_stream(float* device) {
  try {
    ddp_emu::launch(iota_kernel, kGrid, kBlock, nullptr, device, kN, 1.0f);
  } catch (const ddp_emu::KernelFault&) {
    return cudaPeekAtLastError();
  }
  return cudaSuccess;
}

cudaError_t copy_to_host(float* device) {
  float host[4] = {};
  return cudaMemcpy(host, device, sizeof host, cudaMemcpyDeviceToHost);
}

cudaError_t allocate_and_free() {
  void* p = nullptr;
  const cudaError_t rc = cudaMalloc(&p, 64);
  if (rc == cudaSuccess) cudaFree(p);
  return rc;
}

const std::vector<Prohibited>& prohibited_calls() {
  using S = const CaptureScene&;
  static const std::vector<Prohibited> calls = {
      {"cudaStreamSynchronize of the capturing stream", cudaErrorStreamCaptureUnsupported,
       [](S c) { return cudaStreamSynchronize(c.s); }},
      {"cudaDeviceSynchronize", cudaErrorStreamCaptureUnsupported,
       [](S) { return cudaDeviceSynchronize(); }},
      {"cudaEventQuery of an event recorded in the capture", cudaErrorCapturedEvent,
       [](S c) { return cudaEventQuery(c.captured); }},
      {"cudaEventSynchronize of an event recorded in the capture", cudaErrorCapturedEvent,
       [](S c) { return cudaEventSynchronize(c.captured); }},
      {"a kernel on the legacy stream", cudaErrorStreamCaptureImplicit,
       [](S c) { return launch_on_legacy_stream(c.device); }},
      {"cudaMemsetAsync on the legacy stream", cudaErrorStreamCaptureImplicit,
       [](S c) { return cudaMemsetAsync(c.device, 0, kBytes, 0); }},
      {"cudaEventRecord on the legacy stream", cudaErrorStreamCaptureImplicit,
       [](S c) { return cudaEventRecord(c.outside, 0); }},
      {"cudaStreamSynchronize of the legacy stream", cudaErrorStreamCaptureImplicit,
       [](S) { return cudaStreamSynchronize(0); }},
      {"synchronous cudaMemcpy", cudaErrorStreamCaptureImplicit,
       [](S c) { return copy_to_host(c.device); }},
      {"synchronous cudaMemset", cudaErrorStreamCaptureImplicit,
       [](S c) { return cudaMemset(c.device, 0, kBytes); }},
      {"cudaMalloc in global mode", cudaErrorStreamCaptureUnsupported,
       [](S) { return allocate_and_free(); }},
      {"cudaFree in global mode", cudaErrorStreamCaptureUnsupported,
       [](S) { return cudaFree(nullptr); }},
      {"cudaStreamWaitEvent of the legacy stream on an event of the capture",
       cudaErrorStreamCaptureImplicit, [](S c) { return cudaStreamWaitEvent(0, c.captured, 0); }},
      {"cudaStreamWaitEvent on an event recorded outside the capture",
       cudaErrorStreamCaptureIsolation, [](S c) { return cudaStreamWaitEvent(c.s, c.outside, 0); }},
      {"cudaStreamEndCapture on a stream the capture forked", cudaErrorStreamCaptureUnmatched,
       [](S c) {
         REQUIRE(cudaStreamWaitEvent(c.side, c.captured, 0) == cudaSuccess);
         cudaGraph_t graph = nullptr;
         return cudaStreamEndCapture(c.side, &graph);
       }},
  };
  return calls;
}

}  // namespace

TEST_CASE("graphs: every prohibited call returns CUDA's error and invalidates the capture",
          "[emu][graph]") {
  float* device = nullptr;
  REQUIRE(cudaMalloc(&device, kBytes) == cudaSuccess);
  cudaStream_t s = make_stream(cudaStreamDefault), side = make_stream(cudaStreamNonBlocking);
  cudaEvent_t captured = make_event(), outside = make_event();
  REQUIRE(cudaEventRecord(outside, side) == cudaSuccess);
  for (const Prohibited& p : prohibited_calls()) {
    INFO(p.what);
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(device, 0, kBytes, s) == cudaSuccess);
    REQUIRE(cudaEventRecord(captured, s) == cudaSuccess);
    CHECK(p.call(CaptureScene{s, side, captured, outside, device}) == p.expected);
    CHECK(cudaGetLastError() == p.expected);
    CHECK(capture_status(s) == cudaStreamCaptureStatusInvalidated);
    // Everything the capture would record now fails, until its origin ends it.
    CHECK(cudaMemsetAsync(device, 0, kBytes, s) == cudaErrorStreamCaptureInvalidated);
    CHECK(cudaEventRecord(captured, s) == cudaErrorStreamCaptureInvalidated);
    CHECK_THROWS_AS(ddp_emu::launch(iota_kernel, kGrid, kBlock, s, device, kN, 1.0f),
                    ddp_emu::KernelFault);
    CHECK(cudaGetLastError() == cudaErrorStreamCaptureInvalidated);
    cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(device);
    CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
    CHECK(graph == nullptr);
    CHECK(capture_status(s) == cudaStreamCaptureStatusNone);
    CHECK(capture_status(side) == cudaStreamCaptureStatusNone);
    CHECK(cudaGetLastError() == cudaErrorStreamCaptureInvalidated);
  }
  // Nothing was left behind: the streams, events and memory work as before.
  CHECK(cudaMemset(device, 0, kBytes) == cudaSuccess);
  CHECK(cudaEventRecord(captured, s) == cudaSuccess);
  CHECK(cudaEventSynchronize(captured) == cudaSuccess);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  for (cudaEvent_t e : {captured, outside}) CHECK(cudaEventDestroy(e) == cudaSuccess);
  for (cudaStream_t st : {s, side}) CHECK(cudaStreamDestroy(st) == cudaSuccess);
  CHECK(cudaFree(device) == cudaSuccess);
}

namespace {

// Runs f on a thread of its own (its capture interaction mode is its own too).
template <class F>
void on_other_thread(F f) {
  std::thread t(f);
  t.join();
}

cudaError_t malloc_then_free() { return allocate_and_free(); }

}  // namespace

TEST_CASE("graphs: what the capture modes and a non-blocking capture allow", "[emu][graph]") {
  cudaStream_t blocking = make_stream(cudaStreamDefault);
  cudaStream_t nonblocking = make_stream(cudaStreamNonBlocking);
  cudaGraph_t graph = nullptr;

  // Asking about the legacy stream while a blocking stream captures is an error that leaves
  // the capture alone.
  REQUIRE(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CHECK(cudaStreamIsCapturing(0, &status) == cudaErrorStreamCaptureImplicit);
  // Relaxed: allocating and freeing are allowed.
  CHECK(malloc_then_free() == cudaSuccess);
  CHECK(capture_status(blocking) == cudaStreamCaptureStatusActive);
  CHECK(cudaStreamEndCapture(blocking, &graph) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  (void)cudaGetLastError();

  // A non-blocking stream's capture leaves the legacy stream usable: synchronous copies work.
  float* device = nullptr;
  REQUIRE(cudaMalloc(&device, kBytes) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(nonblocking, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  CHECK(cudaStreamIsCapturing(0, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusNone);
  CHECK(cudaMemset(device, 0, kBytes) == cudaSuccess);
  CHECK(copy_to_host(device) == cudaSuccess);
  // ThreadLocal: another thread may allocate, this one may not.
  cudaError_t other = cudaErrorInvalidValue;
  on_other_thread([&] { other = malloc_then_free(); });
  CHECK(other == cudaSuccess);
  CHECK(capture_status(nonblocking) == cudaStreamCaptureStatusActive);
  CHECK(malloc_then_free() == cudaErrorStreamCaptureUnsupported);
  CHECK(cudaStreamEndCapture(nonblocking, &graph) == cudaErrorStreamCaptureInvalidated);

  // Global: another thread in the default (global) mode may not allocate; one that chose
  // relaxed may. Ending the capture from another thread is refused.
  REQUIRE(cudaStreamBeginCapture(nonblocking, cudaStreamCaptureModeGlobal) == cudaSuccess);
  cudaError_t exchanged = cudaErrorInvalidValue, relaxed = cudaErrorInvalidValue;
  cudaError_t end = cudaSuccess;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  on_other_thread([&] {
    exchanged = cudaThreadExchangeStreamCaptureMode(&mode);
    relaxed = malloc_then_free();
  });
  CHECK(exchanged == cudaSuccess);
  CHECK(mode == cudaStreamCaptureModeGlobal);  // that thread's previous mode
  CHECK(relaxed == cudaSuccess);
  CHECK(capture_status(nonblocking) == cudaStreamCaptureStatusActive);
  on_other_thread([&] { other = malloc_then_free(); });
  CHECK(other == cudaErrorStreamCaptureUnsupported);
  CHECK(capture_status(nonblocking) == cudaStreamCaptureStatusInvalidated);
  // Ending it from another thread is refused, and ends it (as CUDA 13 does).
  on_other_thread([&] {
    cudaGraph_t g = reinterpret_cast<cudaGraph_t>(device);
    end = cudaStreamEndCapture(nonblocking, &g);
    if (g != nullptr) end = cudaSuccess;  // a graph must not come back
  });
  CHECK(end == cudaErrorStreamCaptureWrongThread);
  CHECK(capture_status(nonblocking) == cudaStreamCaptureStatusNone);
  CHECK(cudaStreamEndCapture(nonblocking, &graph) == cudaErrorIllegalState);

  // A relaxed capture may be ended by another thread.
  REQUIRE(cudaStreamBeginCapture(nonblocking, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  on_other_thread([&] { end = cudaStreamEndCapture(nonblocking, &graph); });
  CHECK(end == cudaSuccess);
  CHECK(ddp_emu::graph_nodes(graph).empty());
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  (void)cudaGetLastError();
  CHECK(cudaFree(device) == cudaSuccess);
  for (cudaStream_t st : {blocking, nonblocking}) CHECK(cudaStreamDestroy(st) == cudaSuccess);
}

TEST_CASE("graphs: events of a capture, during it and after it ended", "[emu][graph]") {
  cudaStream_t s = make_stream(cudaStreamNonBlocking), other = make_stream(cudaStreamNonBlocking);
  cudaEvent_t before = nullptr, inside = nullptr, never = make_event();
  REQUIRE(cudaEventCreate(&before) == cudaSuccess);  // with timing
  REQUIRE(cudaEventCreate(&inside) == cudaSuccess);
  REQUIRE(cudaEventRecord(before, other) == cudaSuccess);
  REQUIRE(cudaEventSynchronize(before) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(cudaStreamWaitEvent(s, never, 0) == cudaSuccess);  // no work to wait for: a no-op
  REQUIRE(cudaEventRecord(inside, s) == cudaSuccess);
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, before, inside) == cudaErrorInvalidValue);  // has no time
  CHECK(capture_status(s) == cudaStreamCaptureStatusActive);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  // Last recorded in a capture that ended: refused until recorded again.
  CHECK(cudaEventQuery(inside) == cudaErrorInvalidValue);
  CHECK(cudaEventSynchronize(inside) == cudaErrorInvalidValue);
  CHECK(cudaStreamWaitEvent(other, inside, 0) == cudaErrorInvalidValue);
  CHECK(cudaEventElapsedTime(&ms, before, inside) == cudaErrorInvalidValue);
  cudaGraphExec_t exec = instantiate(graph);
  REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);  // a launch records no event
  CHECK(cudaEventQuery(inside) == cudaErrorInvalidValue);
  REQUIRE(cudaEventRecord(inside, s) == cudaSuccess);
  CHECK(cudaEventSynchronize(inside) == cudaSuccess);
  CHECK(cudaEventElapsedTime(&ms, before, inside) == cudaSuccess);
  (void)cudaGetLastError();
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  for (cudaEvent_t e : {before, never, inside}) CHECK(cudaEventDestroy(e) == cudaSuccess);
  for (cudaStream_t st : {s, other}) CHECK(cudaStreamDestroy(st) == cudaSuccess);
}

TEST_CASE("graphs: two captures cannot merge; argument errors", "[emu][graph]") {
  cudaStream_t a = make_stream(cudaStreamNonBlocking), b = make_stream(cudaStreamNonBlocking);
  cudaEvent_t e = make_event();
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(b, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(cudaEventRecord(e, a) == cudaSuccess);
  CHECK(cudaStreamWaitEvent(b, e, 0) == cudaErrorStreamCaptureMerge);
  CHECK(capture_status(a) == cudaStreamCaptureStatusInvalidated);
  CHECK(capture_status(b) == cudaStreamCaptureStatusInvalidated);
  CHECK(cudaStreamEndCapture(a, &graph) == cudaErrorStreamCaptureInvalidated);
  CHECK(cudaStreamEndCapture(b, &graph) == cudaErrorStreamCaptureInvalidated);

  // Misuses of begin and end, with what CUDA 13 answers.
  CHECK(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal) ==
        cudaErrorStreamCaptureUnsupported);
  CHECK(cudaStreamBeginCapture(a, static_cast<cudaStreamCaptureMode>(3)) == cudaErrorInvalidValue);
  REQUIRE(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal) == cudaErrorIllegalState);
  CHECK(capture_status(a) == cudaStreamCaptureStatusActive);  // the capture goes on
  CHECK(cudaStreamEndCapture(a, nullptr) == cudaErrorInvalidValue);
  CHECK(cudaStreamEndCapture(b, &graph) == cudaErrorIllegalState);  // not capturing
  CHECK(cudaStreamIsCapturing(a, nullptr) == cudaErrorInvalidValue);
  REQUIRE(cudaStreamEndCapture(a, &graph) == cudaSuccess);
  CHECK(cudaStreamDestroy(a) == cudaSuccess);

  cudaGraphExec_t exec = nullptr;
  CHECK(cudaGraphInstantiate(nullptr, graph, 0) == cudaErrorInvalidValue);
  CHECK(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagUpload) ==
        cudaErrorInvalidValue);
  CHECK(cudaGraphInstantiate(&exec, nullptr, 0) == cudaErrorInvalidValue);
  REQUIRE(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch) ==
          cudaSuccess);
  CHECK(cudaGraphLaunch(nullptr, b) == cudaErrorInvalidValue);
  CHECK(cudaGraphLaunch(exec, a) == cudaErrorInvalidResourceHandle);  // destroyed stream
  CHECK(cudaGraphLaunch(exec, b) == cudaSuccess);
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphExecDestroy(exec) == cudaErrorInvalidValue);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaErrorInvalidValue);
  CHECK_THROWS_AS(ddp_emu::graph_nodes(graph), std::invalid_argument);
  (void)cudaGetLastError();
  CHECK(cudaEventDestroy(e) == cudaSuccess);
  CHECK(cudaStreamDestroy(b) == cudaSuccess);
}

using ddp_emu_test::DeferredStreams;

TEST_CASE("graphs: in deferred mode a launched graph runs when something waits for it",
          "[emu][graph][deferred]") {
  DeferredStreams deferred;
  Buffers b;
  cudaStream_t s = make_stream(cudaStreamNonBlocking);
  step(b, s, 3.0f);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  const std::vector<unsigned char> eager = b.bytes();

  b.poison();
  // Work queued before the capture stays queued, outside the graph.
  ddp_emu::launch(iota_kernel, kGrid, kBlock, s, b.x, kN, 7.0f);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  step(b, s, 3.0f);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  CHECK(ddp_emu::queued_operations(s) == 1);
  cudaGraphExec_t exec = instantiate(graph);
  REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
  CHECK(ddp_emu::queued_operations(s) == 9);
  CHECK(std::isnan(b.out[0]));  // nothing ran yet
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(ddp_emu::queued_operations(s) == 0);
  CHECK(b.bytes() == eager);

  // Destroyed before it runs, the executable graph still runs what was launched.
  b.poison();
  REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  CHECK(std::isnan(b.out[0]));
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(b.bytes() == eager);
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("graphs: a replayed kernel that faults is an asynchronous error", "[emu][graph]") {
  cudaStream_t s = make_stream(cudaStreamNonBlocking);
  float* device = nullptr;
  REQUIRE(cudaMalloc(&device, kBytes) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  ddp_emu::launch(iota_kernel, kGrid, kBlock, s, device, kN + 10, 1.0f);  // writes past the end
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  cudaGraphExec_t exec = instantiate(graph);
  CHECK(cudaGraphLaunch(exec, s) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaErrorLaunchFailure);
  CHECK_THAT(ddp_emu::last_deferred_fault(), Catch::Contains("wrote outside a device allocation"));
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  CHECK(cudaFree(device) == cudaSuccess);
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("runtime calls: each call counted once, kernel and graph launches apart",
          "[emu][calls]") {
  Buffers b;
  cudaStream_t s = make_stream(cudaStreamNonBlocking);
  ddp_emu::reset_runtime_calls();
  CHECK(ddp_emu::runtime_calls().total() == 0);
  step(b, s, 2.0f);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  ddp_emu::RuntimeCalls calls = ddp_emu::runtime_calls();
  CHECK(calls.kernel_launches == 3);
  CHECK(calls.of("cudaMemsetAsync") == 2);
  CHECK(calls.of("cudaMemcpyAsync") == 3);
  CHECK(calls.of("cudaMemcpy") == 0);  // an async copy that runs at once is still one call
  CHECK(calls.of("cudaMemset") == 0);
  CHECK(calls.of("cudaStreamSynchronize") == 1);
  CHECK(calls.graph_launches == 0);
  CHECK(calls.total() == 9);

  // The same step as a graph: one launch and one synchronisation per step.
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  step(b, s, 2.0f);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  cudaGraphExec_t exec = instantiate(graph);
  calls = ddp_emu::runtime_calls();
  CHECK(calls.kernel_launches == 6);  // captured launches are calls too
  CHECK(calls.of("cudaStreamBeginCapture") == 1);
  CHECK(calls.of("cudaStreamEndCapture") == 1);
  CHECK(calls.of("cudaGraphInstantiate") == 1);
  ddp_emu::reset_runtime_calls();
  const int64_t launches = ddp_emu::launch_count();
  for (int i = 0; i < 2; ++i) {
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  }
  calls = ddp_emu::runtime_calls();
  CHECK(ddp_emu::launch_count() == launches + 6);
  CHECK(calls.kernel_launches == 0);  // replayed kernels are no calls
  CHECK(calls.graph_launches == 2);
  CHECK(calls.of("cudaGraphLaunch") == 2);
  CHECK(calls.total() == 4);

  // A function the emulation implements through another is counted as the one called.
  ddp_emu::reset_runtime_calls();
  cudaStream_t t = nullptr;
  cudaEvent_t e = nullptr;
  REQUIRE(cudaStreamCreate(&t) == cudaSuccess);
  REQUIRE(cudaEventCreate(&e) == cudaSuccess);
  (void)cudaGetErrorName(cudaErrorInvalidValue);
  (void)cudaGetLastError();
  calls = ddp_emu::runtime_calls();
  CHECK(calls.api == std::map<std::string, int64_t>{{"cudaEventCreate", 1},
                                                    {"cudaGetErrorName", 1},
                                                    {"cudaGetLastError", 1},
                                                    {"cudaStreamCreate", 1}});
  CHECK(calls.total() == 4);
  CHECK(cudaEventDestroy(e) == cudaSuccess);
  CHECK(cudaStreamDestroy(t) == cudaSuccess);
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
}
