// The process's "a collective timed out" flag (lost_peer.h).
#include "comm/lost_peer.h"

#include <atomic>

namespace ddp {

namespace {
std::atomic<bool> timed_out{false};
}  // namespace

void note_collective_timeout() { timed_out.store(true, std::memory_order_relaxed); }

bool collective_timed_out() { return timed_out.load(std::memory_order_relaxed); }

}  // namespace ddp
