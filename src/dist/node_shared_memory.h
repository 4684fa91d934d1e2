// Memory the ranks of one node map together: one copy of a data set per node instead of one per
// rank. A file in /dev/shm (tmpfs, so the pages are memory, not disk), created and written by the
// node's first rank, mapped read-only by the others, and unlinked as soon as every rank has it:
// nothing is left behind, even when the job is killed, and releasing it is a local munmap, never
// a collective a lost peer could hang.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "dist/process_group.h"

namespace ddp {

struct NodeSharedMemory {
  std::shared_ptr<const void> data;  ///< the mapping (nullptr when the node cannot share)
  size_t bytes = 0;
  std::string why_not;  ///< why each rank must keep its own copy (data == nullptr)
};

/// Collective over `group`: `bytes` of memory every rank of this node maps, which the node's
/// first rank (local_rank 0) fills with `fill` before any rank returns. Every rank passes the
/// same `bytes`. A throw from `fill` ends every rank (run_agreed). Where /dev/shm cannot hold it
/// (missing, full), every rank of the job gets data == nullptr and the reason.
NodeSharedMemory share_on_node(ProcessGroup& group, size_t bytes,
                               const std::function<void(void*)>& fill,
                               const std::string& directory = "/dev/shm");

}  // namespace ddp
