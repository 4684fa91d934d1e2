// A file written whole or not at all: the bytes go to a temporary file beside the target (same
// directory, so the rename is atomic; the pid keeps concurrent ranks apart), which commit()
// makes durable (fsync), renames over the target and makes the rename durable (fsync of the
// directory). Destroyed before commit(), it removes the temporary file, so every failure path,
// exceptions included, leaves no debris and the old file untouched.
#pragma once

#include <cstddef>
#include <string>

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
  /// Makes the data durable, then atomically replaces the target with it.
  void commit();

 private:
  [[noreturn]] void fail(int err, const char* action, const std::string& file) const;
  void sync_directory(const std::string& dir) const;

  std::string tmp_path_, final_path_, what_;
  int fd_ = -1;
  bool renamed_ = false;
};

}  // namespace ddp
