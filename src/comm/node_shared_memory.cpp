// One mapping per node (node_shared_memory.h).
#include "comm/node_shared_memory.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>

#include "core/check.h"
#include "comm/agreement.h"

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

// "ddp-<uid>-<job>-": every copy of this user's job starts so; the creator's pid follows.
std::string copy_prefix(const std::string& job) {
  return "ddp-" + std::to_string(geteuid()) + "-" + job + "-";
}

// The creator's pid in "<prefix><pid>-<random>", or 0 when `name` is not a copy of the job.
pid_t creator_of(const std::string& name, const std::string& prefix) {
  if (name.compare(0, prefix.size(), prefix) != 0) return 0;
  const size_t dash = name.find('-', prefix.size());
  if (dash == std::string::npos || dash == prefix.size() || dash - prefix.size() > 9) return 0;
  pid_t pid = 0;
  for (size_t i = prefix.size(); i < dash; ++i) {
    if (name[i] < '0' || name[i] > '9') return 0;
    pid = pid * 10 + (name[i] - '0');
  }
  return pid;
}

// Every rank's copy name, in rank order: each node's first rank names its own (its pid and a
// random number); the others' entries are empty. One allgather.
std::vector<std::string> copy_names(ProcessGroup& group, const std::string& directory,
                                    const std::string& job) {
  double mine[2] = {0.0, 0.0};
  if (group.local_rank() == 0) {
    std::random_device device;
    const uint64_t bits = (uint64_t{device()} << 16) ^ device();  // 48 bits: exact in a double
    mine[0] = getpid();
    mine[1] = static_cast<double>(bits & ((uint64_t{1} << 48) - 1));
  }
  std::vector<double> all(2 * static_cast<size_t>(group.size()));
  group.allgather(mine, 2, all.data());
  std::vector<std::string> names(static_cast<size_t>(group.size()));
  for (size_t r = 0; r < names.size(); ++r) {
    if (all[2 * r] == 0.0) continue;
    std::ostringstream name;
    name << directory << '/' << copy_prefix(job) << static_cast<int64_t>(all[2 * r]) << '-'
         << std::hex << static_cast<uint64_t>(all[2 * r + 1]);
    names[r] = name.str();
  }
  return names;
}

// The copy of this rank's node: among the copies of the first ranks up to this one, the last
// that this node's directory holds. On a real node that is the only one (other nodes' copies
// are in their own /dev/shm); ranks standing in for several nodes on one machine come in
// blocks of consecutive ranks, so the last one is their block's.
std::string node_copy(const std::vector<std::string>& names, int rank) {
  for (int r = rank; r >= 0; --r) {
    const std::string& name = names[static_cast<size_t>(r)];
    if (!name.empty() && access(name.c_str(), F_OK) == 0) return name;
  }
  DDP_THROW("no shared copy of the node's first rank found (looked for " << names[0] << ")");
}

// Every rank's lines on every rank (only when some rank has any: usually one allreduce).
std::vector<std::string> gather_lines(ProcessGroup& group, const std::vector<std::string>& mine) {
  double any = mine.empty() ? 0.0 : 1.0;
  group.allreduce(&any, 1, ReduceOp::Max);
  if (any == 0.0) return {};
  std::string text;
  for (const std::string& line : mine) text += line + '\n';
  std::vector<std::string> lines;
  for (const std::string& rank_text : all_gather_strings(group, text)) {
    std::istringstream in(rank_text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
  }
  return lines;
}

}  // namespace

std::string node_job_key(const char* slurm_job_id, const std::string& output_dir) {
  const std::string id = slurm_job_id != nullptr ? slurm_job_id : "";
  const bool digits =
      !id.empty() && id.size() <= 20 && id.find_first_not_of("0123456789") == std::string::npos;
  if (digits) return "slurm" + id;
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path dir = fs::absolute(output_dir, ec);
  if (ec) dir = output_dir;
  dir = dir.lexically_normal();  // then hashed: FNV-1a
  if (!dir.has_filename() && dir.has_relative_path()) dir = dir.parent_path();  // "out/": "out"
  uint64_t hash = 14695981039346656037ull;
  for (const unsigned char c : dir.string()) hash = (hash ^ c) * 1099511628211ull;
  std::ostringstream key;
  key << "out" << std::hex << hash;
  return key.str();
}

std::vector<std::string> sweep_dead_copies(const std::string& directory, const std::string& job) {
  const std::string prefix = copy_prefix(job);
  std::vector<std::string> removed;
  std::error_code ec;
  // A directory that cannot be read has nothing to sweep; creating the copy then says why.
  for (std::filesystem::directory_iterator it(directory, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::filesystem::directory_entry& entry = *it;
    const std::string name = entry.path().filename().string();
    const pid_t pid = creator_of(name, prefix);
    struct stat st {};
    const std::string path = entry.path().string();
    if (pid <= 0 || lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid())
      continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (EPERM: another user's process)
    if (unlink(path.c_str()) != 0) continue;
    removed.push_back("removed " + path + " (" + std::to_string(st.st_size) +
                      " bytes), the node's shared copy of a run of this job whose process " +
                      std::to_string(pid) + " is gone");
  }
  return removed;
}

NodeSharedMemory share_on_node(ProcessGroup& group, size_t bytes,
                               const std::function<void(void*)>& fill, const std::string& job,
                               const std::string& directory) {
  DDP_CHECK(bytes > 0, "share_on_node: nothing to share");
  const bool first = group.local_rank() == 0;
  // Rank 0's key on every rank: the ranks' output directories may be spelt apart.
  const std::string key = broadcast_string(group, job, 0);
  NodeSharedMemory out;
  out.bytes = bytes;
  out.swept =
      gather_lines(group, first ? sweep_dead_copies(directory, key) : std::vector<std::string>{});
  const std::vector<std::string> names = copy_names(group, directory, key);
  Unlinker unlinker;
  run_agreed(group, [&] {
    if (!first) return;
    const std::string& path = names[static_cast<size_t>(group.rank())];
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
    if (!first) out.data = attach(node_copy(names, group.rank()), bytes);
  });
  group.barrier();  // every rank has it mapped: the name can go
  return out;
}

}  // namespace ddp
