// Memory the ranks of one node map together: one copy of a data set per node instead of one per
// rank. A file in /dev/shm (tmpfs, so the pages are memory, not disk), created and written by the
// node's first rank, mapped read-only by the others, and unlinked as soon as every rank has it;
// releasing it is a local munmap, never a collective a lost peer could hang. A job killed before
// the unlink leaves its copy behind: the file's name says whose it is (user, job, creating
// process), and the next run of the job on the node removes it once that process is gone.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"

namespace ddp {

struct NodeSharedMemory {
  std::shared_ptr<const void> data;  ///< the mapping (nullptr when the node cannot share)
  size_t bytes = 0;
  std::string why_not;  ///< why each rank must keep its own copy (data == nullptr)
  /// Dead runs' copies the nodes' first ranks removed first (sweep_dead_copies), every node's
  /// on every rank: one line each, for the log.
  std::vector<std::string> swept;
};

/// What names a job's copies across its reruns on a node: the Slurm job id (which a requeued
/// job keeps) when there is one, else a hash of the absolute output directory (an output
/// directory belongs to one job). Letters and digits only.
std::string node_job_key(const char* slurm_job_id, const std::string& output_dir);

/// Collective over `group`: `bytes` of memory every rank of this node maps, which the node's
/// first rank (local_rank 0) fills with `fill` before any rank returns; it is the file
/// `directory`/ddp-<uid>-<job>-<its pid>-<random> until every rank has mapped it. The first ranks
/// sweep `directory` of the job's dead copies before. Every rank passes the same `bytes`; rank
/// 0's `job` (node_job_key) names the copies on every node. A throw from `fill` ends every rank
/// (run_agreed). Where `directory` cannot hold it (missing, full), every rank of the job gets
/// data == nullptr and the reason.
NodeSharedMemory share_on_node(ProcessGroup& group, size_t bytes,
                               const std::function<void(void*)>& fill, const std::string& job,
                               const std::string& directory = "/dev/shm");

/// Removes from `directory` the copies of job `job` whose creator died before unlinking them:
/// files named ddp-<uid>-<job>-<pid>-..., owned by this user, whose process `pid` is gone from
/// this node (kill(pid, 0) fails with ESRCH). A live creator's file (a run still starting),
/// another user's and another job's are kept. Returns a line naming each file removed.
std::vector<std::string> sweep_dead_copies(const std::string& directory, const std::string& job);

}  // namespace ddp
