// Communicators: init (every rank's rendezvous, blocking or not, inside a group or not), finalize,
// destroy and abort, the communicators alive in this process, errors (the last message, each
// communicator's asynchronous error) and the queries (count, device, rank).
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cuda_emu_internal.h"
#include "nccl_emu_internal.h"

namespace {

std::mutex g_error_mu;
std::string g_last_error;
// Live communicators; g_live_cv is notified when a queued collective stops running.
std::mutex g_live_mu;
std::condition_variable g_live_cv;
std::set<ncclComm*> g_live;
std::atomic<uint64_t> g_id_counter{0};
std::atomic<uint64_t> g_comm_serial{0};

thread_local int g_group_depth = 0;
thread_local std::vector<ncclComm*> g_group_pending;

ncclResult_t read_env(EnvSettings* s) {
  if (const char* v = std::getenv("DDP_NCCL_EMU_TIMEOUT_S")) {
    char* end = nullptr;
    errno = 0;
    const double t = std::strtod(v, &end);
    if (end == v || *end != '\0' || errno != 0 || !std::isfinite(t) || t <= 0 || t > 1e6) {
      return fail(ncclInvalidArgument,
                  cat("DDP_NCCL_EMU_TIMEOUT_S='", v, "' is not a number of seconds in (0, 1e6]"));
    }
    s->timeout_s = t;
  }
  if (const char* v = std::getenv("DDP_NCCL_EMU_CHUNK_BYTES")) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long b = std::strtoull(v, &end, 10);
    if (end == v || *end != '\0' || errno != 0 || v[0] == '-' || b < kMinChunkBytes ||
        b > kMaxChunkBytes) {
      return fail(ncclInvalidArgument,
                  cat("DDP_NCCL_EMU_CHUNK_BYTES='", v, "' is not a byte count in [", kMinChunkBytes,
                      ", ", kMaxChunkBytes, "]"));
    }
    s->chunk_bytes = static_cast<size_t>(b) & ~size_t{63};  // keeps every type's slots aligned
  }
  if (const char* v = std::getenv("DDP_NCCL_EMU_FAIL")) {
    char* end = nullptr;
    errno = 0;
    const long r = std::strtol(v, &end, 10);
    bool ok = end != v && *end == ':' && errno == 0 && r >= 0 && r < INT_MAX;
    long long n = 0;
    if (ok) {
      const char* p = end + 1;
      n = std::strtoll(p, &end, 10);
      ok = end != p && *end == '\0' && errno == 0 && n >= 1;
    }
    if (!ok) {
      return fail(ncclInvalidArgument,
                  cat("DDP_NCCL_EMU_FAIL='", v, "' is not RANK:N (RANK >= 0, N >= 1)"));
    }
    s->fail_rank = static_cast<int>(r);
    s->fail_at = n;
  }
  return ncclSuccess;
}

bool not_joined(ncclComm* c, int r) {
  return c->ranks[r].joined.load(std::memory_order_acquire) == 0;
}

// Called when the init wait ends without every rank: nobody will complete the rendezvous, so
// release the name and let waiting peers go.
ncclResult_t give_up_init(ncclComm* c, Wait why) {
  const uint32_t broken = c->hdr->broken.load(std::memory_order_acquire);
  std::string message;
  if (why == Wait::kBroken) {
    message = cat("rank ", c->rank, ": init failed because ", broken_text(broken));
  } else {
    message = cat("rank ", c->rank, ": only ", c->hdr->arrived.load(), " of ", c->nranks,
                  " ranks joined within ", c->timeout_s,
                  " s (missing ranks: ", missing_ranks(c, not_joined), ")");
    mark_broken(c, kBrokenTimeout);
  }
  shm_unlink(c->name.c_str());
  c->all_joined = true;  // unlinked: nothing left to release
  set_async(c, ncclRemoteError);
  return fail(ncclRemoteError, message);
}

// Blocking wait for every rank to join; c->mu held.
ncclResult_t wait_join_locked(ncclComm* c) {
  if (c->state.load() != kJoining) return static_cast<ncclResult_t>(c->async_error.load());
  if (c->async_error.load() != ncclSuccess) return static_cast<ncclResult_t>(c->async_error.load());
  Header* h = c->hdr;
  const Wait w = wait_until(
      h, &h->arrived,
      [&] {
        return h->arrived.load(std::memory_order_acquire) >= static_cast<uint32_t>(c->nranks);
      },
      c->init_deadline);
  if (w != Wait::kDone) return give_up_init(c, w);
  c->all_joined = true;
  c->state.store(kReady);
  return ncclSuccess;
}

// Collectives still queued for c find it gone and do nothing; one running in another thread is
// waited for (an abort has released it from its barrier by then).
void release(ncclComm* c, bool abort) {
  {
    std::lock_guard<std::mutex> lk(g_live_mu);
    g_live.erase(c);
  }
  {
    std::lock_guard<std::mutex> lk(c->mu);
    if (c->hdr) {
      if (!c->all_joined &&
          c->hdr->arrived.load(std::memory_order_acquire) < static_cast<uint32_t>(c->nranks)) {
        // Leaving before the rendezvous completed: the peers can never complete it.
        mark_broken(c, abort ? kBrokenAbort : kBrokenLeft);
        shm_unlink(c->name.c_str());
      } else if (abort) {
        mark_broken(c, kBrokenAbort);
      }
    }
  }
  {
    std::unique_lock<std::mutex> lk(g_live_mu);
    g_live_cv.wait(lk, [c] { return c->active == 0; });
  }
  {
    std::lock_guard<std::mutex> lk(c->mu);
    unmap(c);
  }
  delete c;
}

bool parse_id(const ncclUniqueId& id, std::string* name) {
  const size_t tag = sizeof(kIdTag) - 1;
  if (std::memcmp(id.internal, kIdTag, tag) != 0) return false;
  const void* nul = std::memchr(id.internal + tag, '\0', NCCL_UNIQUE_ID_BYTES - tag);
  if (!nul) return false;
  *name = std::string(id.internal + tag);
  return name->size() > sizeof(kShmPrefix) && (*name)[0] == '/' &&
         name->compare(1, sizeof(kShmPrefix) - 1, kShmPrefix) == 0 &&
         name->find('/', 1) == std::string::npos;
}

ncclResult_t comm_query(const char* fn, const ncclComm* c, const void* out) {
  if (!c) return fail(ncclInvalidArgument, cat(fn, ": comm is NULL"));
  if (!out) return fail(ncclInvalidArgument, cat(fn, ": output pointer is NULL"));
  if (!is_live(const_cast<ncclComm*>(c))) {
    return fail(ncclInvalidArgument, cat(fn, ": comm is not a live communicator (destroyed?)"));
  }
  return ncclSuccess;
}

}  // namespace

namespace ddp_nccl_emu {
namespace detail {

ncclResult_t fail(ncclResult_t code, const std::string& message) {
  std::lock_guard<std::mutex> lk(g_error_mu);
  g_last_error = "nccl emulation: " + message;
  return code;
}

// Keeps the first asynchronous error: later ones are consequences.
void set_async(ncclComm* c, ncclResult_t code) {
  int expected = ncclSuccess;
  c->async_error.compare_exchange_strong(expected, code);
}

bool is_live(ncclComm* c) {
  std::lock_guard<std::mutex> lk(g_live_mu);
  return g_live.count(c) > 0;
}

// For a queued collective about to run: the communicator if it is still the live one it was
// queued for, marked active so that destroying it waits until leave_live.
ncclComm* enter_live(ncclComm* c, uint64_t serial) {
  std::lock_guard<std::mutex> lk(g_live_mu);
  if (g_live.count(c) == 0 || c->serial != serial) return nullptr;
  ++c->active;
  return c;
}

void leave_live(ncclComm* c) {
  std::lock_guard<std::mutex> lk(g_live_mu);
  --c->active;
  g_live_cv.notify_all();
}

// Non-blocking check of a joining communicator; c->mu held.
void poll_join_locked(ncclComm* c) {
  if (c->state.load() != kJoining || c->async_error.load() != ncclSuccess) return;
  Header* h = c->hdr;
  if (h->arrived.load(std::memory_order_acquire) >= static_cast<uint32_t>(c->nranks)) {
    c->all_joined = true;
    c->state.store(kReady);
  } else if (h->broken.load(std::memory_order_acquire) != 0) {
    give_up_init(c, Wait::kBroken);
  } else if (Clock::now() >= c->init_deadline) {
    give_up_init(c, Wait::kTimeout);
  }
}

const char* result_string(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

}  // namespace detail
}  // namespace ddp_nccl_emu

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  DDP_EMU_COUNT_CALL();
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  DDP_EMU_COUNT_CALL();
  if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  uint64_t random = 0;
  try {
    std::random_device rd;
    random = (uint64_t{rd()} << 32) ^ rd();
  } catch (...) {
    random = static_cast<uint64_t>(Clock::now().time_since_epoch().count()) * 0x9e3779b97f4a7c15ull;
  }
  // The counter keeps ids of one process distinct even if random bits repeat.
  random ^= g_id_counter.fetch_add(1) * 0x9e3779b97f4a7c15ull;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  char name[96];
  std::snprintf(name, sizeof(name), "/%s%d_%016llx_%llx", kShmPrefix, static_cast<int>(getpid()),
                static_cast<unsigned long long>(random), static_cast<unsigned long long>(ns));
  std::memset(uniqueId->internal, 0, sizeof(uniqueId->internal));
  std::snprintf(uniqueId->internal, sizeof(uniqueId->internal), "%s%s", kIdTag, name);
  return ncclSuccess;
}

// Both init calls, counted as the one the caller made.
static ncclResult_t init_comm(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                              ncclConfig_t* config) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  *comm = nullptr;
  if (nranks < 1) {
    return fail(ncclInvalidArgument, cat("ncclCommInitRank: nranks=", nranks, " is not >= 1"));
  }
  if (rank < 0 || rank >= nranks) {
    return fail(ncclInvalidArgument,
                cat("ncclCommInitRank: rank=", rank, " is not in [0, ", nranks, ")"));
  }
  if (nranks >= (1 << 24)) {
    return fail(ncclInvalidArgument, cat("ncclCommInitRank: nranks=", nranks, " is too large"));
  }
  bool blocking = true;
  if (config) {
    if (config->magic != 0xcafebeef || config->size != sizeof(ncclConfig_t)) {
      return fail(ncclInvalidArgument,
                  "ncclCommInitRankConfig: config was not set from NCCL_CONFIG_INITIALIZER");
    }
    if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 &&
        config->blocking != 1) {
      return fail(ncclInvalidArgument,
                  cat("ncclCommInitRankConfig: blocking=", config->blocking, " is not 0 or 1"));
    }
    blocking = config->blocking != 0;
  }
  std::string name;
  if (!parse_id(commId, &name)) {
    return fail(ncclInvalidArgument, "ncclCommInitRank: commId was not made by ncclGetUniqueId");
  }
  EnvSettings env;
  const ncclResult_t env_rc = read_env(&env);
  if (env_rc != ncclSuccess) return env_rc;

  auto* c = new ncclComm();
  c->serial = g_comm_serial.fetch_add(1) + 1;
  c->name = name;
  c->nranks = nranks;
  c->rank = rank;
  c->blocking = blocking;
  c->timeout_s = env.timeout_s;
  c->fail_rank = env.fail_rank;
  c->fail_at = env.fail_at;
  {
    const cudaError_t before = cudaPeekAtLastError();
    if (cudaGetDevice(&c->device) != cudaSuccess) {
      if (before == cudaSuccess) (void)cudaGetLastError();
      c->device = 0;
    }
  }
  const ncclResult_t rc = join(c, env);
  if (rc != ncclSuccess) {
    delete c;
    return rc;
  }
  c->init_deadline = Clock::now() + c->timeout();
  {
    std::lock_guard<std::mutex> lk(g_live_mu);
    g_live.insert(c);
  }
  if (g_group_depth > 0) {
    // Inside a group the rendezvous completes in ncclGroupEnd, so one thread may create the
    // ranks of a communicator one after another.
    g_group_pending.push_back(c);
    *comm = c;
    return blocking ? ncclSuccess : ncclInProgress;
  }
  if (!blocking) {
    *comm = c;
    return ncclInProgress;
  }
  ncclResult_t wait_rc;
  {
    std::lock_guard<std::mutex> lk(c->mu);
    wait_rc = wait_join_locked(c);
  }
  if (wait_rc != ncclSuccess) {
    release(c, false);
    return wait_rc;
  }
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  DDP_EMU_COUNT_CALL();
  return init_comm(comm, nranks, commId, rank, config);
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  DDP_EMU_COUNT_CALL();
  return init_comm(comm, nranks, commId, rank, nullptr);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  DDP_EMU_COUNT_CALL();
  if (!comm) return fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
  if (!is_live(comm)) {
    return fail(ncclInvalidArgument, "ncclCommFinalize: comm is not a live communicator");
  }
  std::lock_guard<std::mutex> lk(comm->mu);
  poll_join_locked(comm);
  const int state = comm->state.load();
  if (state == kFinalized) {
    return fail(ncclInvalidUsage,
                cat("ncclCommFinalize: rank ", comm->rank, ": already finalized"));
  }
  if (state == kJoining && comm->async_error.load() == ncclSuccess) {
    return fail(ncclInvalidUsage,
                cat("ncclCommFinalize: rank ", comm->rank, ": init is still in progress"));
  }
  comm->state.store(kFinalized);
  return comm->blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  DDP_EMU_COUNT_CALL();
  if (!comm) return ncclSuccess;
  if (!is_live(comm)) {
    return fail(ncclInvalidArgument, "ncclCommDestroy: comm is not a live communicator");
  }
  release(comm, false);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  DDP_EMU_COUNT_CALL();
  if (!comm) return ncclSuccess;
  if (!is_live(comm)) {
    return fail(ncclInvalidArgument, "ncclCommAbort: comm is not a live communicator");
  }
  release(comm, true);
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  DDP_EMU_COUNT_CALL();
  return result_string(result);
}

const char* ncclGetLastError(ncclComm_t) {
  DDP_EMU_COUNT_CALL();
  // A copy per thread, so the pointer stays valid while other threads record errors.
  thread_local std::string copy;
  std::lock_guard<std::mutex> lk(g_error_mu);
  copy = g_last_error;
  return copy.c_str();
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  DDP_EMU_COUNT_CALL();
  const ncclResult_t rc = comm_query("ncclCommGetAsyncError", comm, asyncError);
  if (rc != ncclSuccess) return rc;
  std::lock_guard<std::mutex> lk(comm->mu);
  poll_join_locked(comm);
  const auto e = static_cast<ncclResult_t>(comm->async_error.load());
  const int state = comm->state.load();
  if (e != ncclSuccess) {
    *asyncError = e;
  } else if (state == kJoining ||
             (state == kFinalized && !comm->blocking && comm->queued.load() > 0)) {
    // Still joining, or finalized with collectives still queued (nothing here runs them).
    *asyncError = ncclInProgress;
  } else {
    *asyncError = ncclSuccess;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  DDP_EMU_COUNT_CALL();
  const ncclResult_t rc = comm_query("ncclCommCount", comm, count);
  if (rc == ncclSuccess) *count = comm->nranks;
  return rc;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  DDP_EMU_COUNT_CALL();
  const ncclResult_t rc = comm_query("ncclCommCuDevice", comm, device);
  if (rc == ncclSuccess) *device = comm->device;
  return rc;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  DDP_EMU_COUNT_CALL();
  const ncclResult_t rc = comm_query("ncclCommUserRank", comm, rank);
  if (rc == ncclSuccess) *rank = comm->rank;
  return rc;
}

ncclResult_t ncclGroupStart() {
  DDP_EMU_COUNT_CALL();
  ++g_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  DDP_EMU_COUNT_CALL();
  if (g_group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g_group_depth > 0) return ncclSuccess;
  std::vector<ncclComm*> pending;
  pending.swap(g_group_pending);
  ncclResult_t result = ncclSuccess;
  for (ncclComm* c : pending) {
    if (!is_live(c)) continue;  // destroyed inside the group
    std::lock_guard<std::mutex> lk(c->mu);
    ncclResult_t rc;
    if (c->blocking) {
      rc = wait_join_locked(c);
    } else {
      poll_join_locked(c);
      rc = static_cast<ncclResult_t>(c->async_error.load());
      if (rc == ncclSuccess && c->state.load() == kJoining) rc = ncclInProgress;
    }
    if (result == ncclSuccess || result == ncclInProgress) {
      if (rc != ncclSuccess) result = rc;
    }
  }
  return result;
}

}  // extern "C"

namespace ddp_nccl_emu {

int64_t live_communicators() {
  std::lock_guard<std::mutex> lk(g_live_mu);
  return static_cast<int64_t>(g_live.size());
}

const char* shm_prefix() { return kShmPrefix; }

}  // namespace ddp_nccl_emu
