// File-system fixtures for tests: a temporary directory removed at scope exit, whole-file
// reads and writes, and two ways to make writes fail like a full disk (a file-size limit,
// which needs no privileges, and a tiny tmpfs, which needs root).
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace ddp_test {

/// A fresh directory under the temp directory, removed with everything in it at scope exit.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "ddp_test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::vector<std::string> dir_entries(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

/// A pid that no process has now: a child that has exited and been reaped (what a writer killed
/// mid-write leaves in the names of its files).
inline long dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  REQUIRE(::waitpid(child, nullptr, 0) == child);
  return child;
}

/// Caps this process's file size so write() fails part-way (EFBIG), like a full disk.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved_) == 0);
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);  // get EFBIG instead of being killed
    rlimit capped = saved_;
    capped.rlim_cur = bytes;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &capped) == 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    ::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit saved_{};
  void (*old_handler_)(int) = nullptr;
};

/// A tmpfs of `size_option` ("size=64k") mounted on `dir` for the object's lifetime; ok() is
/// false where mounting is not allowed.
class TinyTmpfs {
 public:
  TinyTmpfs(const std::string& dir, const char* size_option) : dir_(dir) {
    mounted_ = ::geteuid() == 0 && ::mount("tmpfs", dir_.c_str(), "tmpfs", 0, size_option) == 0;
  }
  ~TinyTmpfs() {
    if (mounted_) ::umount(dir_.c_str());
  }
  TinyTmpfs(const TinyTmpfs&) = delete;
  TinyTmpfs& operator=(const TinyTmpfs&) = delete;
  bool ok() const { return mounted_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

}  // namespace ddp_test
