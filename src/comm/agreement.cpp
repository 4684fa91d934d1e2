// Agreement collectives (agreement.h).
#include "comm/agreement.h"

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "core/check.h"

namespace ddp {

void run_agreed(ProcessGroup& group, const std::function<void()>& fn) {
  std::string message;
  try {
    fn();
  } catch (const std::exception& e) {
    message = e.what();
    if (message.empty()) message = "unknown error";
  }
  double first_failed = message.empty() ? group.size() : group.rank();
  group.allreduce(&first_failed, 1, ReduceOp::Min);
  const int root = static_cast<int>(first_failed);
  if (root >= group.size()) return;
  throw CollectiveError(broadcast_string(group, message, root));
}

std::string broadcast_string(ProcessGroup& group, const std::string& s, int root) {
  uint64_t n = s.size();
  group.broadcast(&n, sizeof(n), root);
  std::string out = group.rank() == root ? s : std::string(n, '\0');
  if (n > 0) group.broadcast(out.data(), n, root);
  return out;
}

std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& mine) {
  std::vector<std::string> all;
  for (int r = 0; r < group.size(); ++r)
    all.push_back(broadcast_string(group, r == group.rank() ? mine : std::string(), r));
  return all;
}

void require_same_as_rank0(ProcessGroup& group, const std::vector<std::string>& mine,
                           const std::string& subject, const std::string& remedy) {
  std::string text;
  for (const std::string& line : mine) text += line + "\n";
  const std::string root_text = broadcast_string(group, text, 0);
  if (group.rank() == 0) return;
  std::vector<std::string> theirs;
  std::istringstream iss(root_text);
  for (std::string line; std::getline(iss, line);) theirs.push_back(line);
  for (size_t i = 0; i < std::max(mine.size(), theirs.size()); ++i) {
    const std::string a = i < theirs.size() ? theirs[i] : "(nothing)";
    const std::string b = i < mine.size() ? mine[i] : "(nothing)";
    if (a != b) {
      DDP_THROW(subject << " differs from rank 0's: rank 0 has '" << a << "' where rank "
                        << group.rank() << " has '" << b << "'; " << remedy);
    }
  }
}

RankLayout rank_layout(ProcessGroup& group) {
  const double local = group.local_size();
  double sizes[2] = {local, -local};  // the minimum of both: fewest, and minus the most
  group.allreduce(sizes, 2, ReduceOp::Min);
  RankLayout layout;
  layout.ranks = group.size();
  layout.local_ranks = group.local_size();
  layout.fewest_local = static_cast<int>(sizes[0]);
  layout.most_local = static_cast<int>(-sizes[1]);
  return layout;
}

}  // namespace ddp
