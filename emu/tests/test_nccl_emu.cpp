// Tests of the NCCL emulation (nccl_emu.h): exact collectives across forked rank processes and
// threads, bitwise agreement between ranks, the non-blocking init protocol, argument and usage
// errors, timeouts, aborts and injected failures, collectives queued on deferred streams, and
// that no shared memory is left behind.
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "nccl_emu.h"
// The library's 16-bit conversions (bit arithmetic) are the reference for the emulation's own
// (frexp and ldexp), so each checks the other; header-only and self-contained.
#include "core/float16.h"
#include "deferred_streams.h"

namespace {

using Catch::Contains;
using Clock = std::chrono::steady_clock;
constexpr double kNever = std::numeric_limits<double>::infinity();

// ----- running ranks as child processes ---------------------------------------------------------

// A child must never return into Catch, so its checks count failures and print them instead of
// throwing; the exit code carries the verdict to the parent.
thread_local int t_rank = -1;
thread_local int t_failures = 0;

void rank_failure(int line, const std::string& what) {
  std::fprintf(stderr, "[nccl_emu rank %d] line %d: %s\n", t_rank, line, what.c_str());
  ++t_failures;
}

#define RANK_CHECK(cond) ((cond) ? (void)0 : rank_failure(__LINE__, #cond))

#define RANK_NCCL(call, expected)                                                               \
  do {                                                                                          \
    const ncclResult_t rank_rc_ = (call);                                                       \
    if (rank_rc_ != (expected)) {                                                               \
      rank_failure(__LINE__, std::string(#call) + " returned " + ncclGetErrorString(rank_rc_) + \
                                 " (" + std::to_string(rank_rc_) +                              \
                                 "): " + ncclGetLastError(nullptr));                            \
    }                                                                                           \
  } while (0)

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Forks one child per rank; each sets env, runs body(rank) and exits 0 when its checks passed.
// Returns the exit codes (-1: killed after the deadline or by a signal).
std::vector<int> run_ranks(int n, const std::vector<std::pair<std::string, std::string>>& env,
                           const std::function<void(int)>& body, double deadline_s = 120) {
  std::fflush(nullptr);  // buffered output would otherwise be written again by every child
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      int code = 0;
      try {
        for (const auto& kv : env) setenv(kv.first.c_str(), kv.second.c_str(), 1);
        t_rank = r;
        t_failures = 0;
        body(r);
        code = t_failures == 0 ? 0 : 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[nccl_emu rank %d] exception: %s\n", r, e.what());
        code = 2;
      } catch (...) {
        code = 2;
      }
      std::fflush(nullptr);
      _exit(code);  // no atexit handlers, no Catch teardown in the child
    }
    if (pid < 0) {
      for (pid_t p : pids) kill(p, SIGKILL);
      FAIL("fork failed");
    }
    pids.push_back(pid);
  }
  std::vector<int> codes(n, -1);
  std::vector<bool> done(n, false);
  const Clock::time_point t0 = Clock::now();
  int remaining = n;
  while (remaining > 0) {
    for (int r = 0; r < n; ++r) {
      if (done[r]) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --remaining;
        codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
    }
    if (remaining > 0 && seconds_since(t0) > deadline_s) {
      for (int r = 0; r < n; ++r) {
        if (!done[r]) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          done[r] = true;
        }
      }
      break;
    }
    if (remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return codes;
}

void require_all_passed(const std::vector<int>& codes) {
  for (size_t r = 0; r < codes.size(); ++r) {
    INFO("rank " << r << " exit code " << codes[r] << " (stderr names the failed checks)");
    CHECK(codes[r] == 0);
  }
}

// Shared-memory names this process's unique ids produced that still exist.
std::vector<std::string> shm_leftovers() {
  const std::string prefix =
      std::string(ddp_nccl_emu::shm_prefix()) + std::to_string(getpid()) + "_";
  std::vector<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) out.push_back(e->d_name);
    }
    closedir(d);
  }
  return out;
}

ncclUniqueId new_id() {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  return id;
}

// Sets an environment variable for the scope of a test (in-process tests only).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      had_ = true;
      old_ = old;
    }
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::string old_;
  bool had_ = false;
};

// ----- device buffers ---------------------------------------------------------------------------

template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n > 0 && cudaMalloc(&ptr_, n * sizeof(T)) != cudaSuccess) throw std::bad_alloc();
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr_); }
  T* get() const { return ptr_; }
  void upload(const std::vector<T>& v) {
    if (n_ > 0) cudaMemcpy(ptr_, v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    if (n_ > 0) cudaMemcpy(v.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

template <class T>
constexpr ncclDataType_t nccl_type() {
  if constexpr (std::is_same_v<T, float>) return ncclFloat;
  if constexpr (std::is_same_v<T, double>) return ncclDouble;
  if constexpr (std::is_same_v<T, int32_t>) return ncclInt32;
  if constexpr (std::is_same_v<T, int64_t>) return ncclInt64;
  if constexpr (std::is_same_v<T, int8_t>) return ncclInt8;
  if constexpr (std::is_same_v<T, uint8_t>) return ncclUint8;
  return ncclNumTypes;
}

// The pattern rank r contributes: r + 1 plus a position-dependent offset (so a chunk written at
// the wrong place shows), small enough that every sum is exact in T.
template <class T>
int64_t period() {
  if constexpr (std::is_same_v<T, int8_t>) return 4;
  if constexpr (std::is_same_v<T, uint8_t>) return 8;
  return 1024;
}

template <class T>
T input(ncclRedOp_t op, int r, size_t i) {
  if (op == ncclProd) return static_cast<T>(i % 2 == 0 ? r + 1 : 1);
  return static_cast<T>(r + 1 + 8 * static_cast<int64_t>(i % period<T>()));
}

template <class T>
T expected(ncclRedOp_t op, int n, size_t i) {
  const int64_t off = 8 * static_cast<int64_t>(i % period<T>());
  switch (op) {
    case ncclSum:
      return static_cast<T>(n * (n + 1) / 2 + n * off);
    case ncclProd: {
      int64_t f = 1;
      for (int k = 2; k <= n; ++k) f *= k;
      return static_cast<T>(i % 2 == 0 ? f : 1);
    }
    case ncclMax:
      return static_cast<T>(n + off);
    case ncclMin:
      return static_cast<T>(1 + off);
    case ncclAvg:
      // The documented definition: the sum in T, divided by nranks in T.
      return static_cast<T>(static_cast<T>(n * (n + 1) / 2 + n * off) / static_cast<T>(n));
    default:
      return T{};
  }
}

const char* op_name(ncclRedOp_t op) {
  static const char* const names[] = {"sum", "prod", "max", "min", "avg"};
  return names[op];
}

template <class T>
void check_allreduce(ncclComm_t comm, int n, int rank, size_t count, ncclRedOp_t op,
                     bool in_place) {
  std::vector<T> in(count);
  for (size_t i = 0; i < count; ++i) in[i] = input<T>(op, rank, i);
  DeviceBuffer<T> send(count);
  DeviceBuffer<T> recv(count);
  send.upload(in);
  T* out = in_place ? send.get() : recv.get();
  RANK_NCCL(ncclAllReduce(send.get(), out, count, nccl_type<T>(), op, comm, nullptr), ncclSuccess);
  const std::vector<T> got = in_place ? send.download() : recv.download();
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) {
    if (got[i] != expected<T>(op, n, i) && bad++ == 0) {
      rank_failure(__LINE__, "allreduce " + std::string(op_name(op)) + " type " +
                                 std::to_string(nccl_type<T>()) + " count " +
                                 std::to_string(count) + (in_place ? " in place" : "") +
                                 ": element " + std::to_string(i) + " is " +
                                 std::to_string(static_cast<double>(got[i])) + ", expected " +
                                 std::to_string(static_cast<double>(expected<T>(op, n, i))));
    }
  }
  if (!in_place) RANK_CHECK(send.download() == in);  // the input stays untouched
}

template <class T>
void check_all_ops(ncclComm_t comm, int n, int rank, const std::vector<size_t>& counts) {
  for (ncclRedOp_t op : {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg}) {
    for (size_t count : counts) {
      for (bool in_place : {false, true}) check_allreduce<T>(comm, n, rank, count, op, in_place);
    }
  }
}

ncclComm_t init_rank(int n, const ncclUniqueId& id, int rank) {
  ncclComm_t comm = nullptr;
  RANK_NCCL(ncclCommInitRank(&comm, n, id, rank), ncclSuccess);
  return comm;
}

// ----- tests -----------------------------------------------------------------------------------

TEST_CASE("version, unique ids, error strings and the config initializer", "[nccl_emu]") {
  int version = 0;
  REQUIRE(ncclGetVersion(&version) == ncclSuccess);
  CHECK(version == NCCL_VERSION_CODE);
  CHECK(NCCL_VERSION_CODE == NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH));
  CHECK(NCCL_VERSION(2, 28, 9) == 22809);

  const ncclUniqueId a = new_id();
  const ncclUniqueId b = new_id();
  CHECK(std::memcmp(a.internal, b.internal, NCCL_UNIQUE_ID_BYTES) != 0);
  CHECK_THAT(std::string(a.internal), Contains("_" + std::to_string(getpid()) + "_"));

  CHECK(std::string(ncclGetErrorString(ncclSuccess)) == "no error");
  CHECK(std::string(ncclGetErrorString(ncclRemoteError)) !=
        std::string(ncclGetErrorString(ncclSystemError)));
  CHECK(std::string(ncclGetErrorString(static_cast<ncclResult_t>(99))) == "unknown result code");

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  CHECK(config.size == sizeof(ncclConfig_t));
  CHECK(config.magic == 0xcafebeef);
  CHECK(config.version == NCCL_VERSION_CODE);
  CHECK(config.cgaClusterSize == NCCL_CONFIG_UNDEF_INT);
  CHECK(config.netName == nullptr);
  CHECK(config.nvlinkCentricSched == NCCL_CONFIG_UNDEF_INT);
}

TEST_CASE("a one-rank communicator reduces locally and answers queries", "[nccl_emu]") {
  const int64_t live = ddp_nccl_emu::live_communicators();
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitRank(&comm, 1, new_id(), 0) == ncclSuccess);
  REQUIRE(comm != nullptr);
  CHECK(ddp_nccl_emu::live_communicators() == live + 1);
  CHECK(shm_leftovers().empty());  // the only rank joined, so the name is gone already

  int value = -1;
  CHECK(ncclCommCount(comm, &value) == ncclSuccess);
  CHECK(value == 1);
  CHECK(ncclCommUserRank(comm, &value) == ncclSuccess);
  CHECK(value == 0);
  CHECK(ncclCommCuDevice(comm, &value) == ncclSuccess);
  CHECK(value == 0);
  ncclResult_t async = ncclInternalError;
  CHECK(ncclCommGetAsyncError(comm, &async) == ncclSuccess);
  CHECK(async == ncclSuccess);

  const int64_t before = ddp_nccl_emu::collective_count();
  DeviceBuffer<float> buf(5);
  buf.upload({1.5f, -2.0f, 3.0f, 0.0f, 7.25f});
  DeviceBuffer<float> out(5);
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  CHECK(ncclAllReduce(buf.get(), out.get(), 5, ncclFloat, ncclAvg, comm, stream) == ncclSuccess);
  CHECK(out.download() == std::vector<float>{1.5f, -2.0f, 3.0f, 0.0f, 7.25f});
  CHECK(ncclBroadcast(buf.get(), out.get(), 5, ncclFloat, 0, comm, stream) == ncclSuccess);
  CHECK(ncclAllReduce(buf.get(), out.get(), 0, ncclFloat, ncclSum, comm, stream) == ncclSuccess);
  CHECK(ddp_nccl_emu::collective_count() == before + 3);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);

  CHECK(ncclCommFinalize(comm) == ncclSuccess);
  CHECK(ncclCommGetAsyncError(comm, &async) == ncclSuccess);
  CHECK(async == ncclSuccess);
  CHECK(ncclAllReduce(buf.get(), out.get(), 5, ncclFloat, ncclSum, comm, nullptr) ==
        ncclInvalidUsage);
  CHECK_THAT(ncclGetLastError(comm), Contains("finalized"));
  CHECK(ncclCommFinalize(comm) == ncclInvalidUsage);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  CHECK(ddp_nccl_emu::live_communicators() == live);
  CHECK(ncclCommDestroy(nullptr) == ncclSuccess);
  CHECK(ncclCommAbort(nullptr) == ncclSuccess);
}

TEST_CASE("argument errors are returned like NCCL returns them", "[nccl_emu]") {
  const ncclUniqueId id = new_id();
  ncclComm_t comm = nullptr;
  ncclComm_t bad = reinterpret_cast<ncclComm_t>(&comm);  // never initialised
  auto last = [] { return std::string(ncclGetLastError(nullptr)); };

  SECTION("init") {
    CHECK(ncclCommInitRank(nullptr, 1, id, 0) == ncclInvalidArgument);
    CHECK(ncclCommInitRank(&comm, 0, id, 0) == ncclInvalidArgument);
    CHECK_THAT(last(), Contains("nranks=0"));
    CHECK(comm == nullptr);
    CHECK(ncclCommInitRank(&comm, 2, id, -1) == ncclInvalidArgument);
    CHECK(ncclCommInitRank(&comm, 2, id, 2) == ncclInvalidArgument);
    CHECK_THAT(last(), Contains("rank=2"));
    ncclUniqueId zero{};
    CHECK(ncclCommInitRank(&comm, 1, zero, 0) == ncclInvalidArgument);
    CHECK_THAT(last(), Contains("ncclGetUniqueId"));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.magic = 0;
    CHECK(ncclCommInitRankConfig(&comm, 1, id, 0, &config) == ncclInvalidArgument);
    config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 5;
    CHECK(ncclCommInitRankConfig(&comm, 1, id, 0, &config) == ncclInvalidArgument);
    CHECK_THAT(last(), Contains("blocking=5"));
    CHECK(comm == nullptr);
    CHECK(ncclGetUniqueId(nullptr) == ncclInvalidArgument);
    CHECK(ncclGetVersion(nullptr) == ncclInvalidArgument);
  }

  SECTION("queries") {
    int value = 0;
    ncclResult_t async;
    CHECK(ncclCommCount(nullptr, &value) == ncclInvalidArgument);
    CHECK(ncclCommUserRank(nullptr, &value) == ncclInvalidArgument);
    CHECK(ncclCommCuDevice(nullptr, &value) == ncclInvalidArgument);
    CHECK(ncclCommGetAsyncError(nullptr, &async) == ncclInvalidArgument);
    CHECK(ncclCommCount(bad, &value) == ncclInvalidArgument);
    CHECK_THAT(last(), Contains("not a live communicator"));
    CHECK(ncclCommFinalize(nullptr) == ncclInvalidArgument);
    CHECK(ncclCommDestroy(bad) == ncclInvalidArgument);
    CHECK(ncclCommAbort(bad) == ncclInvalidArgument);
    CHECK(ncclGroupEnd() == ncclInvalidUsage);
    CHECK_THAT(last(), Contains("without ncclGroupStart"));
    CHECK(ncclGroupStart() == ncclSuccess);
    CHECK(ncclGroupStart() == ncclSuccess);
    CHECK(ncclGroupEnd() == ncclSuccess);
    CHECK(ncclGroupEnd() == ncclSuccess);
  }

  SECTION("collectives") {
    REQUIRE(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
    int value = 0;
    CHECK(ncclCommCount(comm, nullptr) == ncclInvalidArgument);
    DeviceBuffer<float> buf(8);
    buf.upload(std::vector<float>(8, 1.0f));
    float* d = buf.get();
    std::vector<float> host(8, 1.0f);
    const int64_t before = ddp_nccl_emu::collective_count();
    CHECK(ncclAllReduce(d, d, 8, ncclFloat, ncclSum, nullptr, nullptr) == ncclInvalidArgument);
    CHECK(ncclAllReduce(d, d, 8, ncclFloat, ncclSum, bad, nullptr) == ncclInvalidArgument);
    CHECK(ncclAllReduce(d, d, 8, static_cast<ncclDataType_t>(99), ncclSum, comm, nullptr) ==
          ncclInvalidArgument);
    CHECK_THAT(last(), Contains("datatype 99"));
    CHECK(ncclAllReduce(d, d, 8, ncclFloat, static_cast<ncclRedOp_t>(7), comm, nullptr) ==
          ncclInvalidArgument);
    CHECK(ncclAllReduce(d, d, 8, ncclFloat8e4m3, ncclSum, comm, nullptr) == ncclInvalidArgument);
    CHECK_THAT(last(), Contains("ncclFloat8e4m3"));
    CHECK(ncclReduceScatter(d, d, 8, ncclFloat8e5m2, ncclSum, comm, nullptr) ==
          ncclInvalidArgument);
    CHECK(ncclAllReduce(nullptr, d, 8, ncclFloat, ncclSum, comm, nullptr) == ncclInvalidArgument);
    CHECK(ncclAllReduce(d, nullptr, 8, ncclFloat, ncclSum, comm, nullptr) == ncclInvalidArgument);
    // Host memory and overruns are not device memory; the probes leave no CUDA error behind.
    CHECK(ncclAllReduce(host.data(), d, 8, ncclFloat, ncclSum, comm, nullptr) ==
          ncclInvalidArgument);
    CHECK_THAT(last(), Contains("sendbuff"));
    CHECK(ncclAllReduce(d, host.data(), 8, ncclFloat, ncclSum, comm, nullptr) ==
          ncclInvalidArgument);
    CHECK_THAT(last(), Contains("recvbuff"));
    CHECK(ncclAllReduce(d, d, 9, ncclFloat, ncclSum, comm, nullptr) == ncclInvalidArgument);
    CHECK(ncclAllReduce(d, d, 5, ncclDouble, ncclSum, comm, nullptr) == ncclInvalidArgument);
    CHECK(cudaGetLastError() == cudaSuccess);
    cudaStream_t stream = nullptr;
    REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
    CHECK(ncclAllReduce(d, d, 8, ncclFloat, ncclSum, comm, stream) == ncclUnhandledCudaError);
    CHECK_THAT(last(), Contains("stream"));
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(ncclBroadcast(d, d, 8, ncclFloat, 1, comm, nullptr) == ncclInvalidArgument);
    CHECK_THAT(last(), Contains("root=1"));
    CHECK(ncclBroadcast(d, d, 8, ncclFloat, -1, comm, nullptr) == ncclInvalidArgument);
    CHECK(ncclBroadcast(d, d, 8, static_cast<ncclDataType_t>(-3), 0, comm, nullptr) ==
          ncclInvalidArgument);
    CHECK(ncclBroadcast(nullptr, d, 8, ncclFloat, 0, comm, nullptr) == ncclInvalidArgument);
    CHECK(ddp_nccl_emu::collective_count() == before);  // none of these was issued
    // None of them harmed the communicator.
    ncclResult_t async = ncclInternalError;
    CHECK(ncclCommGetAsyncError(comm, &async) == ncclSuccess);
    CHECK(async == ncclSuccess);
    CHECK(ncclAllReduce(d, d, 8, ncclFloat, ncclSum, comm, nullptr) == ncclSuccess);
    CHECK(ncclCommCount(comm, &value) == ncclSuccess);
    CHECK(ncclCommDestroy(comm) == ncclSuccess);
    CHECK(ncclCommCount(comm, &value) == ncclInvalidArgument);  // destroyed
    CHECK(ncclAllReduce(d, d, 8, ncclFloat, ncclSum, comm, nullptr) == ncclInvalidArgument);
  }
  CHECK(shm_leftovers().empty());
}

TEST_CASE("malformed DDP_NCCL_EMU_* settings make init fail", "[nccl_emu]") {
  const char* name = nullptr;
  const char* value = nullptr;
  SECTION("fail: no colon") {
    name = "DDP_NCCL_EMU_FAIL";
    value = "3";
  }
  SECTION("fail: N = 0") {
    name = "DDP_NCCL_EMU_FAIL";
    value = "1:0";
  }
  SECTION("fail: negative rank") {
    name = "DDP_NCCL_EMU_FAIL";
    value = "-1:2";
  }
  SECTION("fail: trailing text") {
    name = "DDP_NCCL_EMU_FAIL";
    value = "1:2x";
  }
  SECTION("timeout: not a number") {
    name = "DDP_NCCL_EMU_TIMEOUT_S";
    value = "soon";
  }
  SECTION("timeout: zero") {
    name = "DDP_NCCL_EMU_TIMEOUT_S";
    value = "0";
  }
  SECTION("chunk: too small") {
    name = "DDP_NCCL_EMU_CHUNK_BYTES";
    value = "10";
  }
  SECTION("chunk: negative") {
    name = "DDP_NCCL_EMU_CHUNK_BYTES";
    value = "-4096";
  }
  ScopedEnv env(name, value);
  ncclComm_t comm = nullptr;
  CHECK(ncclCommInitRank(&comm, 1, new_id(), 0) == ncclInvalidArgument);
  CHECK(comm == nullptr);
  CHECK_THAT(ncclGetLastError(nullptr), Contains(name));
  CHECK(shm_leftovers().empty());
}

TEST_CASE("allreduce is exact for every operator, type and rank count", "[nccl_emu]") {
  // A 1 KiB chunk (256 floats, 128 doubles) makes the larger counts span several chunks, with a
  // full or a partial last one.
  const std::vector<size_t> counts = {0, 1, 7, 256, 257, 4099};
  for (int n : {2, 3, 4}) {
    INFO(n << " ranks");
    const ncclUniqueId id = new_id();
    require_all_passed(run_ranks(n, {{"DDP_NCCL_EMU_CHUNK_BYTES", "1024"}}, [&](int rank) {
      ncclComm_t comm = init_rank(n, id, rank);
      if (!comm) return;
      int value = -1;
      RANK_NCCL(ncclCommCount(comm, &value), ncclSuccess);
      RANK_CHECK(value == n);
      RANK_NCCL(ncclCommUserRank(comm, &value), ncclSuccess);
      RANK_CHECK(value == rank);
      check_all_ops<float>(comm, n, rank, counts);
      check_all_ops<double>(comm, n, rank, counts);
      check_all_ops<int32_t>(comm, n, rank, counts);
      check_all_ops<int64_t>(comm, n, rank, {1, 1000});
      check_all_ops<int8_t>(comm, n, rank, {1, 1025, 4099});
      check_all_ops<uint8_t>(comm, n, rank, {1, 1025, 4099});
      RANK_NCCL(ncclCommDestroy(comm), ncclSuccess);
    }));
    CHECK(shm_leftovers().empty());
  }
}

TEST_CASE("integer reductions are integer arithmetic", "[nccl_emu]") {
  const ncclUniqueId id = new_id();
  require_all_passed(run_ranks(3, {}, [&](int rank) {
    ncclComm_t comm = init_rank(3, id, rank);
    if (!comm) return;
    // 2^25 + r is not representable in float: a reduction through float would round.
    DeviceBuffer<int32_t> a(2);
    a.upload({(1 << 25) + rank, rank == 1 ? 7 : -3});
    RANK_NCCL(ncclAllReduce(a.get(), a.get(), 2, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
    RANK_CHECK(a.download() == (std::vector<int32_t>{3 * (1 << 25) + 3, 1}));
    a.upload({(1 << 25) + rank, rank == 1 ? 7 : -3});
    RANK_NCCL(ncclAllReduce(a.get(), a.get(), 2, ncclInt32, ncclAvg, comm, nullptr), ncclSuccess);
    RANK_CHECK(a.download() == (std::vector<int32_t>{(1 << 25) + 1, 0}));  // 1 / 3 truncates
    // Sums wrap instead of overflowing.
    DeviceBuffer<int8_t> b(1);
    b.upload({100});
    RANK_NCCL(ncclAllReduce(b.get(), b.get(), 1, ncclInt8, ncclSum, comm, nullptr), ncclSuccess);
    RANK_CHECK(b.download()[0] == static_cast<int8_t>(44));  // 300 - 256
    DeviceBuffer<uint32_t> c(1);
    RANK_CHECK(cudaMemcpy(c.get(), std::vector<uint32_t>{0x80000000u}.data(), 4,
                          cudaMemcpyHostToDevice) == cudaSuccess);
    RANK_NCCL(ncclAllReduce(c.get(), c.get(), 1, ncclUint32, ncclProd, comm, nullptr), ncclSuccess);
    RANK_CHECK(c.download()[0] == 0u);
    RANK_NCCL(ncclCommDestroy(comm), ncclSuccess);
  }));
}

TEST_CASE("counts beyond the staging chunk, up to tens of millions, work", "[nccl_emu]") {
  const ncclUniqueId id = new_id();
  require_all_passed(run_ranks(2, {}, [&](int rank) {
    ncclComm_t comm = init_rank(2, id, rank);
    if (!comm) return;
    // Default chunk (1 MiB): 300007 doubles take three chunks, the last one partial.
    check_allreduce<double>(comm, 2, rank, 300007, ncclAvg, false);
    const size_t count = 20000003;
    std::vector<float> host(count);
    for (size_t i = 0; i < count; ++i) host[i] = input<float>(ncclSum, rank, i);
    DeviceBuffer<float> buf(count);
    buf.upload(host);
    RANK_NCCL(ncclAllReduce(buf.get(), buf.get(), count, ncclFloat, ncclSum, comm, nullptr),
              ncclSuccess);
    host = buf.download();
    size_t bad = 0;
    for (size_t i = 0; i < count; ++i) bad += host[i] != expected<float>(ncclSum, 2, i);
    RANK_CHECK(bad == 0);
    RANK_NCCL(ncclCommDestroy(comm), ncclSuccess);
  }));
  CHECK(shm_leftovers().empty());
}

TEST_CASE("every rank gets the bit-identical rank-order sum of random floats", "[nccl_emu]") {
  const size_t count = 10007;
  // Values spanning many binades, so the order of the additions changes the rounded result.
  auto data = [&](int r) {
    std::mt19937 gen(1234 + r);
    std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
    std::uniform_int_distribution<int> expo(-20, 20);
    std::vector<float> v(count);
    for (float& x : v) x = std::ldexp(mant(gen), expo(gen));
    return v;
  };
  for (int n : {3, 4}) {
    INFO(n << " ranks");
    const ncclUniqueId id = new_id();
    require_all_passed(run_ranks(n, {{"DDP_NCCL_EMU_CHUNK_BYTES", "4096"}}, [&](int rank) {
      std::vector<std::vector<float>> all;
      for (int r = 0; r < n; ++r) all.push_back(data(r));
      std::vector<float> forward = all[0];
      std::vector<float> backward = all[n - 1];
      for (int r = 1; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) {
          forward[i] += all[r][i];
          backward[i] += all[n - 1 - r][i];
        }
      }
      // Otherwise the test could not tell rank order from any other order.
      RANK_CHECK(std::memcmp(forward.data(), backward.data(), count * sizeof(float)) != 0);
      ncclComm_t comm = init_rank(n, id, rank);
      if (!comm) return;
      DeviceBuffer<float> send(count);
      DeviceBuffer<float> recv(count);
      send.upload(all[rank]);
      RANK_NCCL(ncclAllReduce(send.get(), recv.get(), count, ncclFloat, ncclSum, comm, nullptr),
                ncclSuccess);
      const std::vector<float> got = recv.download();
      RANK_CHECK(std::memcmp(got.data(), forward.data(), count * sizeof(float)) == 0);
      RANK_NCCL(ncclCommDestroy(comm), ncclSuccess);
    }));
  }
}

TEST_CASE("broadcast copies the root's buffer to every rank", "[nccl_emu]") {
  const ncclUniqueId id = new_id();
  const int n = 3;
  const size_t count = 1001;
  require_all_passed(run_ranks(n, {{"DDP_NCCL_EMU_CHUNK_BYTES", "256"}}, [&](int rank) {
    ncclComm_t comm = init_rank(n, id, rank);
    if (!comm) return;
    auto pattern = [&](int root) {
      std::vector<int32_t> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>(1000 * root + i);
      return v;
    };
    for (int root = 0; root < n; ++root) {
      // Out of place; non-root ranks pass no send buffer, as NCCL allows.
      DeviceBuffer<int32_t> send(count);
      DeviceBuffer<int32_t> recv(count);
      if (rank == root) send.upload(pattern(root));
      RANK_NCCL(ncclBroadcast(rank == root ? send.get() : nullptr, recv.get(), count, ncclInt32,
                              root, comm, nullptr),
                ncclSuccess);
      RANK_CHECK(recv.download() == pattern(root));
      // In place.
      DeviceBuffer<int32_t> buf(count);
      buf.upload(rank == root ? pattern(root) : std::vector<int32_t>(count, -1));
      RANK_NCCL(ncclBroadcast(buf.get(), buf.get(), count, ncclInt32, root, comm, nullptr),
                ncclSuccess);
      RANK_CHECK(buf.download() == pattern(root));
    }
    // Broadcast moves bytes, so the 16-bit float type is fine.
    DeviceBuffer<uint16_t> half(333);
    half.upload(std::vector<uint16_t>(333, rank == 2 ? 0x3c00 : 0));
    RANK_NCCL(ncclBroadcast(half.get(), half.get(), 333, ncclFloat16, 2, comm, nullptr),
              ncclSuccess);
    RANK_CHECK(half.download() == std::vector<uint16_t>(333, 0x3c00));
    RANK_NCCL(ncclCommDestroy(comm), ncclSuccess);
  }));
  CHECK(shm_leftovers().empty());
}

TEST_CASE("reduce-scatter keeps each rank's block of the sum; allgather assembles the blocks",
          "[nccl_emu]") {
  const int n = 3;
  // Blocks that straddle the 256-byte staging chunk (64 floats) in every way.
  for (size_t block : {size_t{1}, size_t{50}, size_t{64}, size_t{333}}) {
    INFO(block << " floats per rank");
    const ncclUniqueId id = new_id();
    require_all_passed(run_ranks(n, {{"DDP_NCCL_EMU_CHUNK_BYTES", "256"}}, [&](int rank) {
      ncclComm_t comm = init_rank(n, id, rank);
      if (!comm) return;
      const size_t total = n * block;
      std::vector<float> in(total);
      for (size_t i = 0; i < total; ++i) in[i] = static_cast<float>((rank + 1) * (i % 97 + 1));
      auto summed = [&](size_t i) { return static_cast<float>(n * (n + 1) / 2 * (i % 97 + 1)); };
      for (bool in_place : {false, true}) {
        DeviceBuffer<float> send(total), recv(block);
        send.upload(in);
        float* out = in_place ? send.get() + rank * block : recv.get();
        RANK_NCCL(ncclReduceScatter(send.get(), out, block, ncclFloat, ncclSum, comm, nullptr),
                  ncclSuccess);
        const std::vector<float> all = send.download();
        const std::vector<float> got =
            in_place
                ? std::vector<float>(all.begin() + rank * block, all.begin() + (rank + 1) * block)
                : recv.download();
        size_t bad = 0;
        for (size_t i = 0; i < block; ++i) bad += got[i] != summed(rank * block + i);
        RANK_CHECK(bad == 0);
        if (!in_place) RANK_CHECK(all == in);  // the input stays untouched
      }
      for (bool in_place : {false, true}) {
        std::vector<float> mine(block), expected(total);
        for (size_t i = 0; i < block; ++i) mine[i] = static_cast<float>(1000 * rank + i);
        for (size_t i = 0; i < total; ++i)
          expected[i] = static_cast<float>(1000 * (i / block) + i % block);
        DeviceBuffer<float> whole(total), part(block);
        whole.upload(std::vector<float>(total, -1.0f));
        const float* from = part.get();
        if (in_place) {
          std::vector<float> staged(total, -1.0f);
          std::copy(mine.begin(), mine.end(), staged.begin() + rank * block);
          whole.upload(staged);
          from = whole.get() + rank * block;
        } else {
          part.upload(mine);
        }
        RANK_NCCL(ncclAllGather(from, whole.get(), block, ncclFloat, comm, nullptr), ncclSuccess);
        RANK_CHECK(whole.download() == expected);
      }
      // A send buffer shorter than nranks x recvcount is refused like NCCL refuses it.
      DeviceBuffer<float> small(block);
      RANK_NCCL(
          ncclReduceScatter(small.get(), small.get(), block, ncclFloat, ncclSum, comm, nullptr),
          ncclInvalidArgument);
      RANK_NCCL(ncclCommDestroy(comm), ncclSuccess);
    }));
  }
  CHECK(shm_leftovers().empty());
}

// ----- 16-bit floats ----------------------------------------------------------------------------

struct Format16 {
  ncclDataType_t type;
  const char* name;
  uint16_t (*encode)(float);
  float (*decode)(uint16_t);
};
const Format16 kFormats16[] = {{ncclBfloat16, "bf16", ddp::float_to_bf16, ddp::bf16_to_float},
                               {ncclFloat16, "fp16", ddp::float_to_fp16, ddp::fp16_to_float}};

std::vector<uint16_t> encoded(const Format16& f, const std::vector<float>& values) {
  std::vector<uint16_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = f.encode(values[i]);
  return out;
}

// Runs an allreduce of rank's 16-bit `in` (in place) and returns the result.
std::vector<uint16_t> allreduce16(ncclComm_t comm, const Format16& f, ncclRedOp_t op,
                                  const std::vector<uint16_t>& in) {
  DeviceBuffer<uint16_t> buf(in.size());
  buf.upload(in);
  RANK_NCCL(ncclAllReduce(buf.get(), buf.get(), in.size(), f.type, op, comm, nullptr), ncclSuccess);
  return buf.download();
}

// Rank-valued data small enough that every result is exact in both types (bf16 holds the
// integers to 256 and the averages' halves): results are compared with ==.
float rank_value(ncclRedOp_t op, int r, size_t i) {
  if (op == ncclProd) return static_cast<float>(i % 2 == 0 ? r + 1 : 1);
  return static_cast<float>(r + 1 + 8 * static_cast<int>(i % 4));
}

float exact_result(ncclRedOp_t op, int n, size_t i) {
  const float off = static_cast<float>(8 * static_cast<int>(i % 4));
  const float sum = static_cast<float>(n * (n + 1) / 2) + n * off;
  switch (op) {
    case ncclSum:
      return sum;
    case ncclProd:
      return i % 2 == 0 ? static_cast<float>(n == 2 ? 2 : n == 3 ? 6 : 24) : 1.0f;
    case ncclMax:
      return static_cast<float>(n) + off;
    case ncclMin:
      return 1.0f + off;
    default:
      return sum / static_cast<float>(n);  // ncclAvg
  }
}

void check_exact16(ncclComm_t comm, int n, int rank, const Format16& f, size_t count) {
  for (ncclRedOp_t op : {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg}) {
    std::vector<float> mine(count), want(count);
    for (size_t i = 0; i < count; ++i) {
      mine[i] = rank_value(op, rank, i);
      want[i] = exact_result(op, n, i);
    }
    const std::vector<uint16_t> got = allreduce16(comm, f, op, encoded(f, mine));
    if (got != encoded(f, want)) {
      rank_failure(__LINE__, std::string(f.name) + " " + op_name(op) + " of " +
                                 std::to_string(count) + " is not exact");
    }
  }
}

// Values over many binades and of both signs, so that the order of the additions changes the
// rounded sums.
std::vector<uint16_t> random16(const Format16& f, int r, size_t count) {
  std::mt19937 gen(777 + r);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-16, 14);
  std::vector<float> v(count);
  for (float& x : v) x = std::ldexp(mant(gen), expo(gen));
  return encoded(f, v);
}

// The sum over ranks in the given order, rounded to the type after every addition.
std::vector<uint16_t> rounded_sum(const Format16& f, const std::vector<int>& order, size_t count) {
  std::vector<uint16_t> acc = random16(f, order[0], count);
  for (size_t k = 1; k < order.size(); ++k) {
    const std::vector<uint16_t> x = random16(f, order[k], count);
    for (size_t i = 0; i < count; ++i) acc[i] = f.encode(f.decode(acc[i]) + f.decode(x[i]));
  }
  return acc;
}

// Allreduce and reduce-scatter (in place) of random data against the rank-order reference.
void check_rank_order16(ncclComm_t comm, int n, int rank, const Format16& f, size_t block) {
  const size_t count = n * block;
  std::vector<int> order(n);
  for (int r = 0; r < n; ++r) order[r] = r;
  const std::vector<uint16_t> want = rounded_sum(f, order, count);
  if (n >= 3) {  // otherwise the test could not tell rank order from another order
    std::reverse(order.begin(), order.end());
    RANK_CHECK(rounded_sum(f, order, count) != want);
  }
  RANK_CHECK(allreduce16(comm, f, ncclSum, random16(f, rank, count)) == want);
  DeviceBuffer<uint16_t> buf(count);
  buf.upload(random16(f, rank, count));
  uint16_t* mine = buf.get() + rank * block;
  RANK_NCCL(ncclReduceScatter(buf.get(), mine, block, f.type, ncclSum, comm, nullptr), ncclSuccess);
  const std::vector<uint16_t> got = buf.download();
  RANK_CHECK(std::equal(got.begin() + rank * block, got.begin() + (rank + 1) * block,
                        want.begin() + rank * block));
}

// Overflow to infinity (fp16 from 65520, the tie above 65504, up), NaN kept, and the
// tie-to-even of every addition: 1 + half a unit + half a unit is 1, not 1 + a unit.
void check_special16(ncclComm_t comm, int rank, const Format16& f) {
  const bool fp16 = f.type == ncclFloat16;
  const float big = fp16 ? 40000.0f : 2e38f;
  const float half_unit = fp16 ? std::ldexp(1.0f, -11) : std::ldexp(1.0f, -8);
  const float top = fp16 ? (rank == 0 ? 65504.0f : rank == 1 ? 16.0f : 0.0f) : 0.0f;
  const std::vector<float> in = {big,
                                 -big,
                                 rank == 0 ? NAN : 1.0f,
                                 rank == 0 ? 1.0f : half_unit,
                                 top,
                                 rank == 0   ? 65504.0f
                                 : rank == 1 ? 8.0f
                                             : 0.0f};
  const std::vector<uint16_t> got = allreduce16(comm, f, ncclSum, encoded(f, in));
  RANK_CHECK(std::isinf(f.decode(got[0])) && f.decode(got[0]) > 0);
  RANK_CHECK(std::isinf(f.decode(got[1])) && f.decode(got[1]) < 0);
  RANK_CHECK(std::isnan(f.decode(got[2])));
  RANK_CHECK(f.decode(got[3]) == 1.0f);
  if (fp16) {
    RANK_CHECK(std::isinf(f.decode(got[4])));  // 65520 rounds to even: infinity
    RANK_CHECK(f.decode(got[5]) == 65504.0f);  // 65512 rounds down
  }
}

TEST_CASE("16-bit float reductions: exact results, rounding after every addition in rank order",
          "[nccl_emu]") {
  for (int n : {2, 3, 4}) {
    INFO(n << " ranks");
    const ncclUniqueId id = new_id();
    // 128 values of 16 bits per 256-byte chunk: the larger counts span chunks.
    require_all_passed(run_ranks(n, {{"DDP_NCCL_EMU_CHUNK_BYTES", "256"}}, [&](int rank) {
      ncclComm_t comm = init_rank(n, id, rank);
      if (!comm) return;
      for (const Format16& f : kFormats16) {
        for (size_t count : {1, 7, 128, 1030}) check_exact16(comm, n, rank, f, count);
        check_rank_order16(comm, n, rank, f, 1001);
        check_special16(comm, rank, f);
      }
      RANK_NCCL(ncclCommDestroy(comm), ncclSuccess);
    }));
  }
  CHECK(shm_leftovers().empty());
}

TEST_CASE("an allreduce on a capturing stream is a graph node that runs at every launch",
          "[nccl_emu][graph]") {
  const ncclUniqueId id = new_id();
  require_all_passed(run_ranks(2, {}, [&](int rank) {
    ncclComm_t comm = init_rank(2, id, rank);
    if (!comm) return;
    constexpr size_t kCount = 64;
    DeviceBuffer<float> send(kCount), recv(kCount);
    recv.upload(std::vector<float>(kCount, -1.0f));
    float* input = nullptr;
    RANK_CHECK(cudaMallocHost(&input, kCount * sizeof(float)) == cudaSuccess);
    cudaStream_t s = nullptr;
    RANK_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    ddp_emu::reset_runtime_calls();
    RANK_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    RANK_CHECK(cudaMemcpyAsync(send.get(), input, kCount * sizeof(float), cudaMemcpyHostToDevice,
                               s) == cudaSuccess);
    RANK_NCCL(ncclAllReduce(send.get(), recv.get(), kCount, ncclFloat, ncclSum, comm, s),
              ncclSuccess);
    cudaGraph_t graph = nullptr;
    RANK_CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess);
    RANK_CHECK(recv.download() == std::vector<float>(kCount, -1.0f));  // recorded, not run
    cudaGraphExec_t exec = nullptr;
    RANK_CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    RANK_CHECK(cudaGraphDestroy(graph) == cudaSuccess);
    for (int launch = 1; launch <= 2; ++launch) {
      // Each launch reads the input of that moment: rank r contributes 10 * launch + r + i.
      std::vector<float> want(kCount);
      for (size_t i = 0; i < kCount; ++i) {
        input[i] = static_cast<float>(10 * launch + rank) + static_cast<float>(i);
        want[i] = static_cast<float>(2 * (10 * launch + static_cast<int>(i)) + 1);
      }
      RANK_CHECK(cudaGraphLaunch(exec, s) == cudaSuccess);
      RANK_CHECK(cudaStreamSynchronize(s) == cudaSuccess);
      RANK_CHECK(recv.download() == want);
    }
    // The collective was one call, at the capture; each launch is one call.
    const ddp_emu::RuntimeCalls calls = ddp_emu::runtime_calls();
    RANK_CHECK(calls.of("ncclAllReduce") == 1);
    RANK_CHECK(calls.graph_launches == 2);
    RANK_CHECK(calls.of("ncclGetErrorString") == 0);
    // On a capture a prohibited call invalidated, the collective is refused, naming why.
    RANK_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    RANK_CHECK(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
    RANK_NCCL(ncclAllReduce(send.get(), recv.get(), kCount, ncclFloat, ncclSum, comm, s),
              ncclUnhandledCudaError);
    RANK_CHECK(std::string(ncclGetLastError(comm)).find("cudaErrorStreamCaptureInvalidated") !=
               std::string::npos);
    RANK_CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
    RANK_CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
    RANK_CHECK(cudaStreamDestroy(s) == cudaSuccess);
    RANK_CHECK(cudaFreeHost(input) == cudaSuccess);
    RANK_NCCL(ncclCommDestroy(comm), ncclSuccess);
  }));
  CHECK(shm_leftovers().empty());
}

TEST_CASE("ranks that disagree on a collective all get ncclInvalidUsage", "[nccl_emu]") {
  const ncclUniqueId id = new_id();
  require_all_passed(run_ranks(2, {}, [&](int rank) {
    ncclComm_t comm = init_rank(2, id, rank);
    if (!comm) return;
    DeviceBuffer<float> buf(11);
    buf.upload(std::vector<float>(11, 1.0f));
    RANK_NCCL(ncclAllReduce(buf.get(), buf.get(), 10 + rank, ncclFloat, ncclSum, comm, nullptr),
              ncclInvalidUsage);
    RANK_CHECK(std::string(ncclGetLastError(comm)).find("count=11") != std::string::npos);
    ncclResult_t async = ncclSuccess;
    RANK_NCCL(ncclCommGetAsyncError(comm, &async), ncclSuccess);
    RANK_CHECK(async == ncclInvalidUsage);
    RANK_NCCL(ncclAllReduce(buf.get(), buf.get(), 10, ncclFloat, ncclSum, comm, nullptr),
              ncclInvalidUsage);
    RANK_NCCL(ncclCommDestroy(comm), ncclSuccess);
  }));
}

TEST_CASE("non-blocking init reports ncclInProgress until every rank joined", "[nccl_emu]") {
  const ncclUniqueId id = new_id();
  // Rank 1 joins only when rank 0 says so through this pipe, after its in-progress checks.
  int go[2];
  REQUIRE(pipe(go) == 0);
  require_all_passed(run_ranks(2, {}, [&](int rank) {
    DeviceBuffer<float> buf(4);
    buf.upload(std::vector<float>(4, 1.0f + rank));
    ncclComm_t comm = nullptr;
    if (rank == 1) {
      close(go[1]);
      pollfd pfd{go[0], POLLIN, 0};
      RANK_CHECK(poll(&pfd, 1, 30000) == 1);
      RANK_NCCL(ncclCommInitRank(&comm, 2, id, 1), ncclSuccess);
    } else {
      close(go[0]);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const ncclResult_t rc = ncclCommInitRankConfig(&comm, 2, id, 0, &config);
      RANK_CHECK(rc == ncclInProgress || rc == ncclSuccess);
      RANK_CHECK(comm != nullptr);
      if (!comm) return;
      ncclResult_t async = ncclInternalError;
      RANK_NCCL(ncclCommGetAsyncError(comm, &async), ncclSuccess);
      RANK_CHECK(async == ncclInProgress);  // rank 1 is still asleep
      RANK_NCCL(ncclAllReduce(buf.get(), buf.get(), 4, ncclFloat, ncclSum, comm, nullptr),
                ncclInvalidUsage);
      RANK_CHECK(std::string(ncclGetLastError(comm)).find("in progress") != std::string::npos);
      RANK_NCCL(ncclCommGetAsyncError(comm, &async), ncclSuccess);
      RANK_CHECK(async == ncclInProgress);
      RANK_CHECK(write(go[1], "g", 1) == 1);
      const Clock::time_point t0 = Clock::now();
      do {
        RANK_NCCL(ncclCommGetAsyncError(comm, &async), ncclSuccess);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      } while (async == ncclInProgress && seconds_since(t0) < 30);
      RANK_CHECK(async == ncclSuccess);
    }
    RANK_NCCL(ncclAllReduce(buf.get(), buf.get(), 4, ncclFloat, ncclSum, comm, nullptr),
              ncclSuccess);
    RANK_CHECK(buf.download() == std::vector<float>(4, 3.0f));
    if (rank == 0) {
      RANK_NCCL(ncclCommFinalize(comm), ncclInProgress);
      ncclResult_t async = ncclInternalError;
      RANK_NCCL(ncclCommGetAsyncError(comm, &async), ncclSuccess);
      RANK_CHECK(async == ncclSuccess);
    } else {
      RANK_NCCL(ncclCommFinalize(comm), ncclSuccess);
    }
    RANK_NCCL(ncclCommDestroy(comm), ncclSuccess);
  }));
  close(go[0]);
  close(go[1]);
  CHECK(shm_leftovers().empty());
}

TEST_CASE("init gives up with ncclRemoteError when a rank never joins", "[nccl_emu]") {
  ScopedEnv timeout("DDP_NCCL_EMU_TIMEOUT_S", "0.5");
  const int64_t live = ddp_nccl_emu::live_communicators();
  SECTION("blocking") {
    ncclComm_t comm = nullptr;
    const Clock::time_point t0 = Clock::now();
    CHECK(ncclCommInitRank(&comm, 3, new_id(), 1) == ncclRemoteError);
    const double s = seconds_since(t0);
    CHECK(s >= 0.4);
    CHECK(s < 5);
    CHECK(comm == nullptr);
    CHECK_THAT(ncclGetLastError(nullptr), Contains("missing ranks: 0,2"));
  }
  SECTION("non-blocking") {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    REQUIRE(ncclCommInitRankConfig(&comm, 2, new_id(), 0, &config) == ncclInProgress);
    ncclResult_t async = ncclInternalError;
    const Clock::time_point t0 = Clock::now();
    do {
      REQUIRE(ncclCommGetAsyncError(comm, &async) == ncclSuccess);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (async == ncclInProgress && seconds_since(t0) < 10);
    CHECK(async == ncclRemoteError);
    CHECK(seconds_since(t0) < 5);
    CHECK(ncclCommDestroy(comm) == ncclSuccess);
  }
  SECTION("a rank destroyed before every rank joined") {
    ScopedEnv long_timeout("DDP_NCCL_EMU_TIMEOUT_S", "60");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclUniqueId id = new_id();
    ncclComm_t c0 = nullptr;
    ncclComm_t c1 = nullptr;
    REQUIRE(ncclCommInitRankConfig(&c0, 3, id, 0, &config) == ncclInProgress);
    REQUIRE(ncclCommInitRankConfig(&c1, 3, id, 1, &config) == ncclInProgress);
    CHECK(shm_leftovers().size() == 1);
    CHECK(ncclCommDestroy(c0) == ncclSuccess);
    CHECK(shm_leftovers().empty());  // rank 2 can never come now
    ncclResult_t async = ncclInternalError;
    CHECK(ncclCommGetAsyncError(c1, &async) == ncclSuccess);
    CHECK(async == ncclRemoteError);
    CHECK_THAT(ncclGetLastError(c1), Contains("rank 0 destroyed its communicator"));
    CHECK(ncclCommDestroy(c1) == ncclSuccess);
  }
  CHECK(ddp_nccl_emu::live_communicators() == live);
  CHECK(shm_leftovers().empty());
}

TEST_CASE("a wrong nranks or a rank joining twice is invalid usage", "[nccl_emu]") {
  const ncclUniqueId id = new_id();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t c0 = nullptr;
  ncclComm_t c1 = nullptr;
  ncclComm_t extra = nullptr;
  REQUIRE(ncclCommInitRankConfig(&c0, 2, id, 0, &config) == ncclInProgress);
  CHECK(ncclCommInitRankConfig(&extra, 2, id, 0, &config) == ncclInvalidUsage);
  CHECK_THAT(ncclGetLastError(nullptr), Contains("twice"));
  CHECK(ncclCommInitRankConfig(&extra, 3, id, 1, &config) == ncclInvalidUsage);
  CHECK_THAT(ncclGetLastError(nullptr), Contains("nranks=2"));
  CHECK(extra == nullptr);
  // The proper rank 1 still completes the communicator.
  REQUIRE(ncclCommInitRankConfig(&c1, 2, id, 1, &config) == ncclInProgress);
  for (ncclComm_t c : {c0, c1}) {
    ncclResult_t async = ncclInternalError;
    CHECK(ncclCommGetAsyncError(c, &async) == ncclSuccess);
    CHECK(async == ncclSuccess);
  }
  CHECK(ncclCommDestroy(c0) == ncclSuccess);
  CHECK(ncclCommDestroy(c1) == ncclSuccess);
  CHECK(shm_leftovers().empty());
}

TEST_CASE("one thread creates all ranks in a group; threads run them", "[nccl_emu]") {
  const int n = 3;
  const ncclUniqueId id = new_id();
  std::vector<ncclComm_t> comms(n, nullptr);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < n; ++r) REQUIRE(ncclCommInitRank(&comms[r], n, id, r) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  CHECK(shm_leftovers().empty());

  std::vector<int> failures(n, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      t_rank = r;
      t_failures = 0;
      DeviceBuffer<double> buf(1000);
      std::vector<double> in(1000);
      for (size_t i = 0; i < in.size(); ++i) in[i] = input<double>(ncclMax, r, i);
      for (int iter = 0; iter < 20; ++iter) {
        buf.upload(in);
        RANK_NCCL(ncclAllReduce(buf.get(), buf.get(), 1000, ncclDouble, ncclMax, comms[r], nullptr),
                  ncclSuccess);
        const std::vector<double> got = buf.download();
        for (size_t i = 0; i < got.size(); ++i)
          RANK_CHECK(got[i] == expected<double>(ncclMax, n, i));
      }
      failures[r] = t_failures;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) CHECK(failures[r] == 0);
  for (ncclComm_t c : comms) CHECK(ncclCommDestroy(c) == ncclSuccess);
}

TEST_CASE("an injected failure is ncclSystemError there and ncclRemoteError at peers",
          "[nccl_emu]") {
  const ncclUniqueId id = new_id();
  const int n = 3;
  require_all_passed(run_ranks(
      n, {{"DDP_NCCL_EMU_FAIL", "1:2"}, {"DDP_NCCL_EMU_TIMEOUT_S", "1.5"}}, [&](int rank) {
        ncclComm_t comm = init_rank(n, id, rank);
        if (!comm) return;
        const int64_t before = ddp_nccl_emu::collective_count();
        DeviceBuffer<float> buf(100);
        buf.upload(std::vector<float>(100, 1.0f));
        RANK_NCCL(ncclAllReduce(buf.get(), buf.get(), 100, ncclFloat, ncclSum, comm, nullptr),
                  ncclSuccess);
        RANK_CHECK(buf.download() == std::vector<float>(100, 3.0f));
        ncclResult_t async = ncclInternalError;
        const Clock::time_point t0 = Clock::now();
        const ncclResult_t rc =
            ncclAllReduce(buf.get(), buf.get(), 100, ncclFloat, ncclSum, comm, nullptr);
        const double s = seconds_since(t0);
        const std::string message = ncclGetLastError(comm);
        RANK_NCCL(ncclCommGetAsyncError(comm, &async), ncclSuccess);
        if (rank == 1) {
          RANK_CHECK(rc == ncclSuccess);  // asynchronous, as in NCCL
          RANK_CHECK(s < 1.0);
          RANK_CHECK(async == ncclSystemError);
          RANK_CHECK(message.find("injected") != std::string::npos);
          // The communicator stays failed.
          RANK_NCCL(ncclAllReduce(buf.get(), buf.get(), 100, ncclFloat, ncclSum, comm, nullptr),
                    ncclSystemError);
          RANK_CHECK(ddp_nccl_emu::collective_count() == before + 3);
        } else {
          RANK_CHECK(rc == ncclRemoteError);
          RANK_CHECK(async == ncclRemoteError);
          RANK_CHECK(s < 6.0);
          // The rank that timed out waited its full timeout; the other may have been released
          // by it earlier.
          if (message.find("missing ranks: 1") != std::string::npos) {
            RANK_CHECK(s >= 1.4);
          } else {
            RANK_CHECK(message.find("rank 0 gave up") != std::string::npos ||
                       message.find("rank 2 gave up") != std::string::npos);
          }
          RANK_CHECK(ddp_nccl_emu::collective_count() == before + 2);
        }
        // Destroy, not abort, on the failed rank: an abort would release the peers before
        // their timeout.
        RANK_NCCL(rank == 1 ? ncclCommDestroy(comm) : ncclCommAbort(comm), ncclSuccess);
      }));
  CHECK(shm_leftovers().empty());
}

TEST_CASE("aborting a rank releases a peer waiting in a collective", "[nccl_emu]") {
  const ncclUniqueId id = new_id();
  require_all_passed(run_ranks(2, {{"DDP_NCCL_EMU_TIMEOUT_S", "60"}}, [&](int rank) {
    ncclComm_t comm = init_rank(2, id, rank);
    if (!comm) return;
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const Clock::time_point t0 = Clock::now();
      RANK_NCCL(ncclCommAbort(comm), ncclSuccess);
      RANK_CHECK(seconds_since(t0) < 1.0);  // never waits for peers
      return;
    }
    DeviceBuffer<float> buf(10);
    buf.upload(std::vector<float>(10, 1.0f));
    const Clock::time_point t0 = Clock::now();
    RANK_NCCL(ncclAllReduce(buf.get(), buf.get(), 10, ncclFloat, ncclSum, comm, nullptr),
              ncclRemoteError);
    RANK_CHECK(seconds_since(t0) < 10.0);
    RANK_CHECK(std::string(ncclGetLastError(comm)).find("aborted") != std::string::npos);
    ncclResult_t async = ncclInternalError;
    RANK_NCCL(ncclCommGetAsyncError(comm, &async), ncclSuccess);
    RANK_CHECK(async == ncclRemoteError);
    RANK_NCCL(ncclCommDestroy(comm), ncclSuccess);
  }));
  CHECK(shm_leftovers().empty());
}

// ----- deferred streams (cuda_emu.h) ----------------------------------------------------------

using ddp_emu_test::DeferredStreams;

bool all_nan(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isnan(x); });
}

cudaStream_t new_stream(unsigned flags) {
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, flags) != cudaSuccess) throw std::runtime_error("stream");
  return s;
}

TEST_CASE("deferred mode: collectives queued on streams meet across forked ranks",
          "[nccl_emu][deferred]") {
  const int n = 3;
  const size_t count = 1000;  // four 1 KiB chunks
  const ncclUniqueId id = new_id();
  require_all_passed(run_ranks(n, {{"DDP_NCCL_EMU_CHUNK_BYTES", "1024"}}, [&](int rank) {
    ddp_emu::set_device_lag(kNever);  // what is queued stays so until the rank synchronises
    ddp_emu::set_stream_mode(ddp_emu::StreamMode::kDeferred);
    ncclComm_t comm = init_rank(n, id, rank);
    if (!comm) return;
    cudaStream_t stream = new_stream(cudaStreamNonBlocking);
    DeviceBuffer<float> send(count), recv(count), root_data(count);
    std::vector<float> in(count);
    for (size_t i = 0; i < count; ++i) in[i] = input<float>(ncclSum, rank, i);
    send.upload(in);
    root_data.upload(std::vector<float>(count, rank == 1 ? 42.0f : -1.0f));
    const int64_t before = ddp_nccl_emu::collective_count();
    RANK_NCCL(ncclAllReduce(send.get(), recv.get(), count, ncclFloat, ncclSum, comm, stream),
              ncclSuccess);
    RANK_NCCL(ncclBroadcast(root_data.get(), root_data.get(), count, ncclFloat, 1, comm, stream),
              ncclSuccess);
    RANK_CHECK(ddp_nccl_emu::collective_count() == before + 2);
    RANK_CHECK(ddp_emu::queued_operations(stream) == 2);
    // Nothing ran yet: the legacy stream does not wait for a non-blocking one, and asking NCCL
    // for its state runs nothing.
    RANK_CHECK(all_nan(recv.download()));
    ncclResult_t async = ncclInternalError;
    RANK_NCCL(ncclCommGetAsyncError(comm, &async), ncclSuccess);
    RANK_CHECK(async == ncclSuccess);
    RANK_CHECK(ddp_emu::queued_operations(stream) == 2);
    RANK_CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
    const std::vector<float> got = recv.download();
    size_t bad = 0;
    for (size_t i = 0; i < count; ++i) bad += got[i] != expected<float>(ncclSum, n, i);
    RANK_CHECK(bad == 0);
    RANK_CHECK(root_data.download() == std::vector<float>(count, 42.0f));

    // On a blocking stream, the legacy stream's next copy runs the collective.
    cudaStream_t blocking = new_stream(cudaStreamDefault);
    RANK_NCCL(ncclAllReduce(send.get(), send.get(), count, ncclFloat, ncclMax, comm, blocking),
              ncclSuccess);
    RANK_CHECK(ddp_emu::queued_operations(blocking) == 1);
    const std::vector<float> maxed = send.download();
    RANK_CHECK(ddp_emu::queued_operations(blocking) == 0);
    bad = 0;
    for (size_t i = 0; i < count; ++i) bad += maxed[i] != expected<float>(ncclMax, n, i);
    RANK_CHECK(bad == 0);
    RANK_CHECK(cudaStreamDestroy(stream) == cudaSuccess);
    RANK_CHECK(cudaStreamDestroy(blocking) == cudaSuccess);
    RANK_NCCL(ncclCommDestroy(comm), ncclSuccess);
  }));
  CHECK(shm_leftovers().empty());
}

// Rank 1 queues its allreduce and then waits for rank 0 outside CUDA and NCCL (a pipe here, an
// MPI collective in a trainer) without synchronising its stream; rank 0 synchronises on its own
// allreduce first. A device runs rank 1's collective anyway: the emulated one does so after the
// device lag. With the lag at "never" rank 0 waits until the emulation's timeout instead.
TEST_CASE("deferred mode: the device runs a collective its host never waits for",
          "[nccl_emu][deferred]") {
  int pipefd[2];
  REQUIRE(pipe(pipefd) == 0);
  const ncclUniqueId id = new_id();
  const std::vector<int> codes = run_ranks(2, {{"DDP_NCCL_EMU_TIMEOUT_S", "20"}}, [&](int rank) {
    ddp_emu::set_device_lag(0.05);
    ddp_emu::set_stream_mode(ddp_emu::StreamMode::kDeferred);
    ncclComm_t comm = init_rank(2, id, rank);
    if (!comm) return;
    cudaStream_t stream = new_stream(cudaStreamNonBlocking);
    DeviceBuffer<float> buf(100);
    buf.upload(std::vector<float>(100, 1.0f + rank));
    RANK_NCCL(ncclAllReduce(buf.get(), buf.get(), 100, ncclFloat, ncclSum, comm, stream),
              ncclSuccess);
    if (rank == 0) {
      const Clock::time_point t0 = Clock::now();
      RANK_CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
      RANK_CHECK(seconds_since(t0) < 10);  // not the emulation's timeout
      ncclResult_t async = ncclInternalError;
      RANK_NCCL(ncclCommGetAsyncError(comm, &async), ncclSuccess);
      RANK_CHECK(async == ncclSuccess);
      RANK_CHECK(buf.download() == std::vector<float>(100, 3.0f));
      RANK_CHECK(write(pipefd[1], "x", 1) == 1);
    } else {
      struct pollfd p = {pipefd[0], POLLIN, 0};
      RANK_CHECK(poll(&p, 1, 30000) == 1);  // rank 0 is done: the device ran this rank's part
      // ... or is finishing it still: wait for the queue to drain, synchronising nothing.
      RANK_CHECK(ddp_emu_test::drained_within(10, {stream}));
      RANK_CHECK(buf.download() == std::vector<float>(100, 3.0f));
    }
    RANK_CHECK(cudaStreamDestroy(stream) == cudaSuccess);
    RANK_NCCL(ncclCommDestroy(comm), ncclSuccess);
  });
  close(pipefd[0]);
  close(pipefd[1]);
  require_all_passed(codes);
  CHECK(shm_leftovers().empty());
}

TEST_CASE("deferred mode: an allreduce that does not wait for its producer reduces stale data",
          "[nccl_emu][deferred]") {
  DeferredStreams deferred;
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitRank(&comm, 1, new_id(), 0) == ncclSuccess);
  cudaStream_t compute = new_stream(cudaStreamDefault);
  cudaStream_t comm_stream = new_stream(cudaStreamNonBlocking);
  cudaEvent_t ready = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming) == cudaSuccess);
  // The producer writes the gradients on the compute stream; NCCL reduces them on its own.
  auto reduce = [&](bool wait) {
    DeviceBuffer<float> grads(64), out(64);
    const std::vector<float> g(64, 2.5f);
    REQUIRE(cudaMemcpyAsync(grads.get(), g.data(), 64 * sizeof(float), cudaMemcpyHostToDevice,
                            compute) == cudaSuccess);
    REQUIRE(cudaEventRecord(ready, compute) == cudaSuccess);
    if (wait) REQUIRE(cudaStreamWaitEvent(comm_stream, ready, 0) == cudaSuccess);
    CHECK(ncclAllReduce(grads.get(), out.get(), 64, ncclFloat, ncclSum, comm, comm_stream) ==
          ncclSuccess);
    CHECK(ddp_emu::queued_operations(compute) == 2);  // the call's checks ran nothing
    REQUIRE(cudaStreamSynchronize(comm_stream) == cudaSuccess);
    return out.download();
  };
  CHECK(reduce(true) == std::vector<float>(64, 2.5f));
  CHECK(all_nan(reduce(false)));
  REQUIRE(cudaEventDestroy(ready) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(compute) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(comm_stream) == cudaSuccess);
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
}

TEST_CASE("deferred mode: an injected failure happens when the queued allreduce runs",
          "[nccl_emu][deferred]") {
  ScopedEnv fail("DDP_NCCL_EMU_FAIL", "0:2");
  DeferredStreams deferred;
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitRank(&comm, 1, new_id(), 0) == ncclSuccess);
  cudaStream_t stream = new_stream(cudaStreamNonBlocking);
  DeviceBuffer<float> in(16), first(16), third(16);
  in.upload(std::vector<float>(16, 1.0f));
  CHECK(ncclAllReduce(in.get(), first.get(), 16, ncclFloat, ncclSum, comm, stream) == ncclSuccess);
  CHECK(ncclAllReduce(in.get(), in.get(), 16, ncclFloat, ncclSum, comm, stream) == ncclSuccess);
  CHECK(ncclAllReduce(in.get(), third.get(), 16, ncclFloat, ncclSum, comm, stream) == ncclSuccess);
  CHECK(ddp_emu::queued_operations(stream) == 3);
  ncclResult_t async = ncclInternalError;
  CHECK(ncclCommGetAsyncError(comm, &async) == ncclSuccess);
  CHECK(async == ncclSuccess);  // not run yet
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(ncclCommGetAsyncError(comm, &async) == ncclSuccess);
  CHECK(async == ncclSystemError);
  CHECK_THAT(ncclGetLastError(comm), Contains("injected failure of allreduce #2"));
  CHECK(first.download() == std::vector<float>(16, 1.0f));
  CHECK(all_nan(third.download()));  // queued behind the failure: never ran
  CHECK(ncclAllReduce(in.get(), in.get(), 16, ncclFloat, ncclSum, comm, stream) == ncclSystemError);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("deferred mode: a queued collective that times out sets the asynchronous error",
          "[nccl_emu][deferred]") {
  const ncclUniqueId id = new_id();
  require_all_passed(run_ranks(2, {{"DDP_NCCL_EMU_TIMEOUT_S", "1"}}, [&](int rank) {
    ddp_emu::set_device_lag(kNever);  // rank 1's collective must never run
    ddp_emu::set_stream_mode(ddp_emu::StreamMode::kDeferred);
    ncclComm_t comm = init_rank(2, id, rank);
    if (!comm) return;
    cudaStream_t stream = new_stream(cudaStreamNonBlocking);
    DeviceBuffer<float> buf(10);
    buf.upload(std::vector<float>(10, 1.0f + rank));
    RANK_NCCL(ncclAllReduce(buf.get(), buf.get(), 10, ncclFloat, ncclSum, comm, stream),
              ncclSuccess);
    if (rank == 1) {
      // Leaves without running its stream; the queued collective then does nothing.
      RANK_NCCL(ncclCommDestroy(comm), ncclSuccess);
      RANK_CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
      RANK_CHECK(buf.download() == std::vector<float>(10, 2.0f));
      RANK_CHECK(cudaStreamDestroy(stream) == cudaSuccess);
      return;
    }
    const Clock::time_point t0 = Clock::now();
    RANK_CHECK(cudaStreamSynchronize(stream) == cudaSuccess);  // no CUDA error: NCCL's own
    const double s = seconds_since(t0);
    RANK_CHECK(s >= 0.9);
    RANK_CHECK(s < 6.0);
    ncclResult_t async = ncclInternalError;
    RANK_NCCL(ncclCommGetAsyncError(comm, &async), ncclSuccess);
    RANK_CHECK(async == ncclRemoteError);
    RANK_CHECK(std::string(ncclGetLastError(comm)).find("missing ranks: 1") != std::string::npos);
    RANK_NCCL(ncclAllReduce(buf.get(), buf.get(), 10, ncclFloat, ncclSum, comm, stream),
              ncclRemoteError);
    RANK_NCCL(ncclCommAbort(comm), ncclSuccess);
    RANK_CHECK(cudaStreamDestroy(stream) == cudaSuccess);
  }));
  CHECK(shm_leftovers().empty());
}

TEST_CASE("deferred mode: finalize, destroy and several streams with queued collectives",
          "[nccl_emu][deferred]") {
  DeferredStreams deferred;
  cudaStream_t stream = new_stream(cudaStreamNonBlocking);
  DeviceBuffer<float> in(32), out(32);
  in.upload(std::vector<float>(32, 3.0f));

  SECTION("a non-blocking communicator finalizes once its queued collectives ran") {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t rc = ncclCommInitRankConfig(&comm, 1, new_id(), 0, &config);
    CHECK((rc == ncclInProgress || rc == ncclSuccess));
    ncclResult_t async = ncclInProgress;
    for (int i = 0; i < 100 && async == ncclInProgress; ++i) {
      REQUIRE(ncclCommGetAsyncError(comm, &async) == ncclSuccess);
    }
    REQUIRE(async == ncclSuccess);
    CHECK(ncclAllReduce(in.get(), out.get(), 32, ncclFloat, ncclAvg, comm, stream) == ncclSuccess);
    CHECK(ncclCommFinalize(comm) == ncclInProgress);
    CHECK(ncclCommGetAsyncError(comm, &async) == ncclSuccess);
    CHECK(async == ncclInProgress);
    CHECK(ddp_emu::queued_operations(stream) == 1);
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(ncclCommGetAsyncError(comm, &async) == ncclSuccess);
    CHECK(async == ncclSuccess);
    CHECK(out.download() == std::vector<float>(32, 3.0f));
    CHECK(ncclCommDestroy(comm) == ncclSuccess);
  }
  SECTION("a collective queued for a destroyed communicator does nothing") {
    for (bool abort : {false, true}) {
      ncclComm_t comm = nullptr;
      REQUIRE(ncclCommInitRank(&comm, 1, new_id(), 0) == ncclSuccess);
      CHECK(ncclBroadcast(in.get(), out.get(), 32, ncclFloat, 0, comm, stream) == ncclSuccess);
      CHECK((abort ? ncclCommAbort(comm) : ncclCommDestroy(comm)) == ncclSuccess);
      CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
      CHECK(all_nan(out.download()));
    }
  }
  SECTION("collectives of one communicator on two streams, run by two threads") {
    // 64-byte chunks: every collective stages hundreds of chunks, so two running at once would
    // overwrite each other's staging slots.
    ScopedEnv chunk("DDP_NCCL_EMU_CHUNK_BYTES", "64");
    ncclComm_t comm = nullptr;
    REQUIRE(ncclCommInitRank(&comm, 1, new_id(), 0) == ncclSuccess);
    cudaStream_t other = new_stream(cudaStreamNonBlocking);
    const int per_stream = 20;
    const size_t count = 4000;
    std::vector<std::unique_ptr<DeviceBuffer<float>>> bufs;
    for (int i = 0; i < 2 * per_stream; ++i) {
      bufs.push_back(std::make_unique<DeviceBuffer<float>>(count));
      bufs.back()->upload(std::vector<float>(count, static_cast<float>(i)));
    }
    for (int i = 0; i < 2 * per_stream; ++i) {
      float* b = bufs[static_cast<size_t>(i)]->get();
      CHECK(ncclAllReduce(b, b, count, ncclFloat, ncclMax, comm, i % 2 ? other : stream) ==
            ncclSuccess);
    }
    std::thread a([&] { (void)cudaStreamSynchronize(stream); });
    std::thread b([&] { (void)cudaStreamSynchronize(other); });
    a.join();
    b.join();
    int wrong = 0;
    for (int i = 0; i < 2 * per_stream; ++i) {
      wrong += bufs[static_cast<size_t>(i)]->download() !=
               std::vector<float>(count, static_cast<float>(i));
    }
    CHECK(wrong == 0);
    REQUIRE(cudaStreamDestroy(other) == cudaSuccess);
    CHECK(ncclCommDestroy(comm) == ncclSuccess);
  }
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("deferred mode: ranks in threads run their own streams", "[nccl_emu][deferred]") {
  DeferredStreams deferred;
  const int n = 2;
  const ncclUniqueId id = new_id();
  std::vector<ncclComm_t> comms(n, nullptr);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < n; ++r) REQUIRE(ncclCommInitRank(&comms[r], n, id, r) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  std::vector<int> failures(n, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      t_rank = r;
      t_failures = 0;
      cudaStream_t stream = new_stream(cudaStreamNonBlocking);
      DeviceBuffer<double> buf(300);
      std::vector<double> in(300);
      for (size_t i = 0; i < in.size(); ++i) in[i] = input<double>(ncclSum, r, i);
      for (int iter = 0; iter < 10; ++iter) {
        buf.upload(in);
        RANK_NCCL(ncclAllReduce(buf.get(), buf.get(), 300, ncclDouble, ncclSum, comms[r], stream),
                  ncclSuccess);
        RANK_CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
        const std::vector<double> got = buf.download();
        for (size_t i = 0; i < got.size(); ++i)
          RANK_CHECK(got[i] == expected<double>(ncclSum, n, i));
      }
      RANK_CHECK(cudaStreamDestroy(stream) == cudaSuccess);
      failures[r] = t_failures;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) CHECK(failures[r] == 0);
  for (ncclComm_t c : comms) CHECK(ncclCommDestroy(c) == ncclSuccess);
}

}  // namespace
