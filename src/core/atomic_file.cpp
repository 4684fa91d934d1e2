// A file written whole or not at all (atomic_file.h).
#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/check.h"

namespace ddp {

namespace {

// One write() at most this long: Linux writes at most about 2 GiB per call anyway.
constexpr size_t kWriteChunk = size_t{1} << 30;

std::string parent_directory(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

AtomicFile::AtomicFile(std::string path, std::string what)
    : tmp_path_(path + ".tmp." + std::to_string(::getpid())),
      final_path_(std::move(path)),
      what_(std::move(what)) {
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(errno, "create temporary file", tmp_path_);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!renamed_) ::unlink(tmp_path_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {  // write() may legally write less than asked
    const ssize_t n = ::write(fd_, p, std::min(bytes, kWriteChunk));
    const int err = n < 0 ? errno : ENOSPC;
    if (n < 0 && err == EINTR) continue;
    // A zero-byte write makes no progress; report it as the full disk it almost always is.
    if (n <= 0) fail(err, "write temporary file", tmp_path_);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail(errno, "fsync temporary file", tmp_path_);
  const int fd = std::exchange(fd_, -1);
  // close() can report deferred write errors (NFS, quota), so it is checked too.
  if (::close(fd) != 0) fail(errno, "close temporary file", tmp_path_);
  if (::rename(tmp_path_.c_str(), final_path_.c_str()) != 0)
    fail(errno, "rename (over it) temporary file", tmp_path_);
  renamed_ = true;
  sync_directory(parent_directory(final_path_));
}

// Takes errno first and no temporaries, so nothing can clobber errno before it is read.
void AtomicFile::fail(int err, const char* action, const std::string& file) const {
  DDP_THROW("cannot save " << what_ << " '" << final_path_ << "': " << action << " '" << file
                           << "': " << std::strerror(err));
}

// Without this the rename itself may not survive a crash.
void AtomicFile::sync_directory(const std::string& dir) const {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(errno, "open (to fsync) directory", dir);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // EINVAL: this file system cannot sync directories, so there is nothing more to do.
  if (rc != 0 && err != EINVAL) fail(err, "fsync directory", dir);
}

}  // namespace ddp
