// Whether this process gave up on a collective because a peer did not arrive in time (a rank
// died, stalled or stopped on an error). The error itself is re-thrown with context on its way
// up, so main() asks this flag instead of the exception's type: such a failure exits
// kExitPeerLost, which tells a launcher that a restart from the newest checkpoint can help, unlike
// an error in the config or the data.
#pragma once

namespace ddp {

/// Records that a collective of this process timed out (throw_collective_timeout calls it, and
/// the NCCL communicator on a timeout or a peer's remote error).
void note_collective_timeout();

/// Whether a collective of this process has timed out.
bool collective_timed_out();

}  // namespace ddp
