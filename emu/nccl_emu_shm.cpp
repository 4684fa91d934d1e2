// The shared-memory segment the ranks of a communicator meet in: its layout, creating or opening
// it and counting a rank in (the bootstrap), futex waits, the broken flag that fails every
// rank's waits, and the process-shared barrier with its timeout.
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <new>
#include <string>

#include "nccl_emu_internal.h"

namespace {

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

void sleep_ms(int ms) {
  timespec ts{0, static_cast<long>(ms) * 1000000};
  nanosleep(&ts, nullptr);
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

bool barrier_missing(ncclComm* c, int r) {
  return c->ranks[r].barriers.load(std::memory_order_acquire) < c->barrier_seq;
}

}  // namespace

namespace ddp_nccl_emu {
namespace detail {

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, Clock::duration d) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
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

std::string missing_ranks(ncclComm* c, bool (*missing)(ncclComm*, int)) {
  std::string out;
  for (int r = 0; r < c->nranks; ++r) {
    if (missing(c, r)) out += (out.empty() ? "" : ",") + std::to_string(r);
  }
  return out.empty() ? "none" : out;
}

void unmap(ncclComm* c) {
  if (c->base) munmap(c->base, c->map_bytes);
  c->base = nullptr;
  c->hdr = nullptr;
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

}  // namespace detail
}  // namespace ddp_nccl_emu
