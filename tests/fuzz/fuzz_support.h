// Shared by the libFuzzer harnesses: an in-memory file whose /proc/self/fd path the path-taking
// readers can open, and the rule that ddp::Error is the only acceptable way to refuse an input.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <typeinfo>

#include "core/check.h"

namespace ddp::fuzz {

/// A memfd rewritten for every input: no disk traffic, nothing left behind when a run crashes,
/// and each harness process gets its own file, so parallel fuzzing jobs do not collide.
class MemFile {
 public:
  explicit MemFile(const char* name) : fd_(memfd_create(name, 0)) {
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  /// Replaces the contents with `size` bytes from `data`; returns the path to open.
  const std::string& write(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0) fail("ftruncate");
    size_t done = 0;
    while (done < size) {
      const ssize_t n = pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) fail("pwrite");
      done += static_cast<size_t>(n);
    }
    return path_;
  }

 private:
  [[noreturn]] static void fail(const char* what) {
    std::perror(what);
    std::abort();
  }
  int fd_;
  std::string path_;
};

/// Aborts with `what` when an invariant of a successful read does not hold.
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "==fuzz== invariant violated: %s\n", what);
    std::abort();
  }
}

/// Runs `read`. ddp::Error is how a reader rejects bad input, so it is swallowed; any other
/// exception escaped a reader's checks (a std::length_error from a size taken on trust, say) and
/// aborts with its message, which libFuzzer records as a crash like any sanitizer report.
template <class Fn>
void expect_only_ddp_errors(Fn&& read) {
  try {
    read();
  } catch (const ddp::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "==fuzz== exception other than ddp::Error (%s): %s\n", typeid(e).name(),
                 e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "==fuzz== exception of unknown type\n");
    std::abort();
  }
}

}  // namespace ddp::fuzz
