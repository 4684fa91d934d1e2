// One job per directory (io/directory_lock.h): a second holder is refused naming the first, a
// dead holder's lock is taken over with a warning, a clean release empties the file, and a
// link or a FIFO in the lock file's place is refused, never followed or waited on.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "core/check.h"
#include "io/directory_lock.h"
#include "temp_files.h"

namespace {

namespace fs = std::filesystem;
using Catch::Contains;
using ddp_test::read_bytes;
using ddp_test::TempDir;
using ddp_test::write_bytes;

std::string lock_file(const TempDir& dir) { return dir.file(ddp::DirectoryLock::file_name()); }

}  // namespace

TEST_CASE("a directory's second holder is refused naming the first", "[directory_lock]") {
  TempDir dir;
  ddp::DirectoryLock first(dir.path().string(), "output.dir");
  CHECK(first.warning().empty());
  const std::string holder = read_bytes(lock_file(dir));
  CHECK_THAT(holder, Contains("pid " + std::to_string(::getpid()) + " since "));
  CHECK_THROWS_WITH(
      ddp::DirectoryLock(dir.path().string(), "output.dir"),
      Contains("output.dir: '" + dir.path().string() + "' is in use by another job (") &&
          Contains("pid " + std::to_string(::getpid())));
  CHECK(read_bytes(lock_file(dir)) == holder);  // the refused one changed nothing
}

TEST_CASE("a released lock is empty and is taken again without a warning", "[directory_lock]") {
  TempDir dir;
  { ddp::DirectoryLock lock(dir.path().string(), "output.dir"); }
  CHECK(read_bytes(lock_file(dir)).empty());
  ddp::DirectoryLock again(dir.path().string(), "output.dir");
  CHECK(again.warning().empty());
}

TEST_CASE("a lock left by a job that is gone is taken over with a warning", "[directory_lock]") {
  TempDir dir;
  write_bytes(lock_file(dir), "host elsewhere pid 4242 since 2026-01-01T00:00:00Z\n");
  ddp::DirectoryLock lock(dir.path().string(), "checkpoint.dir");
  CHECK_THAT(lock.warning(),
             Contains("warning: checkpoint.dir: took over '" + lock_file(dir) + "'") &&
                 Contains("(host elsewhere pid 4242 since 2026-01-01T00:00:00Z); it did not end"));
  CHECK_THAT(read_bytes(lock_file(dir)), Contains("pid " + std::to_string(::getpid())));
}

TEST_CASE("a link or a FIFO in the lock file's place is refused", "[directory_lock]") {
  TempDir dir;
  SECTION("a link") {
    const std::string victim = dir.file("victim");
    write_bytes(victim, "precious");
    fs::create_symlink(victim, lock_file(dir));
    CHECK_THROWS_WITH(ddp::DirectoryLock(dir.path().string(), "output.dir"),
                      Contains("output.dir: cannot open the lock file '" + lock_file(dir) +
                               "': it is a symbolic link"));
    CHECK(read_bytes(victim) == "precious");
  }
  SECTION("a FIFO") {
    REQUIRE(::mkfifo(lock_file(dir).c_str(), 0600) == 0);
    CHECK_THROWS_WITH(ddp::DirectoryLock(dir.path().string(), "output.dir"),
                      Contains("the lock file '" + lock_file(dir) + "' is not a regular file"));
  }
  SECTION("a missing directory") {
    CHECK_THROWS_WITH(ddp::DirectoryLock(dir.file("missing"), "output.dir"),
                      Contains("No such file or directory"));
  }
}
