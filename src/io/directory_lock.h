// A directory held by one job at a time: an exclusive flock on "<dir>/.ddp-lock", a file that
// says who holds it ("host H pid P since T"). The kernel drops the lock when its process ends,
// however it ends, so a lock left by a killed job is taken over (and its holder reported); a
// live holder's is refused by name. Released, the file is emptied, so an empty file means the
// last holder ended cleanly.
#pragma once

#include <string>

namespace ddp {

class DirectoryLock {
 public:
  DirectoryLock() = default;
  /// Takes the lock of `dir` (which must exist) or throws ddp::Error naming `key` (the config
  /// key of the directory), the directory and the holder. On a file system without locks the
  /// directory is used unlocked and warning() says so.
  DirectoryLock(const std::string& dir, const std::string& key);
  ~DirectoryLock();
  DirectoryLock(DirectoryLock&& other) noexcept;
  DirectoryLock& operator=(DirectoryLock&& other) noexcept;
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  /// A line for the log, or "": a lock taken over from a holder that is gone, or no lock.
  const std::string& warning() const { return warning_; }
  static const char* file_name() { return ".ddp-lock"; }

 private:
  void release();

  int fd_ = -1;
  std::string warning_;
};

}  // namespace ddp
