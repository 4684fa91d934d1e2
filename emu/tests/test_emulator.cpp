// Self-tests of the CUDA emulator (cuda_emu.h): thread indexing, shared memory and barriers, warp
// shuffles and votes with CUDA's width rules, the faults a broken kernel must raise instead of
// hanging, the runtime subset (poisoned checked allocations, copies, streams, events) and the
// deferred stream mode that exposes missing waits.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_emu.h"
#include "deferred_streams.h"

namespace {

using Catch::Contains;

constexpr unsigned kFull = 0xffffffffu;

unsigned linear_thread() {
  return threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y;
}
unsigned linear_block() {
  return blockIdx.x + blockIdx.y * gridDim.x + blockIdx.z * gridDim.x * gridDim.y;
}

std::string fault_of(void (*run)()) {
  try {
    run();
  } catch (const ddp_emu::KernelFault& e) {
    return e.what();
  }
  return "no KernelFault";
}

// ----- indexing -------------------------------------------------------------------------------

__global__ void coverage_kernel(int* hits, unsigned* owner) {
  const unsigned x = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned y = blockIdx.y * blockDim.y + threadIdx.y;
  const unsigned z = blockIdx.z * blockDim.z + threadIdx.z;
  const unsigned width = gridDim.x * blockDim.x, height = gridDim.y * blockDim.y;
  const unsigned i = (z * height + y) * width + x;
  atomicAdd(&hits[i], 1);
  owner[i] = linear_block() * 1024 + linear_thread();
}

void check_coverage(dim3 grid, dim3 block) {
  const unsigned w = grid.x * block.x, h = grid.y * block.y, d = grid.z * block.z;
  const size_t n = size_t{w} * h * d;
  int* hits = nullptr;
  unsigned* owner = nullptr;
  REQUIRE(cudaMalloc(&hits, n * sizeof(int)) == cudaSuccess);
  REQUIRE(cudaMalloc(&owner, n * sizeof(unsigned)) == cudaSuccess);
  REQUIRE(cudaMemset(hits, 0, n * sizeof(int)) == cudaSuccess);
  ddp_emu::launch(coverage_kernel, grid, block, nullptr, hits, owner);
  std::vector<int> h_hits(n);
  std::vector<unsigned> h_owner(n);
  REQUIRE(cudaMemcpy(h_hits.data(), hits, n * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(cudaMemcpy(h_owner.data(), owner, n * sizeof(unsigned), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  size_t wrong = 0;
  for (unsigned z = 0; z < d; ++z) {
    for (unsigned y = 0; y < h; ++y) {
      for (unsigned x = 0; x < w; ++x) {
        const size_t i = (size_t{z} * h + y) * w + x;
        const unsigned b = x / block.x + y / block.y * grid.x + z / block.z * grid.x * grid.y;
        const unsigned t = x % block.x + y % block.y * block.x + z % block.z * block.x * block.y;
        if (h_hits[i] != 1 || h_owner[i] != b * 1024 + t) ++wrong;
      }
    }
  }
  CHECK(wrong == 0);
  CHECK(cudaFree(hits) == cudaSuccess);
  CHECK(cudaFree(owner) == cudaSuccess);
}

TEST_CASE("a 3-D grid of 3-D blocks writes every element exactly once", "[emu]") {
  check_coverage(dim3(3, 2, 2), dim3(5, 3, 2));  // 30 threads: a partial warp
  check_coverage(dim3(2, 3, 1), dim3(8, 4, 4));
  check_coverage(dim3(7), dim3(33));
}

__global__ void per_thread_copy_kernel(int v, int* out) {
  v += static_cast<int>(threadIdx.x);  // a by-value parameter is each thread's own copy
  out[threadIdx.x] = v;
}

__global__ void convert_kernel(int64_t n, const float* x, float* y, float scale) {
  const int64_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * scale;
}

TEST_CASE("arguments are converted by value and copied per thread", "[emu]") {
  std::vector<int> out(64, -1);
  const int64_t before = ddp_emu::launch_count();
  ddp_emu::launch(per_thread_copy_kernel, dim3(1), dim3(64), nullptr, 100, out.data());
  CHECK(ddp_emu::launch_count() == before + 1);
  for (int i = 0; i < 64; ++i) CHECK(out[i] == 100 + i);

  std::vector<float> x(50), y(50, -1.0f);
  for (int i = 0; i < 50; ++i) x[i] = static_cast<float>(i);
  ddp_emu::launch(convert_kernel, dim3(2), dim3(32), nullptr, 50, x.data(), y.data(), 2.0);
  for (int i = 0; i < 50; ++i) CHECK(y[i] == 2.0f * static_cast<float>(i));
}

// ----- shared memory and __syncthreads --------------------------------------------------------

__global__ void block_sum_kernel(const int* in, int* out) {
  __shared__ int buf[1024];
  const unsigned t = threadIdx.x;
  buf[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) buf[t] += buf[t + s];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = buf[0];
}

std::vector<int> block_sums(unsigned blocks, unsigned threads, const std::vector<int>& in) {
  std::vector<int> out(blocks, -1);
  ddp_emu::launch(block_sum_kernel, dim3(blocks), dim3(threads), nullptr, in.data(), out.data());
  return out;
}

std::vector<int> reference_sums(unsigned blocks, unsigned threads, const std::vector<int>& in) {
  std::vector<int> out(blocks, 0);
  for (unsigned b = 0; b < blocks; ++b) {
    for (unsigned t = 0; t < threads; ++t) out[b] += in[b * threads + t];
  }
  return out;
}

TEST_CASE("a shared-memory tree reduction gives exact sums", "[emu]") {
  for (unsigned threads : {256u, 1024u}) {
    const unsigned blocks = 6;
    std::vector<int> in(blocks * threads);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int>((i * 7919) % 1000) - 300;
    CHECK(block_sums(blocks, threads, in) == reference_sums(blocks, threads, in));
  }
  CHECK(ddp_emu::worker_threads() == 1024);
  block_sums(1, 64, std::vector<int>(64, 1));
  CHECK(ddp_emu::worker_threads() == 1024);  // the pool is reused, not grown or rebuilt
}

__global__ void barrier_visibility_kernel(int token, int* seen) {
  __shared__ int value;
  if (threadIdx.x == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    value = token + static_cast<int>(blockIdx.x);
  }
  __syncthreads();
  seen[blockIdx.x * blockDim.x + threadIdx.x] = value;
}

// The control: without a barrier the other threads read before thread 0 writes. Thread 0
// waits until they have all read, which only ends if the threads really run concurrently.
__global__ void no_barrier_kernel(int token, int* seen) {
  __shared__ int value;
  __shared__ int readers;
  if (threadIdx.x == 0) {
    __atomic_store_n(&value, -1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&readers, 0, __ATOMIC_SEQ_CST);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int others = static_cast<int>(blockDim.x) - 1;
    for (int ms = 0; ms < 20000 && __atomic_load_n(&readers, __ATOMIC_SEQ_CST) < others; ++ms) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (__atomic_load_n(&readers, __ATOMIC_SEQ_CST) < others) return;  // seen[0] stays unset
    __atomic_store_n(&value, token, __ATOMIC_SEQ_CST);
  }
  seen[threadIdx.x] = __atomic_load_n(&value, __ATOMIC_SEQ_CST);
  if (threadIdx.x != 0) __atomic_fetch_add(&readers, 1, __ATOMIC_SEQ_CST);
}

TEST_CASE("__syncthreads is a real barrier", "[emu]") {
  const int token = 1000 + static_cast<int>(ddp_emu::launch_count()) * 10;
  std::vector<int> seen(3 * 64, -1);
  ddp_emu::launch(barrier_visibility_kernel, dim3(3), dim3(64), nullptr, token, seen.data());
  for (size_t i = 0; i < seen.size(); ++i) CHECK(seen[i] == token + static_cast<int>(i / 64));

  // The control needs threads that run at the same time; serial schedules have their own tests.
  if (ddp_emu::schedule() != ddp_emu::Schedule::kParallel) return;
  std::vector<int> raced(64, -2);
  ddp_emu::launch(no_barrier_kernel, dim3(1), dim3(64), nullptr, token + 7, raced.data());
  CHECK(raced[0] == token + 7);
  CHECK(std::count(raced.begin() + 1, raced.end(), -1) == 63);
}

// ----- warp operations ------------------------------------------------------------------------

template <class T, int Width>
__global__ void xor_reduce_kernel(const T* in, T* out) {
  const unsigned t = linear_thread();
  T v = in[t];
  for (int o = Width / 2; o > 0; o /= 2) v += __shfl_xor_sync(kFull, v, o, Width);
  out[t] = v;
}

template <class T, int Width>
__global__ void down_reduce_kernel(const T* in, T* out) {
  const unsigned t = linear_thread();
  T v = in[t];
  for (unsigned o = Width / 2; o > 0; o /= 2) v += __shfl_down_sync(kFull, v, o, Width);
  out[t] = v;
}

template <class T, int Width>
void check_warp_reductions() {
  const unsigned n = 128;
  std::vector<T> in(n), out(n);
  for (unsigned i = 0; i < n; ++i) in[i] = static_cast<T>((i * 37) % 101) + T(1);
  std::vector<T> group(n / Width, T(0));
  for (unsigned i = 0; i < n; ++i) group[i / Width] += in[i];

  ddp_emu::launch(xor_reduce_kernel<T, Width>, dim3(1), dim3(32, 2, 2), nullptr, in.data(),
                  out.data());
  for (unsigned i = 0; i < n; ++i) CHECK(out[i] == group[i / Width]);  // every lane has it

  ddp_emu::launch(down_reduce_kernel<T, Width>, dim3(1), dim3(32, 2, 2), nullptr, in.data(),
                  out.data());
  for (unsigned i = 0; i < n; i += Width) CHECK(out[i] == group[i / Width]);  // group leaders
}

TEST_CASE("warp reductions with __shfl_xor_sync and __shfl_down_sync are exact", "[emu]") {
  check_warp_reductions<int, 32>();
  check_warp_reductions<int, 16>();
  check_warp_reductions<float, 32>();
  check_warp_reductions<float, 16>();
  check_warp_reductions<double, 8>();
  check_warp_reductions<long long, 32>();
  check_warp_reductions<unsigned long long, 4>();
  check_warp_reductions<unsigned, 2>();
}

__global__ void shuffle_rules_kernel(int* out) {
  const int t = static_cast<int>(threadIdx.x);
  const int v = 1000 * (t / 32) + t % 32;
  int* o = out + 8 * t;
  o[0] = __shfl_down_sync(kFull, v, 3, 16);
  o[1] = __shfl_up_sync(kFull, v, 5, 8);
  o[2] = __shfl_xor_sync(kFull, v, 16, 16);
  o[3] = __shfl_sync(kFull, v, 3, 8);
  o[4] = __shfl_sync(kFull, v, 35);
  o[5] = __shfl_sync(kFull, v, -1, 8);
  o[6] = __shfl_up_sync(kFull, v, 1);
  o[7] = __shfl_down_sync(kFull, v, 31);
}

TEST_CASE("shuffles follow CUDA's lane and width rules", "[emu]") {
  std::vector<int> out(64 * 8, -7);
  ddp_emu::launch(shuffle_rules_kernel, dim3(1), dim3(64), nullptr, out.data());
  for (int t = 0; t < 64; ++t) {
    const int l = t % 32, w = 1000 * (t / 32);
    const int* o = out.data() + 8 * t;
    INFO("thread " << t);
    CHECK(o[0] == w + (l % 16 + 3 < 16 ? l + 3 : l));
    CHECK(o[1] == w + (l % 8 >= 5 ? l - 5 : l));
    CHECK(o[2] == w + (l < 16 ? l : l - 16));  // xor may reach an earlier segment, not a later one
    CHECK(o[3] == w + l / 8 * 8 + 3);
    CHECK(o[4] == w + 3);
    CHECK(o[5] == w + l / 8 * 8 + 7);
    CHECK(o[6] == w + (l == 0 ? 0 : l - 1));
    CHECK(o[7] == w + (l == 0 ? 31 : l));
  }
}

__global__ void vote_kernel(unsigned* out) {
  const unsigned t = threadIdx.x, lane = t % 32;
  unsigned* o = out + 5 * t;
  o[0] = __ballot_sync(kFull, lane % 3 == 0);
  o[1] = static_cast<unsigned>(__any_sync(kFull, t == 7));
  o[2] = static_cast<unsigned>(__all_sync(kFull, lane < 32));
  o[3] = static_cast<unsigned>(__all_sync(kFull, lane != 9));
  __syncwarp();
  o[4] = __ballot_sync(kFull, 1);  // the partial last warp has lanes 0-7 only
}

TEST_CASE("__ballot_sync, __any_sync and __all_sync", "[emu]") {
  std::vector<unsigned> out(40 * 5, 0xdeadu);
  ddp_emu::launch(vote_kernel, dim3(1), dim3(40), nullptr, out.data());
  unsigned every_third = 0;
  for (unsigned l = 0; l < 32; l += 3) every_third |= 1u << l;
  for (unsigned t = 0; t < 40; ++t) {
    INFO("thread " << t);
    const bool partial = t >= 32;
    CHECK(out[5 * t + 0] == (partial ? every_third & 0xffu : every_third));
    CHECK(out[5 * t + 1] == (partial ? 0u : 1u));
    CHECK(out[5 * t + 2] == 1u);
    CHECK(out[5 * t + 3] == (partial ? 1u : 0u));
    CHECK(out[5 * t + 4] == (partial ? 0xffu : kFull));
  }
}

__global__ void half_warp_masks_kernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x);
  int v = lane;
  if (lane < 16) {
    v = __shfl_xor_sync(0x0000ffffu, v, 1);
  } else {
    v = __shfl_xor_sync(0xffff0000u, v, 2);
  }
  out[lane] = v;
}

TEST_CASE("disjoint lane masks exchange independently", "[emu]") {
  std::vector<int> out(32, -1);
  ddp_emu::launch(half_warp_masks_kernel, dim3(1), dim3(32), nullptr, out.data());
  for (int l = 0; l < 32; ++l) CHECK(out[l] == (l < 16 ? l ^ 1 : l ^ 2));
}

// ----- faults ---------------------------------------------------------------------------------

const int kDivergentBarrierLine = __LINE__ + 4;
__global__ void early_return_kernel(int* out) {
  if (threadIdx.x < 5) return;
  out[threadIdx.x] = 1;
  __syncthreads();
}

__global__ void two_barriers_kernel() {
  if (threadIdx.x % 2) {
    __syncthreads();
  } else {
    __syncthreads();
  }
}

TEST_CASE("divergent __syncthreads throws KernelFault naming the line", "[emu]") {
  static std::vector<int> out(64);
  const std::string msg =
      fault_of([] { DDP_EMU_LAUNCH(early_return_kernel, dim3(2), dim3(64), nullptr, out.data()); });
  INFO(msg);
  CHECK_THAT(msg, Contains("kernel early_return_kernel, block (0,0,0), thread ("));
  CHECK_THAT(msg, Contains("__syncthreads()"));
  CHECK_THAT(msg, Contains("test_emulator.cpp:" + std::to_string(kDivergentBarrierLine)));

  const std::string msg2 =
      fault_of([] { ddp_emu::launch(two_barriers_kernel, dim3(1), dim3(32), nullptr); });
  INFO(msg2);
  CHECK_THAT(msg2, Contains("must meet at the same __syncthreads()"));
}

__global__ void throwing_kernel(int* out) {
  if (blockIdx.x == 2 && threadIdx.x == 3) throw std::runtime_error("boom");
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

TEST_CASE("an exception in a kernel becomes a KernelFault and releases the block", "[emu]") {
  static std::vector<int> out(4 * 128, 0);
  const std::string msg = fault_of([] {
    ddp_emu::launch_named("throwing_kernel", throwing_kernel, dim3(4), dim3(128), nullptr,
                          out.data());
  });
  INFO(msg);
  CHECK_THAT(msg, Contains("block (2,0,0), thread (3,0,0)"));
  CHECK_THAT(msg, Contains("std::runtime_error: boom"));
  CHECK(std::count(out.begin(), out.end(), 1) == 2 * 128);  // blocks 0 and 1 ran, 3 never did
  // The pool is healthy afterwards.
  std::vector<int> in(256, 2);
  CHECK(block_sums(1, 256, in) == std::vector<int>{512});
}

__global__ void returned_lanes_kernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (lane >= 16) return;
  out[lane] = __shfl_xor_sync(kFull, lane, 1);
}

__global__ void mixed_shuffles_kernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x);
  out[lane] = lane < 16 ? __shfl_xor_sync(kFull, lane, 1) : __shfl_down_sync(kFull, lane, 1);
}

__global__ void warp_waits_for_barrier_kernel(int* out) {
  const unsigned t = threadIdx.x;
  if (t == 0 || t >= 32) {
    __syncthreads();
  } else {
    out[t] = __shfl_xor_sync(kFull, static_cast<int>(t), 1);
  }
}

TEST_CASE("broken warp operations throw KernelFault instead of hanging", "[emu]") {
  static std::vector<int> out(64);
  const std::string returned = fault_of(
      [] { ddp_emu::launch(returned_lanes_kernel, dim3(1), dim3(32), nullptr, out.data()); });
  INFO(returned);
  CHECK_THAT(returned, Contains("__shfl_xor_sync()"));
  CHECK_THAT(returned, Contains("returned from the kernel"));

  const std::string mixed = fault_of(
      [] { ddp_emu::launch(mixed_shuffles_kernel, dim3(1), dim3(32), nullptr, out.data()); });
  INFO(mixed);
  CHECK_THAT(mixed, Contains("must meet at the same warp operation"));

  const std::string deadlock = fault_of([] {
    ddp_emu::launch(warp_waits_for_barrier_kernel, dim3(1), dim3(64), nullptr, out.data());
  });
  INFO(deadlock);
  CHECK_THAT(deadlock, Contains("deadlock"));
  CHECK_THAT(deadlock, Contains("__syncthreads()"));
}

__global__ void empty_kernel() {}

TEST_CASE("invalid configurations throw and set the last error once", "[emu]") {
  REQUIRE(cudaGetLastError() == cudaSuccess);
  const int64_t before = ddp_emu::launch_count();
  const std::string msg =
      fault_of([] { ddp_emu::launch(empty_kernel, dim3(1), dim3(2048), nullptr); });
  INFO(msg);
  CHECK_THAT(msg, Contains("invalid launch configuration"));
  CHECK_THAT(msg, Contains("2048"));
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(ddp_emu::launch_count() == before);

  const dim3 bad[][2] = {{dim3(1), dim3(1, 1, 65)},
                         {dim3(0), dim3(32)},
                         {dim3(1, 65536), dim3(32)},
                         {dim3(1), dim3(0)},
                         {dim3(1), dim3(2000, 1, 1)}};
  for (const auto& cfg : bad) {
    CHECK_THROWS_AS(ddp_emu::launch(empty_kernel, cfg[0], cfg[1], nullptr), ddp_emu::KernelFault);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  }
  ddp_emu::launch(empty_kernel, dim3(1, 65535, 1), dim3(1), nullptr);  // the largest allowed
  ddp_emu::launch(empty_kernel, dim3(1), dim3(1, 1, 64), nullptr);
  CHECK(cudaGetLastError() == cudaSuccess);

  CHECK_THROWS_AS(__syncthreads(), ddp_emu::KernelFault);  // outside a kernel
}

// ----- runtime ---------------------------------------------------------------------------------

TEST_CASE("cudaMalloc is aligned, poisoned and checked", "[emu]") {
  const int64_t live = ddp_emu::live_allocations();
  std::vector<void*> ptrs;
  for (size_t bytes : {size_t{1}, size_t{3}, size_t{100}, size_t{4097}}) {
    void* p = nullptr;
    REQUIRE(cudaMalloc(&p, bytes) == cudaSuccess);
    CHECK(reinterpret_cast<uintptr_t>(p) % 256 == 0);
    ptrs.push_back(p);
  }
  CHECK(ddp_emu::live_allocations() == live + 4);

  float* f = nullptr;
  REQUIRE(cudaMalloc(&f, 1000 * sizeof(float)) == cudaSuccess);
  std::vector<float> host(1000, 0.0f);
  REQUIRE(cudaMemcpy(host.data(), f, 1000 * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(std::all_of(host.begin(), host.end(), [](float v) { return std::isnan(v); }));

  int on_stack = 0;
  CHECK(cudaFree(&on_stack) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(cudaFree(f + 1) == cudaErrorInvalidValue);  // not the start of an allocation
  CHECK(cudaFreeHost(f) == cudaErrorInvalidValue);  // device memory, not pinned host memory
  CHECK(cudaFree(f) == cudaSuccess);
  CHECK(cudaFree(f) == cudaErrorInvalidValue);  // twice
  CHECK(cudaFree(nullptr) == cudaSuccess);
  cudaGetLastError();
  for (void* p : ptrs) CHECK(cudaFree(p) == cudaSuccess);
  CHECK(ddp_emu::live_allocations() == live);

  void* none = &on_stack;
  CHECK(cudaMalloc(&none, size_t{1} << 40) == cudaErrorMemoryAllocation);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);

  float* pinned = nullptr;
  double* pinned2 = nullptr;
  REQUIRE(cudaMallocHost(&pinned, 64 * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaHostAlloc(&pinned2, 16 * sizeof(double), cudaHostAllocDefault) == cudaSuccess);
  CHECK(ddp_emu::live_allocations() == live + 2);
  CHECK(cudaFree(pinned) == cudaErrorInvalidValue);
  cudaGetLastError();
  CHECK(cudaFreeHost(pinned) == cudaSuccess);
  CHECK(cudaFreeHost(pinned2) == cudaSuccess);
  CHECK(ddp_emu::live_allocations() == live);
}

TEST_CASE("cudaMemcpy and cudaMemset move bytes and reject wrong directions", "[emu]") {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  const size_t n = 300;
  std::vector<int> src(n), back(n, 0);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<int>(i * 3 + 1);
  int *a = nullptr, *b = nullptr;
  REQUIRE(cudaMalloc(&a, n * sizeof(int)) == cudaSuccess);
  REQUIRE(cudaMalloc(&b, n * sizeof(int)) == cudaSuccess);
  CHECK(cudaMemcpy(a, src.data(), n * sizeof(int), cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK(cudaMemcpyAsync(b, a, n * sizeof(int), cudaMemcpyDeviceToDevice, stream) == cudaSuccess);
  // A non-blocking stream: the legacy-stream copy below does not wait for it.
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(cudaMemcpy(back.data(), b, n * sizeof(int), cudaMemcpyDefault) == cudaSuccess);
  CHECK(back == src);

  CHECK(cudaMemsetAsync(b + 10, 0, 20 * sizeof(int), stream) == cudaSuccess);
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(cudaMemcpy(back.data(), b, n * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
  for (size_t i = 0; i < n; ++i) CHECK(back[i] == (i >= 10 && i < 30 ? 0 : src[i]));
  CHECK(cudaMemset(a, 0xFF, n * sizeof(int)) == cudaSuccess);
  CHECK(cudaMemcpy(back.data(), a, n * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(std::all_of(back.begin(), back.end(), [](int v) { return v == -1; }));

  // Wrong directions, overruns and host memory given to cudaMemset.
  CHECK(cudaMemcpy(back.data(), src.data(), 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(a, b, 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(back.data(), a, (n + 1) * sizeof(int), cudaMemcpyDeviceToHost) ==
        cudaErrorInvalidValue);
  CHECK(cudaMemcpy(a + 1, src.data(), n * sizeof(int), cudaMemcpyHostToDevice) ==
        cudaErrorInvalidValue);
  CHECK(cudaMemset(back.data(), 0, 4) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(a, src.data(), 4, static_cast<cudaMemcpyKind>(7)) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);

  CHECK(cudaFree(a) == cudaSuccess);
  CHECK(cudaFree(b) == cudaSuccess);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
  CHECK(cudaStreamDestroy(stream) == cudaErrorInvalidResourceHandle);
  CHECK(cudaMemsetAsync(nullptr, 0, 0, stream) == cudaErrorInvalidResourceHandle);
  CHECK_THROWS_AS(ddp_emu::launch(empty_kernel, dim3(1), dim3(1), stream), ddp_emu::KernelFault);
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
}

// CUDA's stream priorities: least 0, greatest negative (more urgent), clamped into that range.
TEST_CASE("stream priorities: the range, clamping, and the priority a stream keeps", "[emu]") {
  int least = 1, greatest = 1;
  REQUIRE(cudaDeviceGetStreamPriorityRange(&least, &greatest) == cudaSuccess);
  CHECK(least == 0);
  CHECK(greatest < 0);
  int only = 1;
  CHECK(cudaDeviceGetStreamPriorityRange(nullptr, &only) == cudaSuccess);
  CHECK(only == greatest);
  CHECK(cudaDeviceGetStreamPriorityRange(&only, nullptr) == cudaSuccess);
  CHECK(only == least);

  const std::pair<int, int> asked_got[] = {{greatest, greatest},
                                           {least, least},
                                           {greatest - 7, greatest},
                                           {least + 3, least},
                                           {greatest + 1, greatest + 1},
                                           {INT_MIN, greatest},
                                           {INT_MAX, least}};
  for (const auto& [asked, want] : asked_got) {
    INFO("priority " << asked);
    cudaStream_t s = nullptr;
    REQUIRE(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, asked) == cudaSuccess);
    int got = 99;
    CHECK(cudaStreamGetPriority(s, &got) == cudaSuccess);
    CHECK(got == want);
    REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
    CHECK(cudaStreamGetPriority(s, &got) == cudaErrorInvalidResourceHandle);
  }
  cudaStream_t plain = nullptr;
  REQUIRE(cudaStreamCreate(&plain) == cudaSuccess);
  int got = 99;
  CHECK(cudaStreamGetPriority(plain, &got) == cudaSuccess);
  CHECK(got == least);
  CHECK(cudaStreamGetPriority(nullptr, &got) == cudaSuccess);  // the legacy stream
  CHECK(got == least);
  CHECK(cudaStreamGetPriority(plain, nullptr) == cudaErrorInvalidValue);
  REQUIRE(cudaStreamDestroy(plain) == cudaSuccess);
  CHECK(cudaStreamCreateWithPriority(nullptr, cudaStreamDefault, greatest) ==
        cudaErrorInvalidValue);
  cudaStream_t bad = nullptr;
  CHECK(cudaStreamCreateWithPriority(&bad, 0x8, greatest) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("events measure host time between records", "[emu]") {
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr, untimed = nullptr, never = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  REQUIRE(cudaEventCreate(&start) == cudaSuccess);
  REQUIRE(cudaEventCreate(&stop) == cudaSuccess);
  REQUIRE(cudaEventCreate(&never) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming) == cudaSuccess);
  CHECK(cudaEventRecord(start, stream) == cudaSuccess);
  // The time of a record is when the stream gets there (in deferred mode, when it is run).
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(cudaEventRecord(stop) == cudaSuccess);
  CHECK(cudaEventRecord(untimed, stream) == cudaSuccess);
  CHECK(cudaStreamWaitEvent(stream, stop) == cudaSuccess);
  CHECK(cudaEventSynchronize(stop) == cudaSuccess);
  CHECK(cudaEventQuery(stop) == cudaSuccess);
  float ms = -1.0f;
  CHECK(cudaEventElapsedTime(&ms, start, stop) == cudaSuccess);
  CHECK(ms >= 4.0f);
  CHECK(cudaEventElapsedTime(&ms, start, untimed) == cudaErrorInvalidResourceHandle);
  CHECK(cudaEventElapsedTime(&ms, start, never) == cudaErrorInvalidResourceHandle);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  for (cudaEvent_t e : {start, stop, untimed, never}) CHECK(cudaEventDestroy(e) == cudaSuccess);
  CHECK(cudaEventDestroy(start) == cudaErrorInvalidResourceHandle);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
}

TEST_CASE("a kernel delay makes every kernel that much longer on the stream's clock", "[emu]") {
  cudaStream_t stream = nullptr;
  cudaEvent_t before = nullptr, after = nullptr;
  int* out = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  REQUIRE(cudaEventCreate(&before) == cudaSuccess);
  REQUIRE(cudaEventCreate(&after) == cudaSuccess);
  REQUIRE(cudaMalloc(&out, 4 * sizeof(int)) == cudaSuccess);
  // Two launches between the events: the stream's time between them, without and with a delay.
  const auto timed_pair = [&] {
    CHECK(cudaEventRecord(before, stream) == cudaSuccess);
    for (int i = 0; i < 2; ++i)
      ddp_emu::launch(per_thread_copy_kernel, dim3(1), dim3(4), stream, i, out);
    CHECK(cudaEventRecord(after, stream) == cudaSuccess);
    CHECK(cudaEventSynchronize(after) == cudaSuccess);
    float ms = -1.0f;
    CHECK(cudaEventElapsedTime(&ms, before, after) == cudaSuccess);
    return ms;
  };
  CHECK(ddp_emu::kernel_delay() == 0.0);
  const float plain = timed_pair();
  ddp_emu::set_kernel_delay(0.03);
  CHECK(ddp_emu::kernel_delay() == 0.03);
  const float slowed = timed_pair();
  ddp_emu::set_kernel_delay(0.0);
  INFO("two kernels: " << plain << " ms, with a 30 ms delay each " << slowed << " ms");
  CHECK(slowed >= 60.0f);  // each sleeps 30 ms after it ran: never less, whatever the load
  CHECK_THROWS(ddp_emu::set_kernel_delay(-0.5));
  CHECK(ddp_emu::kernel_delay() == 0.0);
  CHECK(cudaFree(out) == cudaSuccess);
  for (cudaEvent_t e : {before, after}) CHECK(cudaEventDestroy(e) == cudaSuccess);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("the emulated device reports one small device", "[emu]") {
  int count = 0, dev = -1, value = 0;
  CHECK(cudaGetDeviceCount(&count) == cudaSuccess);
  CHECK(count == 1);
  CHECK(cudaSetDevice(0) == cudaSuccess);
  CHECK(cudaGetDevice(&dev) == cudaSuccess);
  CHECK(dev == 0);
  CHECK(cudaSetDevice(1) == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  CHECK(std::strlen(prop.name) > 0);
  CHECK(prop.multiProcessorCount == 4);
  CHECK(prop.maxThreadsPerBlock == 1024);
  CHECK(prop.totalGlobalMem > 0);
  ddp_emu::set_sm_count(7);
  CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess);
  CHECK(value == 7);
  CHECK(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  CHECK(prop.multiProcessorCount == 7);
  ddp_emu::set_sm_count(4);
  for (cudaDeviceAttr a :
       {cudaDevAttrClockRate, cudaDevAttrMemoryClockRate, cudaDevAttrGlobalMemoryBusWidth}) {
    value = 0;
    CHECK(cudaDeviceGetAttribute(&value, a, 0) == cudaSuccess);
    CHECK(value > 0);
  }
  CHECK(std::string(cudaGetErrorName(cudaErrorInvalidValue)) == "cudaErrorInvalidValue");
  CHECK(std::string(cudaGetErrorString(cudaSuccess)) == "no error");
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("a 64 x 256 launch finishes in reasonable time", "[emu]") {
  const unsigned blocks = 64, threads = 256;
  std::vector<int> in(blocks * threads);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int>(i % 17);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int> sums = block_sums(blocks, threads, in);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("emulator: 64 blocks x 256 threads (9 barriers each) took %.3f s\n", seconds);
  CHECK(sums == reference_sums(blocks, threads, in));
  CHECK(seconds < 60.0);
}

// ----- serial schedules --------------------------------------------------------------------------

// A schedule for the scope of a test; the one before comes back.
class ScheduleScope {
 public:
  explicit ScheduleScope(ddp_emu::Schedule order, uint64_t seed = 1)
      : before_(ddp_emu::schedule()), seed_(ddp_emu::schedule_seed()) {
    ddp_emu::set_schedule(order, seed);
  }
  ~ScheduleScope() { ddp_emu::set_schedule(before_, seed_); }
  ScheduleScope(const ScheduleScope&) = delete;
  ScheduleScope& operator=(const ScheduleScope&) = delete;

 private:
  ddp_emu::Schedule before_;
  uint64_t seed_;
};

// Each thread notes its index in the order it gets there, before a barrier, after it, and after
// a shuffle: turns[0..n), turns[n..2n), turns[2n..3n).
__global__ void turns_kernel(int* turns, int* counters) {
  const int tid = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  turns[atomicAdd(&counters[0], 1)] = tid;
  __syncthreads();
  turns[n + atomicAdd(&counters[1], 1)] = tid;
  const int v = __shfl_xor_sync(kFull, tid, 1);
  turns[2 * n + atomicAdd(&counters[2], 1)] = v ^ 1;
}

std::vector<int> turns_of(ddp_emu::Schedule order, uint64_t seed, unsigned threads) {
  ScheduleScope scope(order, seed);
  std::vector<int> turns(3 * threads, -1);
  int counters[3] = {0, 0, 0};
  ddp_emu::launch(turns_kernel, dim3(1), dim3(threads), nullptr, turns.data(), counters);
  return turns;
}

std::vector<int> iota_of(int from, int to) {  // from, from±1, ..., to
  std::vector<int> v;
  for (int i = from; i != to; i += from < to ? 1 : -1) v.push_back(i);
  v.push_back(to);
  return v;
}

TEST_CASE("serial schedules: one thread at a time, in the schedule's order", "[emu][schedule]") {
  using ddp_emu::Schedule;
  const unsigned n = 64;
  auto part = [&](const std::vector<int>& t, unsigned k) {
    return std::vector<int>(t.begin() + k * n, t.begin() + (k + 1) * n);
  };
  // Forward: threads 0, 1, ... to the barrier; then each warp alone through its shuffle.
  const std::vector<int> fwd = turns_of(Schedule::kForward, 1, n);
  CHECK(part(fwd, 0) == iota_of(0, 63));
  CHECK(part(fwd, 1) == iota_of(0, 63));
  CHECK(part(fwd, 2) == iota_of(0, 63));
  const std::vector<int> rev = turns_of(Schedule::kReverse, 1, n);
  CHECK(part(rev, 0) == iota_of(63, 0));
  CHECK(part(rev, 1) == iota_of(63, 0));
  CHECK(part(rev, 2) == iota_of(63, 0));
  // Random: a permutation in each interval, the same for the same seed, another for another.
  const std::vector<int> a = turns_of(Schedule::kRandom, 7, n);
  for (unsigned k = 0; k < 3; ++k) {
    std::vector<int> sorted = part(a, k);
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == iota_of(0, 63));
  }
  CHECK(part(a, 0) != iota_of(0, 63));
  CHECK(part(a, 0) != part(a, 1));
  CHECK(turns_of(Schedule::kRandom, 7, n) == a);
  CHECK(turns_of(Schedule::kRandom, 8, n) != a);
  // Rotate: forward, reverse, random, forward, ... from the choice on.
  ScheduleScope rotate(Schedule::kRotate, 7);
  std::vector<std::vector<int>> rotated;
  for (int i = 0; i < 4; ++i) {
    std::vector<int> turns(3 * n, -1);
    int counters[3] = {0, 0, 0};
    ddp_emu::launch(turns_kernel, dim3(1), dim3(n), nullptr, turns.data(), counters);
    rotated.push_back(part(turns, 0));
  }
  CHECK(rotated[0] == iota_of(0, 63));
  CHECK(rotated[1] == iota_of(63, 0));
  CHECK(rotated[2] != iota_of(0, 63));
  CHECK(rotated[2] != iota_of(63, 0));
  CHECK(rotated[3] == iota_of(0, 63));
}

// Thread t writes slot t and reads slot t+1 (a neighbour in the block, or in the warp), with or
// without the barrier between.
template <bool kBarrier, bool kWarp>
__global__ void neighbour_kernel(int token, int* out) {
  __shared__ int slot[128];
  const unsigned t = threadIdx.x;
  slot[t] = token + static_cast<int>(t);
  if (kBarrier && kWarp) __syncwarp();
  if (kBarrier && !kWarp) __syncthreads();
  const unsigned u = kWarp ? (t & ~31u) | ((t + 1) & 31u) : (t + 1) % blockDim.x;
  out[t] = slot[u] - token - static_cast<int>(u);  // 0 when the neighbour had written
}

template <bool kBarrier, bool kWarp>
int stale_reads(ddp_emu::Schedule order, uint64_t seed = 1) {
  ScheduleScope scope(order, seed);
  const int token = 5000 + static_cast<int>(ddp_emu::launch_count()) * 1000;
  std::vector<int> out(128, -1);
  ddp_emu::launch(neighbour_kernel<kBarrier, kWarp>, dim3(1), dim3(128), nullptr, token,
                  out.data());
  return static_cast<int>(128 - std::count(out.begin(), out.end(), 0));
}

TEST_CASE("serial schedules: a missing __syncthreads or __syncwarp reads what was not written",
          "[emu][schedule]") {
  using ddp_emu::Schedule;
  for (Schedule order : {Schedule::kForward, Schedule::kReverse, Schedule::kRandom}) {
    INFO("schedule " << static_cast<int>(order));
    CHECK(stale_reads<true, false>(order) == 0);
    CHECK(stale_reads<true, true>(order) == 0);
  }
  // Forward: every thread but the last reads a neighbour that has not run yet (per warp: 31 of
  // 32); reverse: only the thread that wraps around.
  CHECK(stale_reads<false, false>(Schedule::kForward) == 127);
  CHECK(stale_reads<false, true>(Schedule::kForward) == 4 * 31);
  CHECK(stale_reads<false, false>(Schedule::kReverse) == 1);
  CHECK(stale_reads<false, true>(Schedule::kReverse) == 4);
  CHECK(stale_reads<false, false>(Schedule::kRandom) > 0);
  CHECK(stale_reads<false, true>(Schedule::kRandom) > 0);
}

TEST_CASE("serial schedules: rule violations and faults are still caught", "[emu][schedule]") {
  using ddp_emu::Schedule;
  for (Schedule order : {Schedule::kForward, Schedule::kReverse, Schedule::kRandom}) {
    ScheduleScope scope(order, 3);
    static std::vector<int> out(4 * 128);
    CHECK_THAT(fault_of([] { ddp_emu::launch(two_barriers_kernel, dim3(1), dim3(32), nullptr); }),
               Contains("must meet at the same __syncthreads()"));
    CHECK_THAT(fault_of([] {
                 ddp_emu::launch(early_return_kernel, dim3(2), dim3(64), nullptr, out.data());
               }),
               Contains("__syncthreads()"));
    CHECK_THAT(
        fault_of([] { ddp_emu::launch(throwing_kernel, dim3(4), dim3(128), nullptr, out.data()); }),
        Contains("std::runtime_error: boom"));
    CHECK_THAT(fault_of([] {
                 ddp_emu::launch(warp_waits_for_barrier_kernel, dim3(1), dim3(64), nullptr,
                                 out.data());
               }),
               Contains("deadlock"));
    // The block's threads are released after a fault: the next launch runs normally.
    const unsigned blocks = 4, threads = 256;
    std::vector<int> in(blocks * threads);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int>(i % 13) - 6;
    CHECK(block_sums(blocks, threads, in) == reference_sums(blocks, threads, in));
  }
}

TEST_CASE("parse_schedule accepts the schedules and refuses anything else", "[emu][schedule]") {
  using ddp_emu::Schedule;
  uint64_t seed = 0;
  CHECK(ddp_emu::parse_schedule(nullptr, &seed) == Schedule::kParallel);
  CHECK(ddp_emu::parse_schedule("", &seed) == Schedule::kParallel);
  CHECK(ddp_emu::parse_schedule("parallel", &seed) == Schedule::kParallel);
  CHECK(ddp_emu::parse_schedule("forward", &seed) == Schedule::kForward);
  CHECK(ddp_emu::parse_schedule("reverse", &seed) == Schedule::kReverse);
  CHECK(ddp_emu::parse_schedule("random", &seed) == Schedule::kRandom);
  CHECK(seed == 1);
  CHECK(ddp_emu::parse_schedule("random:42", &seed) == Schedule::kRandom);
  CHECK(seed == 42);
  CHECK(ddp_emu::parse_schedule("rotate", &seed) == Schedule::kRotate);
  for (const char* bad : {"fowrard", "random:", "random:x", "Random", "random:-1"}) {
    INFO(bad);
    CHECK_THROWS_WITH(ddp_emu::parse_schedule(bad, &seed), Contains("is not a schedule"));
  }
}

// ----- deferred streams -------------------------------------------------------------------------

using ddp_emu_test::DeferredStreams;

// A device array of floats with host-side helpers that go through the legacy default stream.
class DeviceFloats {
 public:
  explicit DeviceFloats(int n) : n_(n) {
    REQUIRE(cudaMalloc(&p_, n * sizeof(float)) == cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(p_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* get() const { return p_; }
  int size() const { return n_; }
  std::vector<float> read() const {
    std::vector<float> v(static_cast<size_t>(n_));
    REQUIRE(cudaMemcpy(v.data(), p_, v.size() * sizeof(float), cudaMemcpyDeviceToHost) ==
            cudaSuccess);
    return v;
  }

 private:
  int n_;
  float* p_ = nullptr;
};

bool all_equal(const std::vector<float>& v, float x) {
  return std::all_of(v.begin(), v.end(), [x](float y) { return y == x; });
}
bool all_nan(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float y) { return std::isnan(y); });
}

__global__ void fill_kernel(float* x, int n, float v) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] = v;
}

__global__ void scale_kernel(const float* x, float* y, int n, float f) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] = x[i] * f;
}

// One entry per launch: the order in which launches ran.
__global__ void append_kernel(int* log, int* count, int v) {
  if (threadIdx.x == 0) log[atomicAdd(count, 1)] = v;
}

struct Payload {
  int values[4];
};

__global__ void payload_kernel(Payload p, int* out) {
  if (threadIdx.x < 4) out[threadIdx.x] = p.values[threadIdx.x];
}

void fill(const DeviceFloats& d, float v, cudaStream_t s) {
  ddp_emu::launch(fill_kernel, dim3((d.size() + 63) / 64), dim3(64), s, d.get(), d.size(), v);
}

cudaStream_t make_stream(unsigned flags) {
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, flags) == cudaSuccess);
  return s;
}

cudaEvent_t make_event(unsigned flags = cudaEventDefault) {
  cudaEvent_t e = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&e, flags) == cudaSuccess);
  return e;
}

TEST_CASE("deferred mode: a stream runs its operations in order when synchronised",
          "[emu][deferred]") {
  DeferredStreams deferred;
  cudaStream_t s = make_stream(cudaStreamNonBlocking);
  std::vector<int> log(8, -1);
  int count = 0;
  const int64_t launches = ddp_emu::launch_count();
  for (int v = 1; v <= 3; ++v)
    ddp_emu::launch(append_kernel, dim3(1), dim3(32), s, log.data(), &count, v);
  CHECK(ddp_emu::queued_operations(s) == 3);
  CHECK(ddp_emu::launch_count() == launches);  // nothing ran yet
  CHECK(count == 0);

  // Arguments are taken at the launch: a temporary payload is gone before the kernel runs.
  std::vector<int> out(4, 0);
  {
    Payload p{{7, 8, 9, 10}};
    ddp_emu::launch(payload_kernel, dim3(1), dim3(32), s, p, out.data());
    p.values[0] = -1;
  }
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(ddp_emu::queued_operations(s) == 0);
  CHECK(ddp_emu::launch_count() == launches + 4);
  CHECK(count == 3);
  CHECK(std::vector<int>(log.begin(), log.begin() + 3) == std::vector<int>{1, 2, 3});
  CHECK(out == std::vector<int>{7, 8, 9, 10});

  // Copies and memsets keep their place in the queue.
  DeviceFloats d(100);
  float* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, 100 * sizeof(float)) == cudaSuccess);
  std::fill(pinned, pinned + 100, -5.0f);
  fill(d, 1.0f, s);
  REQUIRE(cudaMemsetAsync(d.get(), 0, 50 * sizeof(float), s) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(pinned, d.get(), 100 * sizeof(float), cudaMemcpyDeviceToHost, s) ==
          cudaSuccess);
  CHECK(ddp_emu::queued_operations(s) == 3);
  CHECK(pinned[0] == -5.0f);  // a read without a synchronisation sees the old contents
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(pinned[0] == 0.0f);
  CHECK(pinned[49] == 0.0f);
  CHECK(pinned[50] == 1.0f);
  CHECK(pinned[99] == 1.0f);
  CHECK(cudaFreeHost(pinned) == cudaSuccess);
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
}

// A producer fills x on one stream; a consumer computes y = 2x on another. With the wait the
// consumer sees the producer's values; without it, what the memory held before (NaN).
std::vector<float> produce_consume(bool wait) {
  cudaStream_t producer = make_stream(cudaStreamNonBlocking);
  cudaStream_t consumer = make_stream(cudaStreamNonBlocking);
  cudaEvent_t produced = make_event(cudaEventDisableTiming);
  DeviceFloats x(200), y(200);
  fill(x, 3.0f, producer);
  REQUIRE(cudaEventRecord(produced, producer) == cudaSuccess);
  if (wait) REQUIRE(cudaStreamWaitEvent(consumer, produced, 0) == cudaSuccess);
  ddp_emu::launch(scale_kernel, dim3(4), dim3(64), consumer, x.get(), y.get(), 200, 2.0f);
  REQUIRE(cudaStreamSynchronize(consumer) == cudaSuccess);
  std::vector<float> out = y.read();
  REQUIRE(cudaEventDestroy(produced) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(producer) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(consumer) == cudaSuccess);
  return out;
}

TEST_CASE("deferred mode: a missing cudaStreamWaitEvent reads stale data", "[emu][deferred]") {
  {
    DeferredStreams deferred;
    CHECK(all_equal(produce_consume(true), 6.0f));
    CHECK(all_nan(produce_consume(false)));  // the bug the mode is for
  }
  // Immediate mode runs everything at the call, so the same bug goes unnoticed there.
  const ddp_emu::StreamMode before = ddp_emu::stream_mode();
  ddp_emu::set_stream_mode(ddp_emu::StreamMode::kImmediate);
  const std::vector<float> hidden = produce_consume(false);
  ddp_emu::set_stream_mode(before);
  CHECK(all_equal(hidden, 6.0f));
}

TEST_CASE("deferred mode: a wait runs the other stream up to the record it captured",
          "[emu][deferred]") {
  DeferredStreams deferred;
  cudaStream_t a = make_stream(cudaStreamNonBlocking);
  cudaStream_t b = make_stream(cudaStreamNonBlocking);
  cudaEvent_t e = make_event();
  DeviceFloats x(64), y(64), z(64);
  fill(x, 1.0f, a);
  REQUIRE(cudaEventRecord(e, a) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);  // captures this record of e
  fill(x, 5.0f, a);                                      // after the record: b must not see it
  REQUIRE(cudaEventRecord(e, a) == cudaSuccess);         // re-recorded: b still waits for #1
  ddp_emu::launch(scale_kernel, dim3(1), dim3(64), b, x.get(), y.get(), 64, 10.0f);
  fill(z, 2.0f, a);
  CHECK(ddp_emu::queued_operations(a) == 5);
  CHECK(ddp_emu::queued_operations(b) == 2);
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  CHECK(all_equal(y.read(), 10.0f));
  CHECK(ddp_emu::queued_operations(a) == 3);  // only what b depended on ran
  CHECK(all_nan(z.read()));

  // Waits chain: c waits for b, whose queue waits for a.
  cudaStream_t c = make_stream(cudaStreamNonBlocking);
  cudaEvent_t f = make_event();
  REQUIRE(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);  // the second record of e
  ddp_emu::launch(scale_kernel, dim3(1), dim3(64), b, x.get(), y.get(), 64, 10.0f);
  REQUIRE(cudaEventRecord(f, b) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(c, f, 0) == cudaSuccess);
  ddp_emu::launch(scale_kernel, dim3(1), dim3(64), c, y.get(), z.get(), 64, 0.5f);
  REQUIRE(cudaStreamSynchronize(c) == cudaSuccess);
  CHECK(all_equal(z.read(), 25.0f));
  CHECK(ddp_emu::queued_operations(a) == 1);  // the fill of z after the second record

  // A wait on an event that was never recorded (or whose record ran) queues nothing.
  cudaEvent_t never = make_event();
  REQUIRE(cudaStreamWaitEvent(c, never, 0) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(c, f, 0) == cudaSuccess);
  CHECK(ddp_emu::queued_operations(c) == 0);

  for (cudaEvent_t ev : {e, f, never}) REQUIRE(cudaEventDestroy(ev) == cudaSuccess);
  for (cudaStream_t st : {a, b, c}) REQUIRE(cudaStreamDestroy(st) == cudaSuccess);
}

TEST_CASE("deferred mode: the device runs what waited longer than the device lag",
          "[emu][deferred]") {
  DeferredStreams deferred(0.05);
  cudaStream_t a = make_stream(cudaStreamNonBlocking);
  cudaStream_t b = make_stream(cudaStreamNonBlocking);
  cudaEvent_t e = make_event();
  DeviceFloats x(64), y(64);
  const auto t0 = std::chrono::steady_clock::now();
  fill(x, 1.0f, a);
  REQUIRE(cudaEventRecord(e, a) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);
  ddp_emu::launch(scale_kernel, dim3(1), dim3(64), b, x.get(), y.get(), 64, 10.0f);
  // Nothing here synchronises: only the device's own thread can run these, in stream order.
  CHECK(ddp_emu_test::drained_within(10, {a, b}));
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(50));
  CHECK(all_equal(y.read(), 10.0f));

  // A host polling an event while the device is busy with its stream sees "not ready" at once,
  // and the event once the device got past it.
  std::atomic<bool> release{false}, started{false};
  REQUIRE(ddp_emu::enqueue_host_work(a, [&] {
    started = true;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }));
  REQUIRE(cudaEventRecord(e, a) == cudaSuccess);
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  for (int k = 0; k < 3; ++k) {
    CHECK(cudaEventQuery(e) == cudaErrorNotReady);
    CHECK(cudaGetLastError() == cudaErrorNotReady);
  }
  release = true;
  CHECK(ddp_emu_test::drained_within(10, {a}));
  CHECK(cudaEventQuery(e) == cudaSuccess);

  // Never: what the host does not synchronise on stays queued.
  ddp_emu::set_device_lag(std::numeric_limits<double>::infinity());
  fill(x, 2.0f, a);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(ddp_emu::queued_operations(a) == 1);
  REQUIRE(cudaStreamSynchronize(a) == cudaSuccess);
  CHECK(all_equal(x.read(), 2.0f));
  REQUIRE(cudaEventDestroy(e) == cudaSuccess);
  for (cudaStream_t st : {a, b}) REQUIRE(cudaStreamDestroy(st) == cudaSuccess);
}

TEST_CASE("deferred mode: the legacy stream waits for blocking streams, not non-blocking ones",
          "[emu][deferred]") {
  DeferredStreams deferred;
  cudaStream_t blocking = make_stream(cudaStreamDefault);
  cudaStream_t nonblocking = make_stream(cudaStreamNonBlocking);
  DeviceFloats a(64), b(64);

  SECTION("a synchronous copy") {
    fill(a, 1.0f, blocking);
    fill(b, 2.0f, nonblocking);
    CHECK(all_equal(a.read(), 1.0f));
    CHECK(all_nan(b.read()));
    CHECK(ddp_emu::queued_operations(nonblocking) == 1);
  }
  SECTION("a launch on stream 0") {
    fill(a, 1.0f, blocking);
    fill(b, 2.0f, nonblocking);
    float* out = nullptr;
    REQUIRE(cudaMallocHost(&out, 64 * sizeof(float)) == cudaSuccess);
    ddp_emu::launch(scale_kernel, dim3(1), dim3(64), nullptr, a.get(), out, 64, 3.0f);
    CHECK(out[0] == 3.0f);  // ran at the call, after the blocking stream's fill
    CHECK(ddp_emu::queued_operations(nonblocking) == 1);
    CHECK(cudaFreeHost(out) == cudaSuccess);  // synchronises the device
    CHECK(ddp_emu::queued_operations(nonblocking) == 0);
  }
  SECTION("cudaMemset, cudaStreamSynchronize(0) and cudaEventRecord on stream 0") {
    fill(a, 1.0f, blocking);
    fill(b, 2.0f, nonblocking);
    REQUIRE(cudaMemset(a.get(), 0, sizeof(float)) == cudaSuccess);
    CHECK(ddp_emu::queued_operations(blocking) == 0);
    fill(a, 4.0f, blocking);
    REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
    CHECK(ddp_emu::queued_operations(blocking) == 0);
    fill(a, 5.0f, blocking);
    cudaEvent_t e = make_event();
    REQUIRE(cudaEventRecord(e, nullptr) == cudaSuccess);
    CHECK(ddp_emu::queued_operations(blocking) == 0);
    CHECK(cudaEventQuery(e) == cudaSuccess);
    CHECK(ddp_emu::queued_operations(nonblocking) == 1);
    REQUIRE(cudaEventDestroy(e) == cudaSuccess);
  }
  SECTION("stream 0 waiting for an event of a non-blocking stream") {
    fill(b, 2.0f, nonblocking);
    cudaEvent_t e = make_event();
    REQUIRE(cudaEventRecord(e, nonblocking) == cudaSuccess);
    fill(b, 7.0f, nonblocking);
    REQUIRE(cudaStreamWaitEvent(nullptr, e, 0) == cudaSuccess);
    CHECK(ddp_emu::queued_operations(nonblocking) == 1);  // ran up to the record only
    CHECK(all_equal(b.read(), 2.0f));
    REQUIRE(cudaEventDestroy(e) == cudaSuccess);
  }
  CHECK(ddp_emu::queued_operations(nullptr) == 0);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(ddp_emu::queued_operations(nonblocking) == 0);
  REQUIRE(cudaStreamDestroy(blocking) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(nonblocking) == cudaSuccess);
}

TEST_CASE("deferred mode: event query, synchronize and elapsed time", "[emu][deferred]") {
  DeferredStreams deferred;
  REQUIRE(cudaGetLastError() == cudaSuccess);
  cudaStream_t s = make_stream(cudaStreamNonBlocking);
  cudaEvent_t start = make_event(), stop = make_event();
  DeviceFloats x(64);
  REQUIRE(cudaEventRecord(start, s) == cudaSuccess);
  fill(x, 1.0f, s);
  REQUIRE(cudaEventRecord(stop, s) == cudaSuccess);
  float ms = -1.0f;
  CHECK(cudaEventElapsedTime(&ms, start, stop) == cudaErrorNotReady);
  CHECK(cudaGetLastError() == cudaErrorNotReady);

  // A polling loop sees "not ready" once, and the query ran the work.
  int polls = 0;
  while (cudaEventQuery(stop) == cudaErrorNotReady) {
    CHECK(cudaGetLastError() == cudaErrorNotReady);  // a result to clear, as callers do
    ++polls;
    REQUIRE(polls < 5);
  }
  CHECK(polls == 1);
  CHECK(all_equal(x.read(), 1.0f));
  CHECK(cudaEventElapsedTime(&ms, start, stop) == cudaSuccess);
  CHECK(ms >= 0.0f);

  // cudaEventSynchronize runs the stream up to the record and no further.
  fill(x, 2.0f, s);
  REQUIRE(cudaEventRecord(stop, s) == cudaSuccess);
  fill(x, 3.0f, s);
  CHECK(cudaEventSynchronize(stop) == cudaSuccess);
  CHECK(all_equal(x.read(), 2.0f));
  CHECK(ddp_emu::queued_operations(s) == 1);
  CHECK(cudaEventQuery(stop) == cudaSuccess);

  // A record superseded before it ran does not set the event's time when it runs late.
  cudaEvent_t late = make_event();
  REQUIRE(cudaEventRecord(late, s) == cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  REQUIRE(cudaEventRecord(late, nullptr) == cudaSuccess);
  REQUIRE(cudaEventRecord(stop, nullptr) == cudaSuccess);
  CHECK(cudaEventQuery(late) == cudaSuccess);  // the most recent record is the one that counts
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);  // runs the old record of `late`
  CHECK(cudaEventElapsedTime(&ms, late, stop) == cudaSuccess);
  CHECK(ms >= 0.0f);
  CHECK(ms < 20.0f);

  // An event never recorded is complete; one destroyed with its record queued is forgotten.
  cudaEvent_t never = make_event();
  CHECK(cudaEventQuery(never) == cudaSuccess);
  CHECK(cudaEventSynchronize(never) == cudaSuccess);
  CHECK(cudaEventElapsedTime(&ms, never, stop) == cudaErrorInvalidResourceHandle);
  cudaEvent_t gone = make_event();
  REQUIRE(cudaEventRecord(gone, s) == cudaSuccess);
  REQUIRE(cudaEventDestroy(gone) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);  // from the elapsed time above
  CHECK(cudaGetLastError() == cudaSuccess);

  for (cudaEvent_t e : {start, stop, late, never}) REQUIRE(cudaEventDestroy(e) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

// A device never makes the host wait in a query: while one thread runs a stream (here, host
// work that blocks until released, as a collective waiting for its peers does), a query of a
// record behind it answers "not ready" at once instead of waiting for that thread.
TEST_CASE("deferred mode: an event query does not wait while another thread runs its stream",
          "[emu][deferred]") {
  DeferredStreams deferred;
  cudaStream_t s = make_stream(cudaStreamNonBlocking);
  cudaEvent_t after = make_event();
  std::atomic<bool> started{false}, release{false};
  REQUIRE(ddp_emu::enqueue_host_work(s, [&] {
    started = true;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }));
  REQUIRE(cudaEventRecord(after, s) == cudaSuccess);
  std::thread runner([s] { (void)cudaStreamSynchronize(s); });
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    CHECK(cudaEventQuery(after) == cudaErrorNotReady);
    CHECK(cudaGetLastError() == cudaErrorNotReady);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
  release = true;
  runner.join();
  CHECK(cudaEventQuery(after) == cudaSuccess);
  REQUIRE(cudaEventDestroy(after) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("deferred mode: threads queue and synchronise the same streams concurrently",
          "[emu][deferred]") {
  DeferredStreams deferred;
  cudaStream_t s = make_stream(cudaStreamDefault);
  cudaStream_t t = make_stream(cudaStreamNonBlocking);
  const int n = 300;
  std::vector<int> log(n, -1);
  int count = 0;
  std::vector<cudaEvent_t> events(n);
  for (cudaEvent_t& e : events) e = make_event(cudaEventDisableTiming);
  std::atomic<int> issued{0};
  std::atomic<int> errors{0};
  // The issuer queues launches and records; a stream t waits for s every few launches.
  std::thread issuer([&] {
    for (int i = 0; i < n; ++i) {
      ddp_emu::launch(append_kernel, dim3(1), dim3(32), s, log.data(), &count, i);
      if (cudaEventRecord(events[i], s) != cudaSuccess) ++errors;
      if (i % 10 == 0 && cudaStreamWaitEvent(t, events[i], 0) != cudaSuccess) ++errors;
      issued.store(i + 1);
    }
  });
  // Two drainers: one synchronises events of s (the comm thread's pattern), one stream t and
  // the legacy stream.
  std::thread by_event([&] {
    for (int i = 0; i < n; i += 7) {
      while (issued.load() <= i) std::this_thread::yield();
      if (cudaEventSynchronize(events[i]) != cudaSuccess) ++errors;
      if (__atomic_load_n(&count, __ATOMIC_SEQ_CST) <= i) ++errors;
    }
  });
  std::thread by_stream([&] {
    while (issued.load() < n) {
      if (cudaStreamSynchronize(t) != cudaSuccess) ++errors;
      if (cudaStreamSynchronize(nullptr) != cudaSuccess) ++errors;
    }
  });
  issuer.join();
  by_event.join();
  by_stream.join();
  CHECK(errors.load() == 0);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(count == n);
  bool ordered = true;
  for (int i = 0; i < n; ++i) ordered = ordered && log[i] == i;
  CHECK(ordered);

  // Two threads waiting for the same slow record: the kernel runs once, both return after it.
  std::vector<int> seen(32, -1), slow_log(1, -1);
  int slow_count = 0;
  ddp_emu::launch(barrier_visibility_kernel, dim3(1), dim3(32), s, 5, seen.data());
  ddp_emu::launch(append_kernel, dim3(1), dim3(32), s, slow_log.data(), &slow_count, 9);
  REQUIRE(cudaEventRecord(events[0], s) == cudaSuccess);
  const int64_t launches = ddp_emu::launch_count();
  std::thread first([&] {
    if (cudaEventSynchronize(events[0]) != cudaSuccess || slow_count != 1) ++errors;
  });
  std::thread second([&] {
    if (cudaEventSynchronize(events[0]) != cudaSuccess || slow_count != 1) ++errors;
  });
  first.join();
  second.join();
  CHECK(errors.load() == 0);
  CHECK(ddp_emu::launch_count() == launches + 2);
  CHECK(seen[31] == 5);
  CHECK(slow_log[0] == 9);

  for (cudaEvent_t e : events) REQUIRE(cudaEventDestroy(e) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(t) == cudaSuccess);
}

TEST_CASE("deferred mode: a fault in a queued kernel is an asynchronous error", "[emu][deferred]") {
  DeferredStreams deferred;
  REQUIRE(cudaGetLastError() == cudaSuccess);
  cudaStream_t s = make_stream(cudaStreamNonBlocking);
  static std::vector<int> out(64);
  // Launch errors still surface at the call and queue nothing.
  CHECK_THROWS_AS(ddp_emu::launch(empty_kernel, dim3(1), dim3(2048), s), ddp_emu::KernelFault);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(ddp_emu::queued_operations(s) == 0);

  DDP_EMU_LAUNCH(early_return_kernel, dim3(2), dim3(64), s, out.data());  // queued: no throw
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaErrorLaunchFailure);
  const std::string fault = ddp_emu::last_deferred_fault();
  INFO(fault);
  CHECK_THAT(fault, Contains("kernel early_return_kernel, block (0,0,0), thread ("));
  CHECK_THAT(fault, Contains("test_emulator.cpp:" + std::to_string(kDivergentBarrierLine)));
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);  // the call's result, as in CUDA
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);  // returned once

  // Run by a query, it surfaces at the next cudaGetLastError (the check after every launch),
  // and the stream goes on with what follows.
  static std::vector<int> wide(4 * 128);
  ddp_emu::launch(throwing_kernel, dim3(4), dim3(128), s, wide.data());
  DeviceFloats x(64);
  fill(x, 1.0f, s);
  cudaEvent_t e = make_event();
  REQUIRE(cudaEventRecord(e, s) == cudaSuccess);
  CHECK(cudaEventQuery(e) == cudaErrorNotReady);
  CHECK(cudaGetLastError() == cudaErrorNotReady);
  CHECK(cudaPeekAtLastError() == cudaErrorLaunchFailure);
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK_THAT(ddp_emu::last_deferred_fault(), Contains("std::runtime_error: boom"));
  CHECK(all_equal(x.read(), 1.0f));

  // Host work queued by a library (the NCCL emulation's collectives) that throws.
  CHECK(ddp_emu::enqueue_host_work(s, [] { throw std::runtime_error("host work failed"); }));
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  CHECK_THAT(ddp_emu::last_deferred_fault(), Contains("host work failed"));
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  CHECK(cudaEventSynchronize(e) == cudaSuccess);

  REQUIRE(cudaEventDestroy(e) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("deferred mode: which host memory async copies read, and when", "[emu][deferred]") {
  DeferredStreams deferred;
  cudaStream_t s = make_stream(cudaStreamNonBlocking);
  DeviceFloats d(8);
  // Pageable source: staged at the call, so rewriting it afterwards is safe.
  std::vector<float> pageable(8, 1.0f);
  REQUIRE(cudaMemcpyAsync(d.get(), pageable.data(), 8 * sizeof(float), cudaMemcpyHostToDevice, s) ==
          cudaSuccess);
  std::fill(pageable.begin(), pageable.end(), 2.0f);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(all_equal(d.read(), 1.0f));

  // Pinned source (allocated or registered): read when the copy runs, so rewriting it before
  // the stream got there is a bug that shows.
  float* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, 8 * sizeof(float)) == cudaSuccess);
  std::fill(pinned, pinned + 8, 3.0f);
  REQUIRE(cudaMemcpyAsync(d.get(), pinned, 8 * sizeof(float), cudaMemcpyHostToDevice, s) ==
          cudaSuccess);
  std::fill(pinned, pinned + 8, 4.0f);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(all_equal(d.read(), 4.0f));
  std::vector<float> registered(16, 5.0f);
  REQUIRE(cudaHostRegister(registered.data(), 16 * sizeof(float), cudaHostRegisterDefault) ==
          cudaSuccess);
  REQUIRE(cudaMemcpyAsync(d.get(), registered.data() + 8, 8 * sizeof(float), cudaMemcpyHostToDevice,
                          s) == cudaSuccess);
  std::fill(registered.begin(), registered.end(), 6.0f);
  // Unregistering synchronises the device, so the copy runs first.
  REQUIRE(cudaHostUnregister(registered.data()) == cudaSuccess);
  CHECK(ddp_emu::queued_operations(s) == 0);
  CHECK(all_equal(d.read(), 6.0f));

  // Host to host runs at the call, behind the stream's queued work.
  fill(d, 7.0f, s);
  REQUIRE(cudaMemcpyAsync(pinned, d.get(), 8 * sizeof(float), cudaMemcpyDeviceToHost, s) ==
          cudaSuccess);
  std::vector<float> copy(8, 0.0f);
  REQUIRE(cudaMemcpyAsync(copy.data(), pinned, 8 * sizeof(float), cudaMemcpyHostToHost, s) ==
          cudaSuccess);
  CHECK(all_equal(copy, 7.0f));

  // Bad arguments are refused at the call; nothing is queued.
  REQUIRE(cudaGetLastError() == cudaSuccess);
  CHECK(cudaMemcpyAsync(d.get(), pinned, 9 * sizeof(float), cudaMemcpyHostToDevice, s) ==
        cudaErrorInvalidValue);
  CHECK(cudaMemcpyAsync(pinned, d.get(), 4, static_cast<cudaMemcpyKind>(9), s) ==
        cudaErrorInvalidValue);
  CHECK(cudaMemsetAsync(pinned, 0, 4, s) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaMemcpyAsync(d.get(), pinned, 0, cudaMemcpyHostToDevice, s) == cudaSuccess);
  CHECK(cudaMemsetAsync(d.get(), 0, 0, s) == cudaSuccess);
  CHECK(ddp_emu::queued_operations(s) == 0);

  // Freeing memory synchronises the device: the queued memset runs first.
  float* scratch = nullptr;
  REQUIRE(cudaMalloc(&scratch, 64) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(scratch, 0, 64, s) == cudaSuccess);
  CHECK(cudaFree(scratch) == cudaSuccess);
  CHECK(ddp_emu::queued_operations(s) == 0);
  REQUIRE(cudaMemsetAsync(d.get(), 0, 8 * sizeof(float), s) == cudaSuccess);
  CHECK(cudaFreeHost(pinned) == cudaSuccess);
  CHECK(ddp_emu::queued_operations(s) == 0);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("deferred mode: destroying a stream or leaving the mode runs what is queued",
          "[emu][deferred]") {
  DeviceFloats x(64);
  {
    DeferredStreams deferred;
    CHECK(ddp_emu::stream_mode() == ddp_emu::StreamMode::kDeferred);
    cudaStream_t s = make_stream(cudaStreamNonBlocking);
    fill(x, 1.0f, s);
    CHECK(ddp_emu::queued_operations(s) == 1);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    CHECK(all_equal(x.read(), 1.0f));
    CHECK(ddp_emu::queued_operations(s) == -1);
    CHECK(cudaStreamDestroy(s) == cudaErrorInvalidResourceHandle);
    CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);

    cudaStream_t t = make_stream(cudaStreamNonBlocking);
    fill(x, 2.0f, t);
    ddp_emu::set_stream_mode(ddp_emu::StreamMode::kImmediate);
    CHECK(ddp_emu::queued_operations(t) == 0);
    CHECK(all_equal(x.read(), 2.0f));
    fill(x, 3.0f, t);  // immediate now: runs at the call
    CHECK(all_equal(x.read(), 3.0f));
    CHECK(ddp_emu::enqueue_host_work(t, [] {}) == false);
    REQUIRE(cudaStreamDestroy(t) == cudaSuccess);
  }
  CHECK(ddp_emu::parse_stream_mode(nullptr) == ddp_emu::StreamMode::kImmediate);
  CHECK(ddp_emu::parse_stream_mode("") == ddp_emu::StreamMode::kImmediate);
  CHECK(ddp_emu::parse_stream_mode("immediate") == ddp_emu::StreamMode::kImmediate);
  CHECK(ddp_emu::parse_stream_mode("deferred") == ddp_emu::StreamMode::kDeferred);
  CHECK_THROWS_WITH(ddp_emu::parse_stream_mode("Deferred"),
                    Contains("DDP_EMU_STREAMS='Deferred' is not a stream mode"));
  CHECK(ddp_emu::parse_device_lag(nullptr) == 2.0);
  CHECK(ddp_emu::parse_device_lag("") == 2.0);
  CHECK(ddp_emu::parse_device_lag("0") == 0.0);
  CHECK(ddp_emu::parse_device_lag("0.25") == 0.25);
  CHECK(std::isinf(ddp_emu::parse_device_lag("never")));
  for (const char* bad : {"-1", "soon", "1s", "nan", "inf", "2e6"}) {
    CHECK_THROWS_WITH(ddp_emu::parse_device_lag(bad),
                      Contains(std::string("DDP_EMU_DEVICE_LAG_S='") + bad + "' is not a number"));
  }
  CHECK_THROWS(ddp_emu::set_device_lag(-1.0));
}

// ----- the environment and process exit, in a fresh process -------------------------------------

constexpr char kExitChild[] = "deferred work queued at exit";
constexpr char kModeChild[] = "the stream mode of this process";
constexpr char kLagChild[] = "the device lag of this process";
constexpr char kReadPastEndChild[] = "a kernel reads past the end of a device allocation";
constexpr char kScheduleChild[] = "the thread schedule of this process";

// Runs this test binary again with only `test` (a hidden test case below) and `env` set; returns
// the exit status and what it wrote to stderr and stdout.
int run_child(const char* test, const char* env, std::string* output) {
  int pipefd[2];
  REQUIRE(pipe(pipefd) == 0);
  std::fflush(nullptr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    close(pipefd[0]);
    close(pipefd[1]);
    if (env != nullptr) {
      putenv(const_cast<char*>(env));
    } else {
      unsetenv("DDP_EMU_STREAMS");
      unsetenv("DDP_EMU_SCHEDULE");
    }
    execl("/proc/self/exe", "ddp_cuda_emu_tests", test, static_cast<char*>(nullptr));
    _exit(127);
  }
  close(pipefd[1]);
  char buf[4096];
  ssize_t got;
  while ((got = read(pipefd[0], buf, sizeof buf)) > 0)
    output->append(buf, static_cast<size_t>(got));
  close(pipefd[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return status;
}

__global__ void announce_kernel(int token) {
  if (threadIdx.x == 0) std::printf("queued kernel %d ran\n", token);
}

TEST_CASE(kExitChild, "[.emu_child]") {
  // Queued kernels that would announce themselves; the process ends before anything runs them
  // (nor the device's own thread, however long the exit takes).
  ddp_emu::set_device_lag(std::numeric_limits<double>::infinity());
  cudaStream_t s = make_stream(cudaStreamNonBlocking);
  ddp_emu::launch(announce_kernel, dim3(1), dim3(32), s, 1);
  ddp_emu::launch(announce_kernel, dim3(1), dim3(32), s, 2);
  std::printf("queued %lld\n", static_cast<long long>(ddp_emu::queued_operations(s)));
}

TEST_CASE(kLagChild, "[.emu_child]") {
  std::printf("lag %g\n", ddp_emu::device_lag());
}

TEST_CASE(kModeChild, "[.emu_child]") {
  std::printf("mode %s\n",
              ddp_emu::stream_mode() == ddp_emu::StreamMode::kDeferred ? "deferred" : "immediate");
}

TEST_CASE("DDP_EMU_STREAMS chooses the mode once; work queued at exit never runs",
          "[emu][deferred]") {
  std::string out;
  int status = run_child(kModeChild, "DDP_EMU_STREAMS=deferred", &out);
  CHECK(WIFEXITED(status));
  CHECK_THAT(out, Contains("mode deferred"));
  out.clear();
  status = run_child(kModeChild, nullptr, &out);
  CHECK(WIFEXITED(status));
  CHECK_THAT(out, Contains("mode immediate"));
  out.clear();
  status = run_child(kModeChild, "DDP_EMU_STREAMS=defered", &out);
  INFO(out);
  CHECK(WIFSIGNALED(status));
  CHECK_THAT(out, Contains("DDP_EMU_STREAMS='defered' is not a stream mode"));
  out.clear();
  status = run_child(kLagChild, "DDP_EMU_DEVICE_LAG_S=0.5", &out);
  CHECK(WIFEXITED(status));
  CHECK_THAT(out, Contains("lag 0.5"));
  out.clear();
  status = run_child(kLagChild, "DDP_EMU_DEVICE_LAG_S=soon", &out);
  INFO(out);
  CHECK(WIFSIGNALED(status));
  CHECK_THAT(out, Contains("DDP_EMU_DEVICE_LAG_S='soon' is not a number of seconds"));

  out.clear();
  status = run_child(kExitChild, "DDP_EMU_STREAMS=deferred", &out);
  INFO(out);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK_THAT(out, Contains("queued 2"));
  CHECK_THAT(out, Contains("All tests passed"));
  CHECK_THAT(out, !Contains("queued kernel"));
}

// ----- out-of-bounds device memory and unwritten shared memory ----------------------------------

__global__ void write_at_kernel(float* p, int i) {
  if (threadIdx.x == 0) p[i] = 1.0f;
}

__global__ void read_at_kernel(const float* p, int i, float* out) {
  if (threadIdx.x == 0) *out = p[i];
}

float* g_guarded = nullptr;  // 10 floats

TEST_CASE("a write outside a device allocation fails the launch that made it", "[emu][guard]") {
  REQUIRE(cudaMalloc(&g_guarded, 10 * sizeof(float)) == cudaSuccess);
  ddp_emu::launch(write_at_kernel, dim3(1), dim3(32), nullptr, g_guarded, 9);  // the last one
  std::string fault = fault_of([] {
    ddp_emu::launch_named("write_at_kernel", write_at_kernel, dim3(1), dim3(32), nullptr, g_guarded,
                          10);
  });
  CHECK_THAT(fault, Contains("kernel write_at_kernel: wrote outside a device allocation: byte 0 "
                             "past the end of the 40-byte block at"));
  fault =
      fault_of([] { ddp_emu::launch(write_at_kernel, dim3(1), dim3(32), nullptr, g_guarded, 63); });
  CHECK_THAT(fault, Contains("byte 212 past the end of the 40-byte block"));
  fault =
      fault_of([] { ddp_emu::launch(write_at_kernel, dim3(1), dim3(32), nullptr, g_guarded, -1); });
  CHECK_THAT(fault, Contains("4 byte(s) before the start of the 40-byte block"));
  // Each fault is reported once: the guard bytes are restored, the next launch is clean.
  ddp_emu::launch(write_at_kernel, dim3(1), dim3(32), nullptr, g_guarded, 0);
  CHECK(cudaFree(g_guarded) == cudaSuccess);
}

TEST_CASE(kReadPastEndChild, "[.emu_child]") {
  float* p = nullptr;
  float* out = nullptr;
  REQUIRE(cudaMalloc(&p, 64 * sizeof(float)) == cudaSuccess);  // ends at the inaccessible page
  REQUIRE(cudaMalloc(&out, sizeof(float)) == cudaSuccess);
  ddp_emu::launch(read_at_kernel, dim3(1), dim3(32), nullptr, p, 63, out);
  std::printf("read the last element\n");
  std::fflush(stdout);
  ddp_emu::launch(read_at_kernel, dim3(1), dim3(32), nullptr, p, 64, out);
  std::printf("read past the end and went on\n");
}

TEST_CASE("a read past the end of a device allocation stops the process", "[emu][guard]") {
  std::string out;
  const int status = run_child(kReadPastEndChild, nullptr, &out);
  INFO(out);
  CHECK_THAT(out, Contains("read the last element"));
  CHECK_THAT(out, !Contains("went on"));
  // A SIGSEGV, or AddressSanitizer's report of it (which then exits non-zero).
  const bool segv =
      (WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) ||
      (WIFEXITED(status) && WEXITSTATUS(status) != 0 && out.find("SEGV") != std::string::npos);
  CHECK(segv);
}

__global__ void unwritten_shared_kernel(float* out) {
  __shared__ float slot[64];
  DDP_EMU_SHARED(slot);
  const unsigned t = threadIdx.x;
  if (blockIdx.x == 0 || t % 2 == 0) slot[t] = static_cast<float>(t);  // block 1: even slots only
  __syncthreads();
  out[blockIdx.x * 64 + t] = slot[t];
}

TEST_CASE("a shared location the block did not write reads as NaN, not the last block's value",
          "[emu][guard]") {
  std::vector<float> out(2 * 64, 0.0f);
  ddp_emu::launch(unwritten_shared_kernel, dim3(2), dim3(64), nullptr, out.data());
  for (int t = 0; t < 64; ++t) {
    INFO("thread " << t);
    CHECK(out[t] == static_cast<float>(t));
    if (t % 2 == 0) {
      CHECK(out[64 + t] == static_cast<float>(t));
    } else {
      CHECK(std::isnan(out[64 + t]));
    }
  }
}

TEST_CASE(kScheduleChild, "[.emu_child]") {
  std::printf("schedule %d seed %llu\n", static_cast<int>(ddp_emu::schedule()),
              static_cast<unsigned long long>(ddp_emu::schedule_seed()));
}

TEST_CASE("DDP_EMU_SCHEDULE chooses the schedule once; a misspelt one stops the process",
          "[emu][schedule]") {
  std::string out;
  int status = run_child(kScheduleChild, "DDP_EMU_SCHEDULE=random:99", &out);
  CHECK(WIFEXITED(status));
  CHECK_THAT(out, Contains("schedule 3 seed 99"));
  out.clear();
  status = run_child(kScheduleChild, nullptr, &out);
  CHECK_THAT(out, Contains("schedule 0 seed 1"));
  out.clear();
  status = run_child(kScheduleChild, "DDP_EMU_SCHEDULE=fowrard", &out);
  INFO(out);
  CHECK(WIFSIGNALED(status));
  CHECK_THAT(out, Contains("DDP_EMU_SCHEDULE='fowrard' is not a schedule"));
}

}  // namespace
