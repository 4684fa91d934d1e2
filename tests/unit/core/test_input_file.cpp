// Input files (core/input_file.h): a regular file opens for blocking reads; a FIFO, a device or a
// directory is refused at once by name, before a byte is read; an output is the same file as an
// input by identity (device and inode), whatever the spelling.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <future>
#include <string>

#include "core/check.h"
#include "core/input_file.h"
#include "temp_files.h"

using Catch::Contains;
using ddp_test::TempDir;

namespace {

// The message `open` throws with, failing (not hanging) if it has not returned within 5 s: the
// FIFO's write end is then opened so that the blocked open() returns and the test can end.
std::string refusal_within_seconds(const std::string& fifo, const std::function<void()>& open) {
  auto attempt = std::async(std::launch::async, [&]() -> std::string {
    try {
      open();
    } catch (const ddp::Error& e) {
      return e.message();
    }
    return "(opened)";
  });
  if (attempt.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    const int unblock = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    attempt.wait();
    if (unblock >= 0) ::close(unblock);
    FAIL("opening the FIFO " << fifo << " blocked for 5 s");
  }
  return attempt.get();
}

// The message (without rank and source location) `fn` throws, or "(no error)".
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ddp::Error& e) {
    return e.message();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("input file: a regular file opens for blocking reads, with its size", "[core][input]") {
  TempDir dir;
  const std::string path = dir.file("data.bin");
  ddp_test::write_bytes(path, "0123456789");
  ddp::InputFile file(path, "data");
  REQUIRE(file.fd() >= 0);
  CHECK(file.size() == 10);
  CHECK((::fcntl(file.fd(), F_GETFL) & O_NONBLOCK) == 0);
  CHECK((::fcntl(file.fd(), F_GETFD) & FD_CLOEXEC) != 0);
  char buf[16] = {};
  CHECK(::read(file.fd(), buf, sizeof buf) == 10);
  CHECK(std::string(buf) == "0123456789");

  const int fd = file.release();
  CHECK(file.fd() == -1);
  CHECK(::close(fd) == 0);  // released: this closes it, the destructor does not

  const ddp::InputStream in = ddp::open_input_stream(path, "data");
  CHECK(std::fread(buf, 1, 4, in.get()) == 4);
  CHECK(std::string(buf, 4) == "0123");
}

TEST_CASE("input file: a FIFO, a device and a directory are refused by name, at once",
          "[core][input]") {
  TempDir dir;
  const std::string fifo = dir.file("pipe");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(refusal_within_seconds(fifo, [&] {
          ddp::InputFile(fifo, "data.train.images '" + fifo + "'");
        }) == "data.train.images '" + fifo + "': not a regular file (a FIFO)");
  CHECK(refusal_within_seconds(fifo, [&] { ddp::open_input_stream(fifo, fifo); }) ==
        fifo + ": not a regular file (a FIFO)");

  CHECK(error_of([] { ddp::InputFile("/dev/zero", "config file '/dev/zero'"); }) ==
        "config file '/dev/zero': not a regular file (a character device)");
  CHECK(error_of([&] { ddp::InputFile(dir.path().string(), "x"); }) ==
        "x: not a regular file (a directory)");
  CHECK(error_of([&] { ddp::InputFile(dir.file("missing"), "npy file 'missing'"); }) ==
        "npy file 'missing': cannot open (No such file or directory)");
  // A symbolic link is followed: what it points at decides.
  const std::string link = dir.file("link");
  std::filesystem::create_symlink(fifo, link);
  CHECK(refusal_within_seconds(fifo, [&] { ddp::InputFile(link, link); }) ==
        link + ": not a regular file (a FIFO)");
}

TEST_CASE("input file: an output is one of the inputs by identity, not by spelling",
          "[core][input]") {
  TempDir dir;
  const std::string a = dir.file("a.npy");
  const std::string b = dir.file("b.npy");
  ddp_test::write_bytes(a, "a");
  ddp_test::write_bytes(b, "b");
  const std::string dotted = (dir.path() / "." / "a.npy").string();
  const std::string hard = dir.file("hard.npy");
  const std::string soft = dir.file("soft.npy");
  std::filesystem::create_hard_link(a, hard);
  std::filesystem::create_symlink(a, soft);

  CHECK(ddp::same_file(a, a));
  CHECK(ddp::same_file(a, dotted));
  CHECK(ddp::same_file(a, hard));
  CHECK(ddp::same_file(soft, a));
  CHECK_FALSE(ddp::same_file(a, b));
  CHECK_FALSE(ddp::same_file(dir.file("new.csv"), a));  // an output that does not exist yet
  CHECK_FALSE(ddp::same_file(a, dir.file("missing")));

  CHECK_THAT(
      error_of([&] { ddp::refuse_output_onto_input(hard, "predict: --out", dotted, "--data"); }),
      Contains("predict: --out " + hard + " is --data " + dotted + " (the same file)"));
  CHECK_NOTHROW(ddp::refuse_output_onto_input(b, "predict: --out", a, "--data"));
  CHECK(ddp_test::read_bytes(a) == "a");
}

TEST_CASE("input file: file types are named", "[core][input]") {
  CHECK(ddp::describe_file_type(S_IFIFO) == "a FIFO");
  CHECK(ddp::describe_file_type(S_IFDIR) == "a directory");
  CHECK(ddp::describe_file_type(S_IFCHR) == "a character device");
  CHECK(ddp::describe_file_type(S_IFBLK) == "a block device");
  CHECK(ddp::describe_file_type(S_IFSOCK) == "a socket");
  CHECK(ddp::describe_file_type(S_IFREG) == "a regular file");
}
