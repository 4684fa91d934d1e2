// The one file writer (core/atomic_file.h): unpredictable temporary names created O_EXCL |
// O_NOFOLLOW, links at the target replaced and never followed, the umask honoured, a full disk
// leaving the old file and no debris, a published log visible while it grows, and the sweep of
// temporary files that removes only those whose writer is gone.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/check.h"
#include "temp_files.h"

namespace {

namespace fs = std::filesystem;
using ddp_test::dir_entries;
using ddp_test::read_bytes;
using ddp_test::TempDir;
using ddp_test::write_bytes;

void save(const std::string& path, const std::string& text) {
  ddp::AtomicFile f(path, "test file");
  f.write(text);
  f.commit();
}

std::string temp_name(const std::string& target, long pid) {
  return target + ".tmp." + std::to_string(pid) + ".0123456789abcdef";
}

// Sets the umask for the scope.
struct Umask {
  explicit Umask(mode_t m) : saved(::umask(m)) {}
  ~Umask() { ::umask(saved); }
  mode_t saved;
};

}  // namespace

TEST_CASE("AtomicFile replaces the target and leaves nothing else", "[atomic_file]") {
  TempDir dir;
  const std::string path = dir.file("model.bin");
  save(path, "first");
  save(path, "second");
  CHECK(read_bytes(path) == "second");
  CHECK(dir_entries(dir.path()) == std::vector<std::string>{"model.bin"});
}

TEST_CASE("AtomicFile's temporary name is unpredictable and marked with its pid", "[atomic_file]") {
  TempDir dir;
  const std::string path = dir.file("x");
  ddp::AtomicFile a(path, "test file"), b(path, "test file");
  const std::vector<std::string> names = dir_entries(dir.path());
  REQUIRE(names.size() == 2);
  CHECK(names[0] != names[1]);
  for (const std::string& name : names) {
    long pid = 0;
    CHECK(ddp::is_atomic_temporary(name, &pid));
    CHECK(pid == ::getpid());
    CHECK(name.rfind("x.tmp." + std::to_string(::getpid()) + ".", 0) == 0);
  }
  long pid = 0;
  CHECK_FALSE(ddp::is_atomic_temporary("x.tmp.4242", &pid));  // the old, guessable name
  CHECK_FALSE(ddp::is_atomic_temporary("x.tmp.42.0123", &pid));
  CHECK_FALSE(ddp::is_atomic_temporary("x.tmp.4x.0123456789abcdef", &pid));
  CHECK_FALSE(ddp::is_atomic_temporary(".tmp.42.0123456789abcdef", &pid));
}

TEST_CASE("a link planted at the target is replaced, its target keeps its bytes", "[atomic_file]") {
  TempDir dir;
  const std::string victim = dir.file("victim"), path = dir.file("model.bin");
  write_bytes(victim, "precious");
  fs::create_symlink(victim, path);
  save(path, "ours");
  CHECK(read_bytes(victim) == "precious");
  CHECK_FALSE(fs::is_symlink(path));
  CHECK(read_bytes(path) == "ours");
}

TEST_CASE("a file being read keeps its bytes while the target is replaced", "[atomic_file]") {
  TempDir dir;
  const std::string path = dir.file("data");
  write_bytes(path, "old bytes");
  std::ifstream reader(path, std::ios::binary);  // open, as a mapped input would be
  save(path, "new");
  std::string seen((std::istreambuf_iterator<char>(reader)), std::istreambuf_iterator<char>());
  CHECK(seen == "old bytes");
  CHECK(read_bytes(path) == "new");
}

TEST_CASE("AtomicFile creates files with the process's umask", "[atomic_file]") {
  TempDir dir;
  const std::string path = dir.file("f");
  for (const mode_t mask : {mode_t{022}, mode_t{077}, mode_t{002}}) {
    {
      Umask umask(mask);
      save(path, "x");
    }
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == (0666 & ~mask));
  }
}

TEST_CASE("a full disk leaves the old file and no temporary file", "[atomic_file]") {
  TempDir dir;
  const std::string path = dir.file("ckpt");
  save(path, "old");
  {
    ddp_test::FileSizeLimit limit(4);
    ddp::AtomicFile f(path, "checkpoint");
    CHECK_THROWS_WITH(f.write(std::string(64, 'x')),
                      Catch::Contains("cannot save checkpoint '" + path + "': write '") &&
                          Catch::Contains("File too large"));
  }
  CHECK(read_bytes(path) == "old");
  CHECK(dir_entries(dir.path()) == std::vector<std::string>{"ckpt"});
}

TEST_CASE("a missing directory is an error naming the target", "[atomic_file]") {
  TempDir dir;
  const std::string path = dir.file("no/such/file");
  CHECK_THROWS_WITH(ddp::AtomicFile(path, "trace file"),
                    Catch::Contains("cannot save trace file '" + path + "'") &&
                        Catch::Contains("No such file or directory"));
}

TEST_CASE("a published file is visible while it grows and replaces a planted link",
          "[atomic_file]") {
  TempDir dir;
  const std::string victim = dir.file("victim"), path = dir.file("metrics.jsonl");
  write_bytes(victim, "precious");
  fs::create_symlink(victim, path);
  ddp::AtomicFile log(path, "metrics");
  log.write("{\"a\":1}\n");
  log.publish();
  CHECK_FALSE(fs::is_symlink(path));
  CHECK(read_bytes(path) == "{\"a\":1}\n");
  log.write("{\"b\":2}\n");
  log.sync();
  CHECK(read_bytes(path) == "{\"a\":1}\n{\"b\":2}\n");
  log.commit();
  CHECK(read_bytes(victim) == "precious");
  CHECK(dir_entries(dir.path()) == std::vector<std::string>{"metrics.jsonl", "victim"});
}

TEST_CASE("only temporary files whose writer is gone are swept", "[atomic_file]") {
  TempDir dir;
  const long gone = ddp_test::dead_pid(), alive = ::getppid();
  write_bytes(dir.file(temp_name("a", gone)), "torn");
  write_bytes(dir.file(temp_name("b", alive)), "being written by another process");
  write_bytes(dir.file(temp_name("c", ::getpid())), "left by an earlier process of our pid");
  fs::create_symlink("/etc/hostname", dir.file(temp_name("d", gone)));
  write_bytes(dir.file("e.tmp.1234"), "not a name the writer gives");
  ddp::AtomicFile in_flight(dir.file("f"), "test file");
  std::vector<std::string> removed = ddp::remove_abandoned_temporaries(dir.path().string());
  std::sort(removed.begin(), removed.end());
  CHECK(removed == std::vector<std::string>{dir.file(temp_name("a", gone)),
                                            dir.file(temp_name("c", ::getpid()))});
  CHECK_FALSE(fs::exists(dir.file(temp_name("a", gone))));
  CHECK_FALSE(fs::exists(dir.file(temp_name("c", ::getpid()))));
  CHECK(fs::exists(dir.file(temp_name("b", alive))));
  CHECK(fs::is_symlink(dir.file(temp_name("d", gone))));
  CHECK(fs::exists(dir.file("e.tmp.1234")));
  in_flight.write("x");
  in_flight.commit();  // its temporary file was not swept
  CHECK(read_bytes(dir.file("f")) == "x");
}
