// A file written whole or not at all (atomic_file.h).
#include "core/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <utility>

#include "core/check.h"

namespace ddp {

namespace {

// One write() at most this long: Linux writes at most about 2 GiB per call anyway.
constexpr size_t kWriteChunk = size_t{1} << 30;
constexpr const char* kTempMark = ".tmp.";
constexpr size_t kRandomDigits = 16;
// O_EXCL fails when the name exists: another (unpredictable) name is tried this often.
constexpr int kCreateAttempts = 64;

std::string parent_directory(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// 16 hex digits from the kernel's generator: a name no other user can guess and plant first.
std::string random_hex() {
  unsigned char bytes[kRandomDigits / 2];
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    DDP_CHECK(n > 0, "getrandom failed: " << std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  std::string hex;
  char digits[3];
  for (unsigned char b : bytes) {
    std::snprintf(digits, sizeof digits, "%02x", b);
    hex += digits;
  }
  return hex;
}

// The temporary files this process is writing now: never "abandoned", whatever their pid says.
std::mutex& open_mutex() {
  static std::mutex m;
  return m;
}
std::set<std::string>& open_temporaries() {
  static std::set<std::string> paths;
  return paths;
}

void track(const std::string& path, bool open) {
  std::lock_guard<std::mutex> lock(open_mutex());
  if (open) {
    open_temporaries().insert(path);
  } else {
    open_temporaries().erase(path);
  }
}

bool is_open_here(const std::string& path) {
  std::lock_guard<std::mutex> lock(open_mutex());
  return open_temporaries().count(path) != 0;
}

// Whether a process with this pid exists (EPERM: it does, another user's).
bool process_exists(long pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH; }

}  // namespace

AtomicFile::AtomicFile(std::string path, std::string what)
    : final_path_(std::move(path)), what_(std::move(what)) {
  const std::string stem = final_path_ + kTempMark + std::to_string(::getpid()) + ".";
  for (int attempt = 0; attempt < kCreateAttempts && fd_ < 0; ++attempt) {
    tmp_path_ = stem + random_hex();
    // 0666: the process's umask decides, as for any file the user's programs create.
    fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd_ < 0 && errno != EEXIST) break;
  }
  if (fd_ < 0) fail(errno, "create temporary file", tmp_path_);
  track(tmp_path_, true);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!renamed_) ::unlink(tmp_path_.c_str());
  track(tmp_path_, false);
}

void AtomicFile::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  const std::string& file = renamed_ ? final_path_ : tmp_path_;
  while (bytes > 0) {  // write() may legally write less than asked
    const ssize_t n = ::write(fd_, p, std::min(bytes, kWriteChunk));
    const int err = n < 0 ? errno : ENOSPC;
    if (n < 0 && err == EINTR) continue;
    // A zero-byte write makes no progress; report it as the full disk it almost always is.
    if (n <= 0) fail(err, "write", file);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFile::sync() {
  if (::fsync(fd_) != 0) fail(errno, "fsync", renamed_ ? final_path_ : tmp_path_);
}

void AtomicFile::rename_into_place() {
  if (::rename(tmp_path_.c_str(), final_path_.c_str()) != 0)
    fail(errno, "rename (over it) temporary file", tmp_path_);
  renamed_ = true;
  track(tmp_path_, false);
  sync_directory(parent_directory(final_path_));
}

void AtomicFile::publish() {
  if (renamed_) return;
  sync();
  rename_into_place();
}

void AtomicFile::commit() {
  sync();
  const int fd = std::exchange(fd_, -1);
  // close() can report deferred write errors (NFS, quota), so it is checked too.
  if (::close(fd) != 0) fail(errno, "close", renamed_ ? final_path_ : tmp_path_);
  if (!renamed_) rename_into_place();
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

bool is_atomic_temporary(const std::string& name, long* pid) {
  const size_t mark = name.rfind(kTempMark);
  if (mark == std::string::npos || mark == 0) return false;
  const std::string rest = name.substr(mark + std::strlen(kTempMark));  // "<pid>.<hex>"
  const size_t dot = rest.find('.');
  if (dot == std::string::npos || dot == 0 || dot > 10) return false;
  const std::string digits = rest.substr(0, dot), hex = rest.substr(dot + 1);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return false;
  if (hex.size() != kRandomDigits || hex.find_first_not_of("0123456789abcdef") != std::string::npos)
    return false;
  *pid = std::stol(digits);
  return true;
}

std::vector<std::string> remove_abandoned_temporaries(const std::string& dir) {
  std::vector<std::string> removed;
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) return removed;
  while (const dirent* e = ::readdir(d.get())) {
    long pid = 0;
    if (!is_atomic_temporary(e->d_name, &pid)) continue;
    const std::string path = dir + "/" + e->d_name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid())
      continue;
    const bool ours_in_flight = pid == ::getpid() && is_open_here(path);
    if (ours_in_flight || (pid != ::getpid() && process_exists(pid))) continue;
    if (::unlink(path.c_str()) == 0) removed.push_back(path);
  }
  return removed;
}

}  // namespace ddp
