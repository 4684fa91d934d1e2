// The engine behind nccl_emu.h: the shared-memory rendezvous of the ranks of a communicator, the
// process-shared barrier with its timeout, the chunked collectives that every rank reduces in
// rank order (at call time or queued on a deferred stream), argument checks, asynchronous errors
// and fault injection.
#include "nccl_emu.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
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
#include <new>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace {

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

size_t align64(size_t n) { return (n + 63) & ~size_t{63}; }

struct Layout {
  size_t ranks_offset;
  size_t slots_offset;
  size_t total;
};

Layout layout(int nranks, size_t chunk_bytes) {
  Layout l;
  l.ranks_offset = align64(sizeof(Header));
  l.slots_offset = align64(l.ranks_offset + sizeof(RankInfo) * static_cast<size_t>(nranks));
  // Two slot sets (alternating by chunk) so one barrier per chunk suffices.
  l.total = l.slots_offset + 2 * static_cast<size_t>(nranks) * chunk_bytes;
  return l;
}

enum CommState : int { kJoining = 0, kReady = 1, kFinalized = 2 };

}  // namespace

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

namespace {

std::mutex g_error_mu;
std::string g_last_error;
std::atomic<int64_t> g_collectives{0};
// Live communicators; g_live_cv is notified when a queued collective stops running.
std::mutex g_live_mu;
std::condition_variable g_live_cv;
std::set<ncclComm*> g_live;
std::atomic<uint64_t> g_id_counter{0};
std::atomic<uint64_t> g_comm_serial{0};

thread_local int g_group_depth = 0;
thread_local std::vector<ncclComm*> g_group_pending;

template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream os;
  (void)std::initializer_list<int>{((os << parts), 0)...};
  return os.str();
}

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

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, Clock::duration d) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void sleep_ms(int ms) {
  timespec ts{0, static_cast<long>(ms) * 1000000};
  nanosleep(&ts, nullptr);
}

// Marks the segment broken for every rank (first reason wins) and wakes every waiter.
void mark_broken(ncclComm* c, BrokenReason reason) {
  uint32_t expected = 0;
  c->hdr->broken.compare_exchange_strong(
      expected, (uint32_t{reason} << 24) | static_cast<uint32_t>(c->rank + 1));
  futex_wake(&c->hdr->arrived);
  futex_wake(&c->hdr->bar_gen);
}

std::string broken_text(uint32_t broken) {
  const uint32_t reason = broken >> 24;
  const int by = static_cast<int>(broken & 0xffffff) - 1;
  if (reason == kBrokenAbort) return cat("rank ", by, " aborted the communicator");
  if (reason == kBrokenLeft) {
    return cat("rank ", by, " destroyed its communicator before every rank joined");
  }
  return cat("rank ", by, " gave up waiting for its peers");
}

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

std::string missing_ranks(ncclComm* c, bool (*missing)(ncclComm*, int)) {
  std::string out;
  for (int r = 0; r < c->nranks; ++r) {
    if (missing(c, r)) out += (out.empty() ? "" : ",") + std::to_string(r);
  }
  return out.empty() ? "none" : out;
}

// ----- init -----------------------------------------------------------------------------------

struct EnvSettings {
  double timeout_s = kDefaultTimeoutS;
  size_t chunk_bytes = kDefaultChunkBytes;
  int fail_rank = -1;
  int64_t fail_at = 0;
};

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

void unmap(ncclComm* c) {
  if (c->base) munmap(c->base, c->map_bytes);
  c->base = nullptr;
  c->hdr = nullptr;
}

ncclResult_t create_segment(ncclComm* c, int fd, const EnvSettings& env) {
  const Layout l = layout(c->nranks, env.chunk_bytes);
  // posix_fallocate reserves the pages now, so a full /dev/shm is an error here instead of a
  // SIGBUS at the first touch.
  const int rc = posix_fallocate(fd, 0, static_cast<off_t>(l.total));
  if (rc != 0) {
    return fail(ncclSystemError, cat("cannot reserve ", l.total, " bytes of shared memory for ",
                                     c->nranks, " ranks (", std::strerror(rc),
                                     "); is /dev/shm large enough? DDP_NCCL_EMU_CHUNK_BYTES "
                                     "sets the staging chunk per rank"));
  }
  void* p = mmap(nullptr, l.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail(ncclSystemError, cat("mmap: ", std::strerror(errno)));
  c->base = static_cast<unsigned char*>(p);
  c->map_bytes = l.total;
  Header* h = new (p) Header();
  for (int r = 0; r < c->nranks; ++r)
    new (c->base + l.ranks_offset + sizeof(RankInfo) * r) RankInfo();
  h->nranks = c->nranks;
  h->chunk_bytes = env.chunk_bytes;
  h->total_bytes = l.total;
  h->ready.store(kReadyMagic, std::memory_order_release);
  return ncclSuccess;
}

ncclResult_t open_segment(ncclComm* c, int fd, Clock::time_point deadline) {
  // The creator sizes the segment right after creating it, then fills in the header: wait for
  // both through a mapping of the header alone, then map the size the header gives.
  struct stat st {};
  for (;;) {
    if (fstat(fd, &st) != 0) return fail(ncclSystemError, cat("fstat: ", std::strerror(errno)));
    if (static_cast<size_t>(st.st_size) >= sizeof(Header)) break;
    if (Clock::now() >= deadline) {
      return fail(ncclRemoteError, cat("rank ", c->rank, ": the rank that created ", c->name,
                                       " did not size it within ", c->timeout_s, " s"));
    }
    sleep_ms(1);
  }
  void* p = mmap(nullptr, sizeof(Header), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail(ncclSystemError, cat("mmap: ", std::strerror(errno)));
  c->base = static_cast<unsigned char*>(p);
  c->map_bytes = sizeof(Header);
  const Header* h = static_cast<const Header*>(p);
  while (h->ready.load(std::memory_order_acquire) != kReadyMagic) {
    if (Clock::now() >= deadline) {
      return fail(ncclRemoteError, cat("rank ", c->rank, ": the rank that created ", c->name,
                                       " did not initialise it within ", c->timeout_s, " s"));
    }
    sleep_ms(1);
  }
  const int nranks = h->nranks;
  const size_t total = static_cast<size_t>(h->total_bytes);
  const size_t chunk = static_cast<size_t>(h->chunk_bytes);
  unmap(c);
  if (nranks != c->nranks) {
    return fail(ncclInvalidUsage, cat("rank ", c->rank, " was given nranks=", c->nranks,
                                      " but the communicator was created with nranks=", nranks));
  }
  if (fstat(fd, &st) != 0) return fail(ncclSystemError, cat("fstat: ", std::strerror(errno)));
  if (layout(nranks, chunk).total != total || static_cast<size_t>(st.st_size) < total) {
    return fail(ncclInternalError, cat("shared segment ", c->name, " has an inconsistent size"));
  }
  p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail(ncclSystemError, cat("mmap: ", std::strerror(errno)));
  c->base = static_cast<unsigned char*>(p);
  c->map_bytes = total;
  return ncclSuccess;
}

// Creates or opens the segment, maps it and counts this rank in. Does not wait for the peers.
ncclResult_t join(ncclComm* c, const EnvSettings& env) {
  const Clock::time_point deadline = Clock::now() + c->timeout();
  ncclResult_t rc = ncclSuccess;
  bool created = false;
  for (;;) {
    int fd = shm_open(c->name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) {
      created = true;
      rc = create_segment(c, fd, env);
      close(fd);
      break;
    }
    if (errno != EEXIST) {
      return fail(ncclSystemError, cat("shm_open(", c->name, "): ", std::strerror(errno)));
    }
    fd = shm_open(c->name.c_str(), O_RDWR, 0);
    if (fd < 0) {
      // The name went away between the two calls (a rank gave up and unlinked it): try again.
      if (errno == ENOENT && Clock::now() < deadline) continue;
      return fail(ncclSystemError, cat("shm_open(", c->name, "): ", std::strerror(errno)));
    }
    rc = open_segment(c, fd, deadline);
    close(fd);
    break;
  }
  if (rc != ncclSuccess) {
    // A creator that failed, or a joiner whose creator never finished: nobody else will use
    // the name.
    if (created || rc == ncclRemoteError) shm_unlink(c->name.c_str());
    unmap(c);
    return rc;
  }
  Header* h = c->hdr = reinterpret_cast<Header*>(c->base);
  const Layout l = layout(c->nranks, static_cast<size_t>(h->chunk_bytes));
  c->ranks = reinterpret_cast<RankInfo*>(c->base + l.ranks_offset);
  c->slots = c->base + l.slots_offset;
  c->chunk_bytes = static_cast<size_t>(h->chunk_bytes);
  if (c->ranks[c->rank].joined.exchange(1, std::memory_order_acq_rel) != 0) {
    unmap(c);
    return fail(ncclInvalidUsage,
                cat("rank ", c->rank, " joined communicator ", c->name, " twice"));
  }
  if (h->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(c->nranks)) {
    // Everyone is in: the name is no longer needed, and unlinking now leaves nothing behind in
    // /dev/shm whatever happens to the processes later.
    shm_unlink(c->name.c_str());
    c->all_joined = true;
    futex_wake(&h->arrived);
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

// ----- collectives ----------------------------------------------------------------------------

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

const char* type_name(ncclDataType_t t) {
  static const char* const names[] = {"ncclInt8",     "ncclUint8",      "ncclInt32",
                                      "ncclUint32",   "ncclInt64",      "ncclUint64",
                                      "ncclFloat16",  "ncclFloat32",    "ncclFloat64",
                                      "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
  return t >= 0 && t < ncclNumTypes ? names[t] : "?";
}

// Integer sums and products wrap (unsigned arithmetic) instead of overflowing signed types.
template <class T>
T add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <class T>
T mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    // uint32_t, not the 8-bit type, so the promotion to int cannot overflow.
    using U = std::conditional_t<(sizeof(T) < 4), uint32_t, std::make_unsigned_t<T>>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

// ----- 16-bit floats -----
// ncclFloat16 and ncclBfloat16 values, stored as their bit patterns. Written apart from the
// library's core/float16.h (bit tricks) on purpose, through frexp/ldexp and an explicit
// round-half-even, so each implementation checks the other. A binary format with kExpBits
// exponent and kFracBits fraction bits, IEEE-style (subnormals, infinities, NaN).
template <int kExpBits, int kFracBits>
class Narrow {
 public:
  Narrow() = default;
  // Rounds to the nearest value of the format, ties to even.
  explicit Narrow(float v) : bits_(encode(v)) {}
  explicit operator float() const { return decode(bits_); }

  friend Narrow operator+(Narrow a, Narrow b) { return Narrow(float(a) + float(b)); }
  friend Narrow operator*(Narrow a, Narrow b) { return Narrow(float(a) * float(b)); }
  friend bool operator<(Narrow a, Narrow b) { return float(a) < float(b); }

 private:
  static constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  static constexpr int kMinExp = 2 - kBias;  // frexp's exponent of the smallest normal value
  static constexpr int kDigits = kFracBits + 1;
  static constexpr uint16_t kInf = ((1u << kExpBits) - 1) << kFracBits;

  static uint16_t encode(float v) {
    const uint16_t sign = std::signbit(v) ? 0x8000u : 0u;
    if (std::isnan(v)) return sign | kInf | (1u << (kFracBits - 1));  // the quiet NaN
    if (std::isinf(v)) return sign | kInf;
    const double a = round_magnitude(std::fabs(static_cast<double>(v)));
    const double max_finite = std::ldexp(2.0 - std::ldexp(1.0, -kFracBits), kBias);
    if (a > max_finite) return sign | kInf;
    if (a == 0.0) return sign;
    int e = 0;
    const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
    if (e < kMinExp) return sign | static_cast<uint16_t>(std::ldexp(a, kDigits - kMinExp));
    const auto fraction = static_cast<uint16_t>(std::ldexp(2.0 * m - 1.0, kFracBits));
    return sign | static_cast<uint16_t>((e - 1 + kBias) << kFracBits) | fraction;
  }

  // a >= 0 rounded to a multiple of the format's spacing at its binade (fixed below the
  // normal range: gradual underflow). Scaling by a power of two is exact in double.
  static double round_magnitude(double a) {
    int e = 0;
    std::frexp(a, &e);
    const int spacing = std::max(e, kMinExp) - kDigits;
    const double scaled = std::ldexp(a, -spacing);
    double whole = std::floor(scaled);
    const double rest = scaled - whole;
    if (rest > 0.5 || (rest == 0.5 && std::fmod(whole, 2.0) != 0.0)) whole += 1.0;
    return std::ldexp(whole, spacing);
  }

  static float decode(uint16_t h) {
    const double sign = (h & 0x8000u) != 0 ? -1.0 : 1.0;
    const int field = (h & 0x7fffu) >> kFracBits;
    const int fraction = h & ((1 << kFracBits) - 1);
    if (field == (1 << kExpBits) - 1) {
      return static_cast<float>(fraction != 0 ? std::copysign(NAN, sign) : sign * INFINITY);
    }
    if (field == 0) return static_cast<float>(sign * std::ldexp(fraction, kMinExp - kDigits));
    return static_cast<float>(sign *
                              std::ldexp(fraction + (1 << kFracBits), field - kBias - kFracBits));
  }

  uint16_t bits_ = 0;
};

using Half = Narrow<5, 10>;
using BFloat16 = Narrow<8, 7>;
static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2, "stored as their bit patterns");

// ncclAvg's last step; a 16-bit type divides in float, where nranks is exact.
template <class T>
T divide(T sum, int nranks) {
  return static_cast<T>(sum / static_cast<T>(nranks));
}
template <int kExpBits, int kFracBits>
Narrow<kExpBits, kFracBits> divide(Narrow<kExpBits, kFracBits> sum, int nranks) {
  return Narrow<kExpBits, kFracBits>(static_cast<float>(sum) / static_cast<float>(nranks));
}

// out = slot[0] op slot[1] op ... op slot[n-1], left to right, so every rank computes the same
// bits.
template <class T>
void reduce(ncclRedOp_t op, const ncclComm* c, size_t set, void* out_bytes, size_t m) {
  T* out = static_cast<T*>(out_bytes);
  std::memcpy(out, c->slot(set, 0), m * sizeof(T));
  for (int r = 1; r < c->nranks; ++r) {
    const T* x = reinterpret_cast<const T*>(c->slot(set, r));
    switch (op) {
      case ncclSum:
      case ncclAvg:
        for (size_t i = 0; i < m; ++i) out[i] = add(out[i], x[i]);
        break;
      case ncclProd:
        for (size_t i = 0; i < m; ++i) out[i] = mul(out[i], x[i]);
        break;
      case ncclMax:
        for (size_t i = 0; i < m; ++i) out[i] = out[i] < x[i] ? x[i] : out[i];
        break;
      case ncclMin:
        for (size_t i = 0; i < m; ++i) out[i] = x[i] < out[i] ? x[i] : out[i];
        break;
      default:
        break;
    }
  }
  if (op == ncclAvg) {
    for (size_t i = 0; i < m; ++i) out[i] = divide(out[i], c->nranks);
  }
}

bool reducible(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclInt32:
    case ncclUint32:
    case ncclInt64:
    case ncclUint64:
    case ncclFloat16:
    case ncclFloat32:
    case ncclFloat64:
    case ncclBfloat16:
      return true;
    default:
      return false;
  }
}

void reduce_any(ncclDataType_t t, ncclRedOp_t op, const ncclComm* c, size_t set, void* out,
                size_t m) {
  switch (t) {
    case ncclInt8:
      return reduce<int8_t>(op, c, set, out, m);
    case ncclUint8:
      return reduce<uint8_t>(op, c, set, out, m);
    case ncclInt32:
      return reduce<int32_t>(op, c, set, out, m);
    case ncclUint32:
      return reduce<uint32_t>(op, c, set, out, m);
    case ncclInt64:
      return reduce<int64_t>(op, c, set, out, m);
    case ncclUint64:
      return reduce<uint64_t>(op, c, set, out, m);
    case ncclFloat32:
      return reduce<float>(op, c, set, out, m);
    case ncclFloat64:
      return reduce<double>(op, c, set, out, m);
    case ncclFloat16:
      return reduce<Half>(op, c, set, out, m);
    case ncclBfloat16:
      return reduce<BFloat16>(op, c, set, out, m);
    default:
      return;
  }
}

bool barrier_missing(ncclComm* c, int r) {
  return c->ranks[r].barriers.load(std::memory_order_acquire) < c->barrier_seq;
}

// Process-shared counting barrier. On timeout or a broken segment the communicator gets
// ncclRemoteError as its asynchronous error.
ncclResult_t barrier(ncclComm* c, const char* what) {
  Header* h = c->hdr;
  const uint32_t gen = h->bar_gen.load(std::memory_order_acquire);
  c->ranks[c->rank].barriers.store(++c->barrier_seq, std::memory_order_release);
  if (h->bar_count.fetch_add(1, std::memory_order_acq_rel) + 1 ==
      static_cast<uint32_t>(c->nranks)) {
    // Last to arrive: reset the count before releasing the others, who may reach the next
    // barrier at once.
    h->bar_count.store(0, std::memory_order_relaxed);
    h->bar_gen.fetch_add(1, std::memory_order_release);
    futex_wake(&h->bar_gen);
    return ncclSuccess;
  }
  const Wait w = wait_until(
      h, &h->bar_gen, [&] { return h->bar_gen.load(std::memory_order_acquire) != gen; },
      Clock::now() + c->timeout());
  if (w == Wait::kDone) return ncclSuccess;
  std::string message;
  if (w == Wait::kTimeout) {
    message = cat("rank ", c->rank, ": peers did not reach ", what, " #", c->coll_seq, " within ",
                  c->timeout_s, " s (missing ranks: ", missing_ranks(c, barrier_missing), ")");
    mark_broken(c, kBrokenTimeout);
  } else {
    message = cat("rank ", c->rank, ": ", what, " #", c->coll_seq, " failed because ",
                  broken_text(h->broken.load(std::memory_order_acquire)));
  }
  set_async(c, ncclRemoteError);
  return fail(ncclRemoteError, message);
}

const char* kind_name(int32_t kind) {
  switch (kind) {
    case kAllReduce:
      return "allreduce";
    case kBroadcast:
      return "broadcast";
    case kReduceScatter:
      return "reducescatter";
    default:
      return "allgather";
  }
}

bool reduces(int32_t kind) { return kind == kAllReduce || kind == kReduceScatter; }

std::string describe(const Descriptor& d) {
  std::string s = cat("#", d.seq, " ", kind_name(d.kind), " count=", d.count, " ",
                      type_name(static_cast<ncclDataType_t>(d.datatype)));
  if (reduces(d.kind)) s += cat(" op=", d.op);
  if (d.kind == kBroadcast) s += cat(" root=", d.root);
  return s;
}

// Every rank called the same collective as this one (checked on a collective's first chunk).
ncclResult_t check_same_call(ncclComm* c, const Descriptor& d, size_t parity) {
  for (int r = 0; r < c->nranks; ++r) {
    const Descriptor& o = c->ranks[r].desc[parity];
    if (o.seq != d.seq || o.count != d.count || o.kind != d.kind || o.datatype != d.datatype ||
        o.op != d.op || o.root != d.root) {
      set_async(c, ncclInvalidUsage);
      return fail(ncclInvalidUsage, cat("rank ", c->rank, " called ", describe(d), " but rank ", r,
                                        " called ", describe(o)));
    }
  }
  return ncclSuccess;
}

// Where chunk [off, off + m) of a collective's staged data goes on this rank, once every rank
// has staged its own: reduced (allreduce; reduce-scatter, only the part in this rank's block of
// d.count), the root's (broadcast) or every rank's (allgather, rank r's to block r).
void combine(ncclComm* c, const Descriptor& d, size_t set, size_t off, size_t m, const void* send,
             unsigned char* out) {
  const ncclDataType_t t = static_cast<ncclDataType_t>(d.datatype);
  const size_t elem = type_size(t);
  const auto op = static_cast<ncclRedOp_t>(d.op);
  if (d.kind == kAllReduce) {
    reduce_any(t, op, c, set, out + off * elem, m);
  } else if (d.kind == kBroadcast) {
    if (!(c->rank == d.root && send == out))
      std::memcpy(out + off * elem, c->slot(set, d.root), m * elem);
  } else if (d.kind == kReduceScatter) {
    const size_t lo = static_cast<size_t>(c->rank) * d.count, hi = lo + d.count;
    const size_t from = std::max(lo, off), to = std::min(hi, off + m);
    if (from >= to) return;
    std::vector<unsigned char> sum(m * elem);
    reduce_any(t, op, c, set, sum.data(), m);
    std::memcpy(out + (from - lo) * elem, sum.data() + (from - off) * elem, (to - from) * elem);
  } else {
    for (int r = 0; r < c->nranks; ++r) {
      unsigned char* to = out + (static_cast<size_t>(r) * d.count + off) * elem;
      if (r == c->rank && to == static_cast<const unsigned char*>(send) + off * elem) continue;
      std::memcpy(to, c->slot(set, r), m * elem);
    }
  }
}

// Runs one collective chunk by chunk: stage, barrier, combine. Arguments are already checked.
// A reduce-scatter stages all nranks x count elements of its send buffer (each chunk reduced
// like an allreduce, kept where it falls in this rank's block); an allgather its count.
ncclResult_t run(ncclComm* c, const Descriptor& d, const void* send, void* recv) {
  const char* what = kind_name(d.kind);
  const size_t elem = type_size(static_cast<ncclDataType_t>(d.datatype));
  const size_t per_chunk = c->chunk_bytes / elem;
  const size_t parity = d.seq % 2;
  const size_t total =
      d.kind == kReduceScatter ? static_cast<size_t>(c->nranks) * d.count : d.count;
  c->ranks[c->rank].desc[parity] = d;
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);
  for (size_t off = 0; off < total; off += per_chunk) {
    const size_t m = std::min(per_chunk, total - off);
    const size_t set = c->chunk_seq++ % 2;
    if (d.kind != kBroadcast || c->rank == d.root) {
      std::memcpy(c->slot(set, c->rank), in + off * elem, m * elem);
    }
    ncclResult_t rc = barrier(c, what);
    if (rc != ncclSuccess) return rc;
    if (off == 0 && (rc = check_same_call(c, d, parity)) != ncclSuccess) return rc;
    combine(c, d, set, off, m, send, out);
  }
  return ncclSuccess;
}

// A collective as called, for running it at call time or later from its stream's queue.
struct Call {
  const char* fn;
  CollectiveKind kind;
  size_t count;
  ncclDataType_t datatype;
  ncclRedOp_t op;
  int root;
  const void* send;
  void* recv;
  bool inject;     // the failure DDP_NCCL_EMU_FAIL asks for
  int64_t number;  // of the allreduce calls on this communicator
};

// Runs a checked collective now. A queued one whose communicator failed meanwhile does nothing
// (the first error's message stays the one ncclGetLastError reports).
ncclResult_t perform(ncclComm* c, const Call& call) {
  std::lock_guard<std::mutex> lk(c->run_mu);
  const auto e = static_cast<ncclResult_t>(c->async_error.load());
  if (e != ncclSuccess) return e;
  if (call.inject) {
    // As an asynchronous failure in NCCL: the call itself succeeds, the error shows later.
    set_async(c, ncclSystemError);
    fail(ncclSystemError, cat(call.fn, ": rank ", c->rank, ": injected failure of allreduce #",
                              call.number, " (DDP_NCCL_EMU_FAIL)"));
    return ncclSuccess;
  }
  if (call.count == 0) return ncclSuccess;
  const Descriptor d{++c->coll_seq,
                     call.count,
                     call.kind,
                     call.datatype,
                     reduces(call.kind) ? static_cast<int32_t>(call.op) : -1,
                     call.root};
  return run(c, d, call.send, call.recv);
}

// Queues the collective on the stream (the CUDA emulation's deferred mode) and returns
// ncclSuccess, or runs it now and returns its result.
ncclResult_t issue(ncclComm* c, const Call& call, cudaStream_t stream) {
  const uint64_t serial = c->serial;
  c->queued.fetch_add(1);
  auto queued = [c, serial, call] {
    // Destroyed or aborted before its stream got here: aborted with it, as in NCCL.
    if (enter_live(c, serial) == nullptr) return;
    (void)perform(c, call);
    c->queued.fetch_sub(1);
    leave_live(c);
  };
  if (ddp_emu::enqueue_host_work(stream, queued)) return ncclSuccess;
  c->queued.fetch_sub(1);
  return perform(c, call);
}

// The checks every collective makes before touching shared state, as NCCL's argument checks.
// root is -1 for an allreduce (every rank sends).
ncclResult_t check_collective(const char* fn, ncclComm* c, const void* send, void* recv,
                              size_t send_count, size_t recv_count, ncclDataType_t t, int root,
                              cudaStream_t stream) {
  if (!c) return fail(ncclInvalidArgument, cat(fn, ": comm is NULL"));
  if (!is_live(c)) {
    return fail(ncclInvalidArgument, cat(fn, ": comm is not a live communicator (destroyed?)"));
  }
  if (root != -1 && (root < 0 || root >= c->nranks)) {
    return fail(ncclInvalidArgument, cat(fn, ": root=", root, " is not in [0, ", c->nranks, ")"));
  }
  const bool send_used = root == -1 || root == c->rank;
  if (t < 0 || t >= ncclNumTypes) {
    return fail(ncclInvalidArgument, cat(fn, ": invalid datatype ", static_cast<int>(t)));
  }
  if (c->state.load() == kJoining) {
    std::lock_guard<std::mutex> lk(c->mu);
    poll_join_locked(c);
  }
  if (c->state.load() == kJoining && c->async_error.load() == ncclSuccess) {
    return fail(ncclInvalidUsage, cat(fn, ": rank ", c->rank,
                                      ": communicator init is still in progress; wait until "
                                      "ncclCommGetAsyncError reports ncclSuccess"));
  }
  if (c->state.load() == kFinalized) {
    return fail(ncclInvalidUsage, cat(fn, ": rank ", c->rank, ": communicator is finalized"));
  }
  // Neither check runs the stream's queued work nor touches the CUDA error state.
  if (!ddp_emu::stream_exists(stream)) {
    return fail(ncclUnhandledCudaError, cat(fn, ": invalid stream"));
  }
  if (send_count == 0 || recv_count == 0) return ncclSuccess;
  const size_t elem = type_size(t);
  if (std::max(send_count, recv_count) > SIZE_MAX / elem) {
    return fail(ncclInvalidArgument, cat(fn, ": count overflows"));
  }
  const size_t send_bytes = send_count * elem, recv_bytes = recv_count * elem;
  if (send_used && (!send || !ddp_emu::is_device_memory(send, send_bytes))) {
    return fail(ncclInvalidArgument, cat(fn, ": rank ", c->rank, ": sendbuff ", send, " is not ",
                                         send_bytes, " bytes of device memory"));
  }
  if (!recv || !ddp_emu::is_device_memory(recv, recv_bytes)) {
    return fail(ncclInvalidArgument, cat(fn, ": rank ", c->rank, ": recvbuff ", recv, " is not ",
                                         recv_bytes, " bytes of device memory"));
  }
  return ncclSuccess;
}

// The operator and the type of a reduction, as NCCL checks them (and the types the emulation
// reduces).
ncclResult_t check_reduction(const char* fn, ncclRedOp_t op, ncclDataType_t datatype) {
  if (op < 0 || op >= ncclNumOps) {
    return fail(ncclInvalidArgument,
                cat(fn, ": invalid reduction operator ", static_cast<int>(op)));
  }
  if (datatype >= 0 && datatype < ncclNumTypes && !reducible(datatype)) {
    return fail(ncclInvalidArgument, cat(fn, ": ", type_name(datatype),
                                         " reductions are not supported by the emulation"));
  }
  return ncclSuccess;
}

ncclResult_t async_error_of(ncclComm* c, const char* fn) {
  const auto e = static_cast<ncclResult_t>(c->async_error.load());
  if (e == ncclSuccess) return e;
  return fail(e, cat(fn, ": rank ", c->rank, ": communicator has an asynchronous error (",
                     ncclGetErrorString(e), ")"));
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

// ----- API ------------------------------------------------------------------------------------

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
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

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
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

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return ncclCommInitRankConfig(comm, nranks, commId, rank, nullptr);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
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
  if (!comm) return ncclSuccess;
  if (!is_live(comm)) {
    return fail(ncclInvalidArgument, "ncclCommDestroy: comm is not a live communicator");
  }
  release(comm, false);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  if (!is_live(comm)) {
    return fail(ncclInvalidArgument, "ncclCommAbort: comm is not a live communicator");
  }
  release(comm, true);
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
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

const char* ncclGetLastError(ncclComm_t) {
  // A copy per thread, so the pointer stays valid while other threads record errors.
  thread_local std::string copy;
  std::lock_guard<std::mutex> lk(g_error_mu);
  copy = g_last_error;
  return copy.c_str();
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
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
  const ncclResult_t rc = comm_query("ncclCommCount", comm, count);
  if (rc == ncclSuccess) *count = comm->nranks;
  return rc;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  const ncclResult_t rc = comm_query("ncclCommCuDevice", comm, device);
  if (rc == ncclSuccess) *device = comm->device;
  return rc;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  const ncclResult_t rc = comm_query("ncclCommUserRank", comm, rank);
  if (rc == ncclSuccess) *rank = comm->rank;
  return rc;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  const char* fn = "ncclAllReduce";
  ncclResult_t rc = check_reduction(fn, op, datatype);
  if (rc != ncclSuccess) return rc;
  rc = check_collective(fn, comm, sendbuff, recvbuff, count, count, datatype, -1, stream);
  if (rc != ncclSuccess) return rc;
  g_collectives.fetch_add(1);
  ++comm->allreduce_calls;
  rc = async_error_of(comm, fn);
  if (rc != ncclSuccess) return rc;
  const bool inject = comm->rank == comm->fail_rank && comm->allreduce_calls == comm->fail_at;
  if (count == 0 && !inject) return ncclSuccess;
  return issue(comm,
               Call{fn, kAllReduce, count, datatype, op, -1, sendbuff, recvbuff, inject,
                    comm->allreduce_calls},
               stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  const char* fn = "ncclBroadcast";
  if (root < 0) return fail(ncclInvalidArgument, cat(fn, ": root=", root, " is negative"));
  ncclResult_t rc =
      check_collective(fn, comm, sendbuff, recvbuff, count, count, datatype, root, stream);
  if (rc != ncclSuccess) return rc;
  g_collectives.fetch_add(1);
  rc = async_error_of(comm, fn);
  if (rc != ncclSuccess) return rc;
  if (count == 0) return ncclSuccess;
  return issue(comm,
               Call{fn, kBroadcast, count, datatype, ncclSum, root, sendbuff, recvbuff, false, 0},
               stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  const char* fn = "ncclReduceScatter";
  ncclResult_t rc = check_reduction(fn, op, datatype);
  if (rc != ncclSuccess) return rc;
  const size_t ranks = comm != nullptr && is_live(comm) ? static_cast<size_t>(comm->nranks) : 1;
  if (recvcount > SIZE_MAX / ranks) return fail(ncclInvalidArgument, cat(fn, ": count overflows"));
  rc = check_collective(fn, comm, sendbuff, recvbuff, ranks * recvcount, recvcount, datatype, -1,
                        stream);
  if (rc != ncclSuccess) return rc;
  g_collectives.fetch_add(1);
  rc = async_error_of(comm, fn);
  if (rc != ncclSuccess || recvcount == 0) return rc;
  return issue(comm,
               Call{fn, kReduceScatter, recvcount, datatype, op, -1, sendbuff, recvbuff, false, 0},
               stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclAllGather";
  const size_t ranks = comm != nullptr && is_live(comm) ? static_cast<size_t>(comm->nranks) : 1;
  if (sendcount > SIZE_MAX / ranks) return fail(ncclInvalidArgument, cat(fn, ": count overflows"));
  ncclResult_t rc = check_collective(fn, comm, sendbuff, recvbuff, sendcount, ranks * sendcount,
                                     datatype, -1, stream);
  if (rc != ncclSuccess) return rc;
  g_collectives.fetch_add(1);
  rc = async_error_of(comm, fn);
  if (rc != ncclSuccess || sendcount == 0) return rc;
  return issue(comm,
               Call{fn, kAllGather, sendcount, datatype, ncclSum, -1, sendbuff, recvbuff, false, 0},
               stream);
}

ncclResult_t ncclGroupStart() {
  ++g_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
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

int64_t collective_count() { return g_collectives.load(); }

int64_t live_communicators() {
  std::lock_guard<std::mutex> lk(g_live_mu);
  return static_cast<int64_t>(g_live.size());
}

const char* shm_prefix() { return kShmPrefix; }

}  // namespace ddp_nccl_emu
