// The one way ddp writes a file (model, checkpoints, trace, metrics, config copy, .npy,
// predictions): the bytes go to a temporary file beside the target, named
// "<target>.tmp.<pid>.<16 random hex digits>" and created O_EXCL | O_NOFOLLOW with the process's
// umask, so a name planted in a shared folder is never opened and never followed; commit()
// makes it durable (fsync), renames it over the target (a symbolic link at the target is
// replaced, not followed) and makes the rename durable (fsync of the directory). Destroyed
// before commit(), it removes the temporary file, so every failure path, exceptions included,
// leaves no debris and the old file untouched. A file that is open for reading (or mapped) is
// never truncated: the target is replaced by a new file, never written in place.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ddp {

class AtomicFile {
 public:
  /// `what` names the kind of file in errors: "cannot save <what> '<path>': <action> '<file>':
  /// <reason>".
  AtomicFile(std::string path, std::string what);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// Appends all `bytes` or throws ddp::Error.
  void write(const void* data, size_t bytes);
  void write(const std::string& text) { write(text.data(), text.size()); }
  /// Makes the data durable, then atomically replaces the target with it.
  void commit();
  /// For a file read while it grows (metrics.jsonl): replaces the target with what was written
  /// so far now; later writes append to the target, and commit() then only makes them durable.
  void publish();
  /// fsync of what was written so far (a published file's records survive a crash).
  void sync();
  const std::string& path() const { return final_path_; }

 private:
  [[noreturn]] void fail(int err, const char* action, const std::string& file) const;
  void sync_directory(const std::string& dir) const;
  void rename_into_place();

  std::string tmp_path_, final_path_, what_;
  int fd_ = -1;
  bool renamed_ = false;
};

/// Whether `name` (a file name, no directory) is a temporary file of AtomicFile; its writer's
/// pid in *pid.
bool is_atomic_temporary(const std::string& name, long* pid);

/// Removes the temporary files in `dir` whose writer is gone: named as AtomicFile names them,
/// regular files (a link of that name is not ours and stays), written by a process that no
/// longer exists on this machine (another live process's are left alone). Returns their paths.
std::vector<std::string> remove_abandoned_temporaries(const std::string& dir);

}  // namespace ddp
