// Collectives that make the ranks agree: on an error (the lowest failing rank's message for
// all), on text (rank 0's, or every rank's in rank order), on "the same as rank 0". Built on
// the ProcessGroup's broadcast and scalar allreduce, so every backend has them; and where the
// ranks are, which every rank must see alike.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "config/gradient_path.h"

namespace ddp {

/// Runs fn on every rank of group. If it throws ddp::Error (or any std::exception) on any rank,
/// every rank throws a CollectiveError with the message of the lowest failing rank, so a
/// setup failure ends the whole job with one message and no rank left waiting.
void run_agreed(ProcessGroup& group, const std::function<void()>& fn);

/// Broadcasts a string from `root` (size, then bytes); returns root's string on every rank.
std::string broadcast_string(ProcessGroup& group, const std::string& s, int root);

/// Every rank's `mine`, in rank order, on every rank.
std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& mine);

/// Collective: throws (on the ranks that differ) "<subject> differs from rank 0's: rank 0 has
/// '<line>' where rank R has '<line>'; <remedy>", naming the first line that differs.
void require_same_as_rank0(ProcessGroup& group, const std::vector<std::string>& mine,
                           const std::string& subject, const std::string& remedy);

/// Collective: where the ranks of `group` are (every rank learns the smallest and the largest
/// node).
RankLayout rank_layout(ProcessGroup& group);

}  // namespace ddp
