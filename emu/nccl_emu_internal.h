// Private to the files of the emulated NCCL: the shared segment's layout, the process-local
// side of a communicator (struct ncclComm), and the functions one file calls in another, in
// ddp_nccl_emu::detail.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <sstream>
#include <string>

#include "nccl_emu.h"

namespace ddp_nccl_emu {
namespace detail {

using Clock = std::chrono::steady_clock;

constexpr char kIdTag[] = "ddp-nccl-emu-id:";
constexpr char kShmPrefix[] = "ddp_nccl_emu_";
constexpr uint64_t kReadyMagic = 0x3163636e70706464ull;  // "ddpnccl1"
constexpr size_t kDefaultChunkBytes = size_t{1} << 20;
constexpr size_t kMinChunkBytes = 64;
constexpr size_t kMaxChunkBytes = size_t{1} << 30;
constexpr double kDefaultTimeoutS = 300.0;

// Why a communicator is broken for every rank; packed with the rank that broke it.
enum BrokenReason : uint32_t {
  kNotBroken = 0,
  kBrokenTimeout = 1,
  kBrokenAbort = 2,
  kBrokenLeft = 3,
};

enum CollectiveKind : int32_t {
  kAllReduce = 1,
  kBroadcast = 2,
  kReduceScatter = 3,
  kAllGather = 4
};

// What a rank is doing in a collective, compared across ranks to turn mismatched calls into an
// error instead of undefined results.
struct Descriptor {
  uint64_t seq;
  uint64_t count;
  int32_t kind;
  int32_t datatype;
  int32_t op;
  int32_t root;
};

struct alignas(64) RankInfo {
  std::atomic<uint32_t> joined;
  std::atomic<uint64_t> barriers;  // barriers this rank has reached, to name missing peers
  // Two descriptors by collective parity: a fast rank writes the next one while slow peers may
  // still be reading this one.
  Descriptor desc[2];
};

// The start of the shared segment. Zero-filled memory is a valid initial state for its atomics.
struct alignas(64) Header {
  std::atomic<uint64_t> ready;  // kReadyMagic once the creator filled in the fields below
  int32_t nranks;
  uint32_t pad;
  uint64_t chunk_bytes;
  uint64_t total_bytes;
  std::atomic<uint32_t> arrived;    // ranks that joined; futex word of the init wait
  std::atomic<uint32_t> bar_count;  // ranks waiting at the current barrier
  std::atomic<uint32_t> bar_gen;    // barriers completed; futex word of the barrier wait
  std::atomic<uint32_t> broken;     // (reason << 24) | (rank + 1), or 0
};

static_assert(std::atomic<uint32_t>::is_always_lock_free, "process-shared atomics need lock-free");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "process-shared atomics need lock-free");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex words are 32-bit");

enum CommState : int { kJoining = 0, kReady = 1, kFinalized = 2 };

struct EnvSettings {
  double timeout_s = kDefaultTimeoutS;
  size_t chunk_bytes = kDefaultChunkBytes;
  int fail_rank = -1;
  int64_t fail_at = 0;
};

template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream os;
  (void)std::initializer_list<int>{((os << parts), 0)...};
  return os.str();
}

// ----- errors and the live communicators (nccl_emu_comm.cpp) -----------------------------------

// Records message as the last error (ncclGetLastError) and returns code.
ncclResult_t fail(ncclResult_t code, const std::string& message);
void set_async(ncclComm* c, ncclResult_t code);
bool is_live(ncclComm* c);
// ncclGetErrorString's text, without counting a call.
const char* result_string(ncclResult_t result);
ncclComm* enter_live(ncclComm* c, uint64_t serial);
void leave_live(ncclComm* c);
// Non-blocking check of a joining communicator; c->mu held.
void poll_join_locked(ncclComm* c);

// ----- the shared segment (nccl_emu_shm.cpp) ---------------------------------------------------

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, Clock::duration d);
void futex_wake(std::atomic<uint32_t>* word);
void mark_broken(ncclComm* c, BrokenReason reason);
// Why the segment is broken, for a message.
std::string broken_text(uint32_t broken);
// The ranks for which missing(c, r) holds, as "1,3" (or "none").
std::string missing_ranks(ncclComm* c, bool (*missing)(ncclComm*, int));
void unmap(ncclComm* c);
ncclResult_t join(ncclComm* c, const EnvSettings& env);
ncclResult_t barrier(ncclComm* c, const char* what);

enum class Wait { kDone, kBroken, kTimeout };

// Waits until done() holds, the segment is broken or the deadline passes, sleeping on the futex
// word that the peer completing the wait changes. No spinning: ranks often outnumber cores, and
// measured under CPU load a spinning or sched_yield-ing waiter made every barrier cost a
// scheduler time slice, while a futex sleeper is woken (and scheduled) at once.
template <class Done>
Wait wait_until(Header* h, std::atomic<uint32_t>* word, Done done, Clock::time_point deadline) {
  for (;;) {
    const uint32_t seen = word->load(std::memory_order_acquire);
    if (done()) return Wait::kDone;
    if (h->broken.load(std::memory_order_acquire) != 0) return Wait::kBroken;
    const auto now = Clock::now();
    if (now >= deadline) return Wait::kTimeout;
    // The futex returns at once if the word changed since it was read; the bound only matters
    // for a broken flag set between the check above and the sleep.
    futex_wait(word, seen,
               std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(50)));
  }
}

// ----- types and reductions (nccl_emu_reductions.cpp) -------------------------------------------

size_t type_size(ncclDataType_t t);
const char* type_name(ncclDataType_t t);
// Whether the emulation reduces type t (not the 8-bit floats).
bool reducible(ncclDataType_t t);
// out = slot[0] op slot[1] op ... op slot[n-1] of slot set `set`, m elements of type t.
void reduce_any(ncclDataType_t t, ncclRedOp_t op, const ncclComm* c, size_t set, void* out,
                size_t m);

}  // namespace detail
}  // namespace ddp_nccl_emu

// The emulation's files name these unqualified, as when they were one file's anonymous namespace
// (which is a using-directive too).
using namespace ddp_nccl_emu::detail;

// The process-local side of a communicator (the shared side is the segment).
struct ncclComm {
  uint64_t serial = 0;  // tells this communicator from a later one that got the same address
  std::string name;     // shared-memory name, with the leading '/'
  int nranks = 0;
  int rank = 0;
  int device = 0;
  bool blocking = true;
  double timeout_s = kDefaultTimeoutS;
  int fail_rank = -1;
  int64_t fail_at = 0;
  unsigned char* base = nullptr;
  size_t map_bytes = 0;
  Header* hdr = nullptr;
  RankInfo* ranks = nullptr;
  unsigned char* slots = nullptr;
  size_t chunk_bytes = 0;
  // Guards state changes made by init polling, finalize and release (a watchdog thread may poll
  // ncclCommGetAsyncError while the owner thread works).
  std::mutex mu;
  std::atomic<int> state{kJoining};
  std::atomic<int> async_error{ncclSuccess};
  Clock::time_point init_deadline;
  bool all_joined = false;  // seen every rank arrive, so the name is already unlinked
  // Held while a collective runs, so collectives queued on several streams (drained by
  // several threads) still run one at a time; guards the sequence numbers below.
  std::mutex run_mu;
  uint64_t coll_seq = 0;
  uint64_t chunk_seq = 0;
  uint64_t barrier_seq = 0;
  int64_t allreduce_calls = 0;
  std::atomic<int64_t> queued{0};  // collectives queued on a stream that have not run
  int active = 0;                  // queued collectives running now; guarded by g_live_mu

  Clock::duration timeout() const {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  }
  unsigned char* slot(size_t set, int r) const {
    return slots + (set * static_cast<size_t>(nranks) + static_cast<size_t>(r)) * chunk_bytes;
  }
};
