// Opening a file to read, refusing anything but a regular file before a byte is read: a FIFO
// blocks open() until a writer comes (forever, if none does), a device such as /dev/zero never
// ends, a directory fails only at the first read. Every reader of configs, data, models and
// checkpoints opens its file here; and an output that is one of the inputs is refused by file
// identity, not by spelling.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

namespace ddp {

/// A read-only descriptor of a regular file, closed on destruction unless released.
class InputFile {
 public:
  /// Opens `path` with O_RDONLY | O_NONBLOCK (so a FIFO cannot block) | O_CLOEXEC | O_NOCTTY,
  /// checks with fstat that it is a regular file, then clears O_NONBLOCK. Throws ddp::Error
  /// "<name>: cannot open (<reason>)" or "<name>: not a regular file (a FIFO)"; `name` is how
  /// the caller names the file in its messages (the path itself, "npy file 'x.npy'", ...).
  InputFile(const std::string& path, const std::string& name);
  ~InputFile();
  InputFile(InputFile&& other) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  InputFile& operator=(InputFile&&) = delete;

  int fd() const { return fd_; }
  /// The file's size when it was opened.
  uint64_t size() const { return static_cast<uint64_t>(stat_.st_size); }
  const struct stat& status() const { return stat_; }
  /// Hands the descriptor over (to gzdopen, fdopen, a mapping's owner): the caller closes it.
  int release();

 private:
  int fd_ = -1;
  struct stat stat_ {};
};

/// What a mode names for messages: "a FIFO", "a directory", "a character device", ...
std::string describe_file_type(mode_t mode);

using InputStream = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

/// The file as a buffered stream ("rb"), opened and refused as InputFile does.
InputStream open_input_stream(const std::string& path, const std::string& name);

/// Whether `a` and `b` both exist and are one file (same device and inode: "./a" and "a", hard
/// links and symbolic links to it all are).
bool same_file(const std::string& a, const std::string& b);

/// Throws ddp::Error "<output_name> <output> is <input_name> <input>: ..." when writing the
/// output would replace an input the command still reads (or maps).
void refuse_output_onto_input(const std::string& output, const std::string& output_name,
                              const std::string& input, const std::string& input_name);

}  // namespace ddp
