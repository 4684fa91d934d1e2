// The serial schedules: which order the threads of a block take turns in (DDP_EMU_SCHEDULE,
// set_schedule), and how the turn passes from a thread that stops to the next ready one.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>

#include "cuda_emu_internal.h"

namespace ddp_emu {
namespace {

// Takes the next ready thread in the launch's order out of the ready set; kNoThread if none.
unsigned take_next_locked(Launch& l) {
  const size_t words = l.ready.size();
  size_t w = words;
  unsigned bit = 0;
  if (l.order == Schedule::kForward) {
    for (w = 0; w < words && l.ready[w] == 0; ++w) {
    }
    if (w < words) bit = static_cast<unsigned>(__builtin_ctzll(l.ready[w]));
  } else if (l.order == Schedule::kReverse) {
    for (w = words; w > 0 && l.ready[w - 1] == 0; --w) {
    }
    if (w == 0) return kNoThread;
    --w;
    bit = 63u - static_cast<unsigned>(__builtin_clzll(l.ready[w]));
  } else {
    uint64_t count = 0;
    for (uint64_t word : l.ready) count += static_cast<uint64_t>(__builtin_popcountll(word));
    if (count == 0) return kNoThread;
    uint64_t k = l.rng() % count;
    for (w = 0; k >= static_cast<uint64_t>(__builtin_popcountll(l.ready[w])); ++w) {
      k -= static_cast<uint64_t>(__builtin_popcountll(l.ready[w]));
    }
    uint64_t word = l.ready[w];
    for (; k > 0; --k) word &= word - 1;  // drop the k lowest set bits
    bit = static_cast<unsigned>(__builtin_ctzll(word));
  }
  if (w >= words) return kNoThread;
  l.ready[w] &= ~(uint64_t{1} << bit);
  return static_cast<unsigned>(w * 64 + bit);
}

std::mutex g_schedule_mu;
bool g_schedule_set = false;
ScheduleChoice g_schedule{Schedule::kParallel, 1};
uint64_t g_schedule_launches = 0;  // launches since the schedule was chosen

}  // namespace

namespace detail {

void mark_ready_locked(Launch& l, unsigned tid) { l.ready[tid / 64] |= uint64_t{1} << (tid % 64); }

// The calling thread stops running (it waits, or it returned): the next ready thread goes.
void pass_turn_locked(Launch& l) {
  const unsigned next = take_next_locked(l);
  __atomic_store_n(&l.turn, next, __ATOMIC_RELEASE);
  if (next != kNoThread) {
    l.go[next].bump();
    l.go[next].wake();
  }
}

// Every thread of the block is ready and the first in the order goes (a block's start).
void start_block_locked(Launch& l) {
  if (!l.serial()) return;
  std::fill(l.ready.begin(), l.ready.end(), 0);
  for (unsigned t = 0; t < l.threads; ++t) mark_ready_locked(l, t);
  pass_turn_locked(l);
}

// Returns when it is thread `tid`'s turn (at once in the parallel schedule); throws AbortBlock
// when the launch fails meanwhile.
void wait_turn(Launch& l, unsigned tid) {
  if (!l.serial()) return;
  for (;;) {
    const uint32_t seen = l.go[tid].value();
    if (is_aborted(l)) throw AbortBlock{};
    if (__atomic_load_n(&l.turn, __ATOMIC_ACQUIRE) == tid) return;
    l.go[tid].wait_change(seen);
  }
}

// The schedule of the next launch, and its place among the launches since it was chosen.
ScheduleChoice schedule_now(uint64_t* launch_index) {
  std::lock_guard<std::mutex> lk(g_schedule_mu);
  if (!g_schedule_set) {
    g_schedule_set = true;
    try {
      g_schedule.order = parse_schedule(std::getenv("DDP_EMU_SCHEDULE"), &g_schedule.seed);
    } catch (const std::exception& e) {
      // A misspelt schedule must not silently test something else.
      std::fprintf(stderr, "cuda emulation: %s\n", e.what());
      std::abort();
    }
  }
  if (launch_index != nullptr) *launch_index = g_schedule_launches++;
  return g_schedule;
}

}  // namespace detail

Schedule parse_schedule(const char* value, uint64_t* seed) {
  *seed = 1;
  const std::string v = value ? value : "";
  if (v.empty() || v == "parallel") return Schedule::kParallel;
  if (v == "forward") return Schedule::kForward;
  if (v == "reverse") return Schedule::kReverse;
  if (v == "random") return Schedule::kRandom;
  if (v == "rotate") return Schedule::kRotate;
  if (v.rfind("random:", 0) == 0 && v.size() > 7 &&
      v.find_first_not_of("0123456789", 7) == std::string::npos && v.size() <= 7 + 19) {
    *seed = std::stoull(v.substr(7));
    return Schedule::kRandom;
  }
  throw std::invalid_argument("DDP_EMU_SCHEDULE='" + v +
                              "' is not a schedule (parallel, forward, reverse, random, "
                              "random:SEED or rotate)");
}

Schedule schedule() { return schedule_now().order; }

uint64_t schedule_seed() { return schedule_now().seed; }

void set_schedule(Schedule order, uint64_t seed) {
  std::lock_guard<std::mutex> lk(g_schedule_mu);
  g_schedule_set = true;
  g_schedule = ScheduleChoice{order, seed};
  g_schedule_launches = 0;
}

}  // namespace ddp_emu
