// The clocks every timing in the library uses: one monotonic wall clock shared by all threads
// (and by the GPU timings converted onto it), and the CPU time of the calling thread.
#pragma once

namespace ddp {

/// Monotonic clock in seconds, shared by timings on all threads.
double seconds_now();

/// CPU time consumed by the calling thread, in seconds (what it really computed, as opposed
/// to the wall time during which it may have waited for a core).
double thread_cpu_seconds();

}  // namespace ddp
