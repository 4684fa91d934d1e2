// The MPI test programs' scratch directories: each process notes the ones it created, and the
// test main removes them once every rank has finished (other ranks read what rank 0 wrote), so
// runs leave nothing in the temporary directory. A failed run keeps them to be looked at.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace ddp_test {

inline std::vector<std::filesystem::path>& scratch_dirs() {
  static std::vector<std::filesystem::path> dirs;
  return dirs;
}

/// A fresh directory under the temporary directory, named after the process and `name`; removed
/// by remove_scratch_dirs().
inline std::string scratch_dir(const std::string& prefix, const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             (prefix + std::to_string(::getpid()) + "_" + name);
  if (std::filesystem::create_directories(dir)) scratch_dirs().push_back(dir);
  return dir.string();
}

/// Removes this process's scratch directories; call when no rank uses them any more.
inline void remove_scratch_dirs() {
  for (const auto& dir : scratch_dirs()) {
    std::error_code ignored;  // best effort: a leftover is untidy, not a test failure
    std::filesystem::remove_all(dir, ignored);
  }
  scratch_dirs().clear();
}

}  // namespace ddp_test
