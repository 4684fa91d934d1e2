// One mapping per node (node_shared_memory.h).
#include "dist/node_shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>

#include "core/check.h"
#include "dist/agreement.h"

namespace ddp {

namespace {

std::shared_ptr<const void> as_shared(void* map, size_t bytes) {
  return std::shared_ptr<const void>(
      map, [bytes](const void* p) { munmap(const_cast<void*>(p), bytes); });
}

std::string errno_text() { return std::strerror(errno); }

// The node's first rank: the file, sized with real pages (tmpfs would otherwise fail later with
// SIGBUS on the first write it cannot back), mapped for writing. Empty on failure, with `why`.
std::shared_ptr<const void> create(const std::string& path, size_t bytes, std::string& why) {
  const int fd = open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    why = path + ": cannot create (" + errno_text() + ")";
    return nullptr;
  }
  const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  void* map = err == 0 ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : nullptr;
  if (err != 0 || map == MAP_FAILED) {
    why = path + ": cannot hold " + std::to_string(bytes) + " bytes (" +
          (err != 0 ? std::strerror(err) : errno_text()) + ")";
    close(fd);
    unlink(path.c_str());
    return nullptr;
  }
  close(fd);
  return as_shared(map, bytes);
}

// The other ranks of the node: the same file, read-only, checked to be the size asked for.
std::shared_ptr<const void> attach(const std::string& path, size_t bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DDP_CHECK(fd >= 0, path << ": cannot open the node's shared copy (" << errno_text() << ")");
  struct stat st {};
  const bool sized = fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == bytes;
  void* map = sized ? mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
  close(fd);
  DDP_CHECK(sized, path << ": the node's shared copy holds " << st.st_size << " bytes, not "
                        << bytes << " (do the nodes read different files?)");
  DDP_CHECK(map != MAP_FAILED,
            path << ": cannot map the node's shared copy (" << errno_text() << ")");
  return as_shared(map, bytes);
}

// Unlinks the file when the call ends, on every path: by then every rank has mapped it, or the
// call has failed everywhere.
struct Unlinker {
  std::string path;
  ~Unlinker() {
    if (!path.empty()) unlink(path.c_str());
  }
};

}  // namespace

NodeSharedMemory share_on_node(ProcessGroup& group, size_t bytes,
                               const std::function<void(void*)>& fill,
                               const std::string& directory) {
  DDP_CHECK(bytes > 0, "share_on_node: nothing to share");
  std::ostringstream name;
  if (group.rank() == 0) name << directory << "/ddp-" << getpid() << '-' << std::random_device{}();
  const std::string path = broadcast_string(group, name.str(), 0);
  const bool first = group.local_rank() == 0;
  NodeSharedMemory out;
  out.bytes = bytes;
  Unlinker unlinker;
  run_agreed(group, [&] {
    if (!first) return;
    out.data = create(path, bytes, out.why_not);
    if (!out.data) return;
    unlinker.path = path;
    fill(const_cast<void*>(out.data.get()));
  });
  // Every node must be able to share, or no rank does (one code path for the whole job).
  double failed = first && !out.data ? 1.0 : 0.0;
  group.allreduce(&failed, 1, ReduceOp::Max);
  if (failed > 0) {
    out.data.reset();
    const std::string why = broadcast_string(group, out.why_not, 0);
    out.why_not = why.empty() ? "another node could not share its copy" : why;
    return out;
  }
  run_agreed(group, [&] {
    if (!first) out.data = attach(path, bytes);
  });
  group.barrier();  // every rank has it mapped: the name can go
  return out;
}

}  // namespace ddp
