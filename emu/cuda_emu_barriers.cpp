// The block and warp barriers of a running launch: the fault that unwinds a block, the rules
// __syncthreads and the warp operations check, the deadlock check, and the device-side entry
// points (__syncthreads, __syncwarp, the shuffles and votes) that kernels call.
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>

#include "cuda_emu_internal.h"

namespace ddp_emu {
namespace detail {

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::kSyncwarp:
      return "__syncwarp()";
    case WarpOp::kShfl:
      return "__shfl_sync()";
    case WarpOp::kShflUp:
      return "__shfl_up_sync()";
    case WarpOp::kShflDown:
      return "__shfl_down_sync()";
    case WarpOp::kShflXor:
      return "__shfl_xor_sync()";
    case WarpOp::kBallot:
      return "__ballot_sync()";
    case WarpOp::kAny:
      return "__any_sync()";
    case WarpOp::kAll:
      return "__all_sync()";
    case WarpOp::kWmmaLoad:
      return "wmma::load_matrix_sync()";
    case WarpOp::kWmmaStore:
      return "wmma::store_matrix_sync()";
    case WarpOp::kWmmaMma:
      return "wmma::mma_sync()";
  }
  return "warp operation";
}

std::string site(const char* file, int line) {
  return std::string(file ? file : "?") + ":" + std::to_string(line);
}

std::string hex32(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string triple(unsigned x, unsigned y, unsigned z) {
  return "(" + std::to_string(x) + "," + std::to_string(y) + "," + std::to_string(z) + ")";
}

std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(mangled);
}

thread_local ThreadCtx* g_ctx = nullptr;

bool is_aborted(const Launch& l) { return __atomic_load_n(&l.aborted, __ATOMIC_ACQUIRE); }

std::string where(const Launch& l) {
  return "kernel " + l.name + ", block " + triple(blockIdx.x, blockIdx.y, blockIdx.z) +
         ", thread " + triple(threadIdx.x, threadIdx.y, threadIdx.z);
}

// Records the first fault of the launch and wakes every waiter of the block so it unwinds.
void fail_locked(Launch& l, const std::string& cause) {
  if (!is_aborted(l)) {
    l.fault = where(l) + ": " + cause;
    __atomic_store_n(&l.aborted, true, __ATOMIC_RELEASE);
  }
  l.barrier.bump();
  l.barrier.wake();
  l.block_end.bump();
  l.block_end.wake();
  for (Warp& w : l.warps) {
    for (Signal& s : w.released) {
      s.bump();
      s.wake();
    }
  }
  if (l.serial()) {
    for (unsigned t = 0; t < l.threads; ++t) {
      l.go[t].bump();
      l.go[t].wake();
    }
  }
}

std::string waits_locked(const Launch& l) {
  std::ostringstream os;
  const char* sep = "";
  if (l.waiting > 0) {
    os << l.waiting << " thread(s) wait at __syncthreads() at "
       << site(l.barrier_file, l.barrier_line);
    sep = "; ";
  }
  for (size_t i = 0; i < l.warps.size(); ++i) {
    for (const WarpGroup& g : l.warps[i].groups) {
      os << sep << "lanes " << hex32(g.arrived) << " of warp " << i << " wait at " << op_name(g.op)
         << " at " << site(g.file, g.line) << " with mask " << hex32(g.mask);
      sep = "; ";
    }
  }
  if (l.exited > 0) os << sep << l.exited << " thread(s) returned from the kernel";
  return os.str();
}

}  // namespace detail

namespace {

ThreadCtx& current(const char* what, const char* file, int line) {
  if (!g_ctx) {
    throw KernelFault(std::string(what) + " at " + site(file, line) +
                      " called outside an emulated kernel");
  }
  return *g_ctx;
}

[[noreturn]] void fail_and_unwind(Launch& l, const std::string& cause) {
  fail_locked(l, cause);
  throw AbortBlock{};
}

// Called by a thread that is about to wait: if every thread still running waits too, none can
// ever be released (e.g. one lane at __syncthreads while its warp waits for it at a shuffle).
void check_deadlock_locked(Launch& l) {
  if (l.blocked > 0 && l.blocked + l.exited == l.threads) {
    fail_and_unwind(l, "deadlock, no thread of the block can go on: " + waits_locked(l));
  }
}

// Joins (or opens) the lanes' group at a warp operation and returns when the group is complete.
// Called with lk locked; returns with it unlocked.
void warp_arrive(Launch& l, const ThreadCtx& c, std::unique_lock<std::mutex>& lk, WarpOp op,
                 unsigned mask, const char* file, int line) {
  Warp& w = l.warps[c.warp];
  const unsigned me = 1u << c.lane;
  const std::string call = std::string(op_name(op)) + " at " + site(file, line);
  if (!(mask & me)) {
    fail_and_unwind(l, "called " + call + " with mask " + hex32(mask) +
                           " that does not include its own lane " + std::to_string(c.lane));
  }
  if (const unsigned gone = mask & w.exited) {
    fail_and_unwind(l, "called " + call + " with mask " + hex32(mask) + " but lanes " +
                           hex32(gone) + " of warp " + std::to_string(c.warp) +
                           " already returned from the kernel");
  }
  size_t gi = w.groups.size();
  for (size_t i = 0; i < w.groups.size(); ++i) {
    const WarpGroup& g = w.groups[i];
    if (g.mask == mask) {
      gi = i;
    } else if (g.mask & mask) {
      fail_and_unwind(l, "called " + call + " with mask " + hex32(mask) + " while lanes " +
                             hex32(g.arrived) + " of its warp wait at " + op_name(g.op) + " at " +
                             site(g.file, g.line) + " with mask " + hex32(g.mask) +
                             " (lanes of a warp must meet with the same mask)");
    }
  }
  if (gi == w.groups.size()) {
    w.groups.push_back(WarpGroup{mask, op, file, line, 0});
  } else if (w.groups[gi].op != op) {
    const WarpGroup& g = w.groups[gi];
    fail_and_unwind(l, "called " + call + " while lanes " + hex32(g.arrived) +
                           " of its warp wait at " + op_name(g.op) + " at " + site(g.file, g.line) +
                           " (lanes of a warp must meet at the same warp operation)");
  }
  WarpGroup& g = w.groups[gi];
  g.arrived |= me;
  const unsigned members = mask & w.lanes;
  if (g.arrived == members) {
    const unsigned others = members & ~me;
    for (unsigned i = 0; i < 32; ++i) {
      if (others >> i & 1u) w.released[i].bump();
    }
    l.blocked -= static_cast<unsigned>(__builtin_popcount(others));
    w.groups.erase(w.groups.begin() + static_cast<std::ptrdiff_t>(gi));
    if (l.serial()) {
      for (unsigned i = 0; i < 32; ++i) {
        if (members >> i & 1u) mark_ready_locked(l, c.warp * 32 + i);
      }
      pass_turn_locked(l);
    }
    lk.unlock();
    for (unsigned i = 0; i < 32; ++i) {
      if (others >> i & 1u) w.released[i].wake();
    }
    wait_turn(l, c.tid);
    return;
  }
  ++l.blocked;
  check_deadlock_locked(l);
  Signal& mine = w.released[c.lane];
  const uint32_t seen = mine.value();
  if (l.serial()) pass_turn_locked(l);
  lk.unlock();
  mine.wait_change(seen);
  if (is_aborted(l)) throw AbortBlock{};
  wait_turn(l, c.tid);
}

// Source lane of a shuffle by PTX's rules; the own lane when the source is out of the segment.
unsigned shuffle_source(WarpOp op, unsigned lane, int lane_arg, int width) {
  const int64_t base = lane & ~static_cast<unsigned>(width - 1);
  const int64_t last = base + width - 1;
  const int64_t me = lane;
  const int64_t delta = static_cast<uint32_t>(lane_arg);
  int64_t j = me;
  switch (op) {
    case WarpOp::kShfl:
      j = base | (lane_arg & (width - 1));
      break;
    case WarpOp::kShflUp:
      j = me - delta >= base ? me - delta : me;
      break;
    case WarpOp::kShflDown:
      j = me + delta <= last ? me + delta : me;
      break;
    case WarpOp::kShflXor:
      j = (me ^ delta) <= last ? (me ^ delta) : me;
      break;
    default:
      break;
  }
  return static_cast<unsigned>(j);
}

}  // namespace

// ----- device-side entry points ----------------------------------------------------------------

namespace detail {

void sync_threads(const char* file, int line) {
  ThreadCtx& c = current("__syncthreads()", file, line);
  Launch& l = *c.launch;
  std::unique_lock<std::mutex> lk(l.mu);
  if (is_aborted(l)) throw AbortBlock{};
  const std::string here = "__syncthreads() at " + site(file, line);
  if (l.exited > 0) {
    fail_and_unwind(l, "reached " + here + " while " + std::to_string(l.exited) +
                           " thread(s) of the block already returned from the kernel (every "
                           "thread must reach every __syncthreads())");
  }
  if (l.waiting == 0) {
    l.barrier_file = file;
    l.barrier_line = line;
  } else if (line != l.barrier_line || std::strcmp(file, l.barrier_file) != 0) {
    fail_and_unwind(l, "reached " + here + " while " + std::to_string(l.waiting) +
                           " thread(s) wait at __syncthreads() at " +
                           site(l.barrier_file, l.barrier_line) +
                           " (all threads must meet at the same __syncthreads())");
  }
  if (++l.waiting == l.threads) {
    l.waiting = 0;
    l.blocked -= l.threads - 1;
    l.barrier.bump();
    if (l.serial()) {
      for (unsigned t = 0; t < l.threads; ++t) mark_ready_locked(l, t);
      pass_turn_locked(l);
    }
    lk.unlock();
    l.barrier.wake();
    wait_turn(l, c.tid);
    return;
  }
  ++l.blocked;
  check_deadlock_locked(l);
  const uint32_t seen = l.barrier.value();
  if (l.serial()) pass_turn_locked(l);
  lk.unlock();
  l.barrier.wait_change(seen);
  if (is_aborted(l)) throw AbortBlock{};
  wait_turn(l, c.tid);
}

void sync_warp(unsigned mask, const char* file, int line) {
  ThreadCtx& c = current("__syncwarp()", file, line);
  Launch& l = *c.launch;
  std::unique_lock<std::mutex> lk(l.mu);
  if (is_aborted(l)) throw AbortBlock{};
  warp_arrive(l, c, lk, WarpOp::kSyncwarp, mask, file, line);
}

// Exchange through per-lane slots: write, meet, read the partner, meet again so no lane
// overwrites its slot (in its next exchange) before every lane has read it.
uint64_t shuffle(WarpOp op, unsigned mask, uint64_t bits, int lane_arg, int width, const char* file,
                 int line) {
  ThreadCtx& c = current(op_name(op), file, line);
  Launch& l = *c.launch;
  std::unique_lock<std::mutex> lk(l.mu);
  if (is_aborted(l)) throw AbortBlock{};
  if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
    fail_and_unwind(l, std::string("called ") + op_name(op) + " at " + site(file, line) +
                           " with width " + std::to_string(width) +
                           " (must be a power of 2 from 1 to 32)");
  }
  Warp& w = l.warps[c.warp];
  w.slots[c.lane] = bits;
  warp_arrive(l, c, lk, op, mask, file, line);
  // Slots stay put until every member arrives below, so they are read without the mutex.
  const unsigned src = shuffle_source(op, c.lane, lane_arg, width);
  const bool present = (mask & w.lanes) >> src & 1u;
  const uint64_t out = present ? w.slots[src] : ~uint64_t{0};
  lk.lock();
  if (is_aborted(l)) throw AbortBlock{};
  warp_arrive(l, c, lk, op, mask, file, line);
  return out;
}

unsigned vote(WarpOp op, unsigned mask, bool predicate, const char* file, int line) {
  ThreadCtx& c = current(op_name(op), file, line);
  Launch& l = *c.launch;
  std::unique_lock<std::mutex> lk(l.mu);
  if (is_aborted(l)) throw AbortBlock{};
  Warp& w = l.warps[c.warp];
  w.slots[c.lane] = predicate ? 1 : 0;
  warp_arrive(l, c, lk, op, mask, file, line);
  const unsigned members = mask & w.lanes;
  unsigned ballot = 0;
  for (unsigned i = 0; i < 32; ++i) {
    if ((members >> i & 1u) && w.slots[i] != 0) ballot |= 1u << i;
  }
  lk.lock();
  if (is_aborted(l)) throw AbortBlock{};
  warp_arrive(l, c, lk, op, mask, file, line);
  if (op == WarpOp::kAny) return ballot != 0;
  if (op == WarpOp::kAll) return ballot == members;
  return ballot;
}

// As shuffle, with a pointer to each lane's bytes in its slot: the other lanes copy them while
// their owner waits at the second meeting, which keeps them alive and unchanged.
void warp_all_gather(WarpOp op, const void* mine, size_t bytes, void* all, const char* file,
                     int line) {
  ThreadCtx& c = current(op_name(op), file, line);
  Launch& l = *c.launch;
  std::unique_lock<std::mutex> lk(l.mu);
  if (is_aborted(l)) throw AbortBlock{};
  Warp& w = l.warps[c.warp];
  if (w.lanes != 0xffffffffu) {
    fail_and_unwind(l, std::string("called ") + op_name(op) + " at " + site(file, line) +
                           " in warp " + std::to_string(c.warp) + " of lanes " + hex32(w.lanes) +
                           " (the warp matrix functions need all 32 lanes of a warp)");
  }
  w.slots[c.lane] = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(mine));
  warp_arrive(l, c, lk, op, 0xffffffffu, file, line);
  for (unsigned i = 0; i < 32; ++i) {
    std::memcpy(static_cast<char*>(all) + i * bytes,
                reinterpret_cast<const void*>(static_cast<uintptr_t>(w.slots[i])), bytes);
  }
  lk.lock();
  if (is_aborted(l)) throw AbortBlock{};
  warp_arrive(l, c, lk, op, 0xffffffffu, file, line);
}
}  // namespace detail
}  // namespace ddp_emu
