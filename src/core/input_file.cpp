// Input files that are regular files (input_file.h).
#include "core/input_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/check.h"

namespace ddp {

std::string describe_file_type(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "of an unknown type";
}

InputFile::InputFile(const std::string& path, const std::string& name) {
  // O_NONBLOCK: open() returns at once for a FIFO without a writer; O_NOCTTY: a terminal named
  // by mistake does not become this process's controlling terminal.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  DDP_CHECK(fd_ >= 0, name << ": cannot open (" << std::strerror(errno) << ")");
  const int rc = ::fstat(fd_, &stat_);
  const int err = errno;
  std::string refusal;
  if (rc != 0) {
    refusal = std::string("cannot stat (") + std::strerror(err) + ")";
  } else if (!S_ISREG(stat_.st_mode)) {
    refusal = "not a regular file (" + describe_file_type(stat_.st_mode) + ")";
  } else {
    // Regular files never block; later reads should not see EAGAIN in any case.
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK) != 0)
      refusal = std::string("cannot clear O_NONBLOCK (") + std::strerror(errno) + ")";
  }
  if (refusal.empty()) return;
  ::close(std::exchange(fd_, -1));
  DDP_THROW(name << ": " << refusal);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

InputFile::InputFile(InputFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), stat_(other.stat_) {}

int InputFile::release() { return std::exchange(fd_, -1); }

InputStream open_input_stream(const std::string& path, const std::string& name) {
  InputFile file(path, name);
  InputStream stream(::fdopen(file.fd(), "rb"), &std::fclose);
  DDP_CHECK(stream != nullptr, name << ": cannot open (" << std::strerror(errno) << ")");
  file.release();  // the stream closes it now
  return stream;
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {};
  struct stat sb {};
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void refuse_output_onto_input(const std::string& output, const std::string& output_name,
                              const std::string& input, const std::string& input_name) {
  DDP_CHECK(!same_file(output, input),
            output_name << " " << output << " is " << input_name << " " << input
                        << " (the same file): writing it would replace an input that is "
                           "still being read; write elsewhere");
}

}  // namespace ddp
