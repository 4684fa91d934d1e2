// One job per directory (directory_lock.h).
#include "io/directory_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <utility>

#include "core/check.h"

namespace ddp {

namespace {

// A lock file larger than this is not one of ours: its contents are not shown in full.
constexpr size_t kMaxHolderText = 512;

std::string holder_text(int fd) {
  char buf[kMaxHolderText + 1] = {};
  const ssize_t n = ::pread(fd, buf, kMaxHolderText, 0);
  std::string text(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

std::string this_holder() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  char when[32] = {};
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return std::string("host ") + host + " pid " + std::to_string(::getpid()) + " since " + when +
         "\n";
}

// The lock file may have been unlinked (and made again) between our open and our flock: the
// lock we hold is then on a file no one else finds. Same device and inode: it is the one.
bool still_at_path(int fd, const std::string& path) {
  struct stat held {};
  struct stat named {};
  return ::fstat(fd, &held) == 0 && ::lstat(path.c_str(), &named) == 0 &&
         held.st_dev == named.st_dev && held.st_ino == named.st_ino;
}

// Opens the lock file without following a link planted in its place and without blocking on
// a FIFO; anything but a regular file is refused.
int open_lock_file(const std::string& path, const std::string& key) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
  const int err = errno;
  DDP_CHECK(fd >= 0, key << ": cannot open the lock file '" << path
                         << "': " << (err == ELOOP ? "it is a symbolic link" : std::strerror(err)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    DDP_THROW(key << ": the lock file '" << path << "' is not a regular file");
  }
  return fd;
}

}  // namespace

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& key) {
  const std::string path = dir + "/" + file_name();
  for (int attempt = 0; attempt < 8 && fd_ < 0; ++attempt) {
    const int fd = open_lock_file(path, key);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == ENOLCK || err == ENOSYS || err == EOPNOTSUPP) {
        warning_ = "warning: " + key + ": '" + dir + "' cannot be locked (" + std::strerror(err) +
                   "): a second job writing there at the same time would not be noticed";
        ::close(fd);
        return;
      }
      const std::string holder = holder_text(fd);
      ::close(fd);
      DDP_THROW(key << ": '" << dir << "' is in use by another job ("
                    << (holder.empty() ? "holder unknown" : holder) << ", lock file " << path
                    << "): two jobs in one directory overwrite each other's checkpoints, "
                       "metrics and model; wait for it to end or choose another directory");
    }
    if (!still_at_path(fd, path)) {
      ::close(fd);  // lost a race with its removal: take the new file's lock
      continue;
    }
    fd_ = fd;
  }
  DDP_CHECK(fd_ >= 0,
            key << ": cannot hold the lock file '" << path << "': it keeps being replaced");
  const std::string previous = holder_text(fd_);
  if (!previous.empty())
    warning_ = "warning: " + key + ": took over '" + path + "' from a job that is gone (" +
               previous + "); it did not end cleanly";
  const std::string mine = this_holder();
  const bool written = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, mine.data(), mine.size(), 0) ==
                                                       static_cast<ssize_t>(mine.size());
  const int err = errno;
  if (!written) {
    release();
    DDP_THROW(key << ": cannot write the lock file '" << path << "': " << std::strerror(err));
  }
}

DirectoryLock::~DirectoryLock() { release(); }

DirectoryLock::DirectoryLock(DirectoryLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), warning_(std::move(other.warning_)) {}

DirectoryLock& DirectoryLock::operator=(DirectoryLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
    warning_ = std::move(other.warning_);
  }
  return *this;
}

// Emptied first, then unlocked (closing drops the lock): the next holder sees a clean end.
void DirectoryLock::release() {
  if (fd_ < 0) return;
  if (::ftruncate(fd_, 0) != 0) {
    // Nothing to do: the next holder reports a job that did not end cleanly.
  }
  ::close(fd_);
  fd_ = -1;
}

}  // namespace ddp
