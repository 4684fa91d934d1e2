// safetensors save/load: bitwise round trips, the on-disk layout checked by an independent parse,
// atomic replacement under write failures (file size limit, full tmpfs, rename onto a directory),
// every load-time validation error on hand-crafted files, a header's parse time at the tensor
// cap, and the finite-values check of loaded weights.
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/clock.h"
#include "ddp/safetensors.h"
#include "temp_files.h"
#include "test_helpers.h"

namespace fs = std::filesystem;
using Catch::Contains;
using ddp::NamedTensor;

namespace {

using ddp_test::dir_entries;
using ddp_test::FileSizeLimit;
using ddp_test::read_bytes;
using ddp_test::TinyTmpfs;
using ddp_test::write_bytes;

// Each test's own directory, removed at scope exit.
class TempDir : public ddp_test::TempDir {
 public:
  TempDir() : ddp_test::TempDir("ddp_safetensors") {}
};

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

uint64_t read_le64(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return n;
}

std::string float_bytes(const std::vector<float>& v) {
  std::string s(v.size() * sizeof(float), '\0');
  if (!v.empty()) std::memcpy(s.data(), v.data(), s.size());
  return s;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return float_bytes(a) == float_bytes(b);
}

// Several ranks and the awkward values a weights file must carry bit-exactly.
std::vector<NamedTensor> sample_tensors() {
  std::vector<NamedTensor> t = {
      {"layers.1.weight", {3, 4}, ddp_test::random_vector(12, 11)},
      {"layers.1.bias", {3}, ddp_test::random_vector(3, 12)},
      {"cube", {2, 3, 2}, ddp_test::random_vector(12, 13, -1e30, 1e30)},
      {"empty", {0}, {}},
      {"empty_rows", {0, 5}, {}},
      {"scalar", {}, {42.5f}},
      {"a_first_by_name", {7}, ddp_test::random_vector(7, 14, -1e-3, 1e-3)},
  };
  t[1].data[0] = -0.0f;
  t[1].data[1] = std::numeric_limits<float>::denorm_min();
  t[1].data[2] = std::numeric_limits<float>::quiet_NaN();
  t[2].data[0] = std::numeric_limits<float>::infinity();
  return t;
}

void require_same_tensors(const std::vector<NamedTensor>& actual,
                          const std::vector<NamedTensor>& expected) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    INFO("tensor " << i << " '" << expected[i].name << "'");
    CHECK(actual[i].name == expected[i].name);
    CHECK(actual[i].shape == expected[i].shape);
    CHECK(same_bits(actual[i].data, expected[i].data));
  }
}

// Runs `fn`, which must throw ddp::Error whose message contains every one of `parts`.
template <typename Fn>
void require_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const ddp::Error& e) {
    INFO("message: " << e.message());
    for (const std::string& p : parts) CHECK_THAT(e.message(), Contains(p));
    return;
  }
  FAIL("expected a ddp::Error containing '" << parts.front() << "'");
}

// A file with the given header text (no padding added) and `data` after it.
std::string craft(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

}  // namespace

TEST_CASE("safetensors round trip keeps names, shapes, order and every bit", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  const std::vector<NamedTensor> tensors = sample_tensors();
  ddp::save_safetensors(path, tensors);

  std::map<std::string, std::string> metadata = {{"stale", "value"}};
  require_same_tensors(ddp::load_safetensors(path, &metadata), tensors);
  CHECK(metadata.empty());  // replaced, since the file has none
  require_same_tensors(ddp::load_safetensors(path), tensors);
  CHECK(dir_entries(dir.path()) == std::vector<std::string>{"model.safetensors"});
}

TEST_CASE("safetensors metadata round trips and no tensors is a valid file", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("meta.safetensors");
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"epoch", "3"}, {"note", "λ \"quoted\" \\ {json}"}, {"", ""}};
  ddp::save_safetensors(path, {{"w", {2}, {1.0f, 2.0f}}}, metadata);
  std::map<std::string, std::string> loaded;
  require_same_tensors(ddp::load_safetensors(path, &loaded), {{"w", {2}, {1.0f, 2.0f}}});
  CHECK(loaded == metadata);

  ddp::save_safetensors(path, {}, {{"only", "metadata"}});
  CHECK(ddp::load_safetensors(path, &loaded).empty());
  CHECK(loaded == std::map<std::string, std::string>{{"only", "metadata"}});
}

TEST_CASE("safetensors file layout matches the format, read by an independent parser",
          "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("layout.safetensors");
  const std::vector<NamedTensor> tensors = sample_tensors();
  ddp::save_safetensors(path, tensors, {{"k", "v"}});

  const std::string bytes = read_bytes(path);
  REQUIRE(bytes.size() >= 8);
  const uint64_t n = read_le64(bytes);
  REQUIRE(8 + n <= bytes.size());
  CHECK((8 + n) % 8 == 0);
  const std::string header_text = bytes.substr(8, n);
  const size_t close = header_text.rfind('}');
  REQUIRE(close != std::string::npos);
  CHECK(header_text.find_first_not_of(' ', close + 1) == std::string::npos);  // space padding only

  const auto header = nlohmann::json::parse(header_text);
  REQUIRE(header.is_object());
  CHECK(header.size() == tensors.size() + 1);
  CHECK(header["__metadata__"] == nlohmann::json{{"k", "v"}});
  const std::string data = bytes.substr(8 + n);
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {  // stored in the given order, back to back
    INFO("tensor " << t.name);
    REQUIRE(header.contains(t.name));
    const auto& e = header[t.name];
    CHECK(e.size() == 3);
    CHECK(e["dtype"] == "F32");
    CHECK(e["shape"].get<std::vector<int64_t>>() == t.shape);
    const uint64_t end = offset + 4 * t.data.size();
    CHECK(e["data_offsets"] == nlohmann::json::array({offset, end}));
    CHECK(data.substr(offset, end - offset) == float_bytes(t.data));
    offset = end;
  }
  CHECK(offset == data.size());
}

TEST_CASE("safetensors data start is 8-byte aligned for every header length", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("align.safetensors");
  for (size_t len = 1; len <= 9; ++len) {
    INFO("name length " << len);
    const NamedTensor t{std::string(len, 'x'), {1}, {static_cast<float>(len)}};
    ddp::save_safetensors(path, {t});
    const std::string bytes = read_bytes(path);
    CHECK((8 + read_le64(bytes)) % 8 == 0);
    require_same_tensors(ddp::load_safetensors(path), {t});
  }
}

TEST_CASE("safetensors save replaces an existing file", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  ddp::save_safetensors(path, sample_tensors());
  const std::vector<NamedTensor> second = {{"only", {2, 2}, {1, 2, 3, 4}}};
  ddp::save_safetensors(path, second, {{"run", "2"}});
  std::map<std::string, std::string> metadata;
  require_same_tensors(ddp::load_safetensors(path, &metadata), second);
  CHECK(metadata.at("run") == "2");
  CHECK(dir_entries(dir.path()) == std::vector<std::string>{"model.safetensors"});
}

TEST_CASE("safetensors save rejects bad tensors and names them", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  auto require_save_error = [&](const std::vector<NamedTensor>& tensors,
                                const std::vector<std::string>& parts) {
    require_error([&] { ddp::save_safetensors(path, tensors); }, parts);
  };
  require_save_error({{"w", {1}, {1}}, {"b", {1}, {2}}, {"w", {1}, {3}}},
                     {path, "'w'", "duplicate"});
  require_save_error({{"layers.0.weight", {2, 3}, {1, 2, 3, 4, 5}}},
                     {path, "'layers.0.weight'", "[2, 3]", "needs 6 values but data has 5"});
  require_save_error({{"neg", {2, -1}, {}}}, {"'neg'", "negative dimension -1"});
  require_save_error({{"__metadata__", {1}, {1}}}, {"'__metadata__'", "reserved"});
  require_save_error({{"bad\xff", {1}, {1}}}, {path, "UTF-8"});
  CHECK(dir_entries(dir.path()).empty());
}

TEST_CASE("safetensors save into a missing directory names the path", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("no/such/dir/model.safetensors");
  require_error([&] { ddp::save_safetensors(path, sample_tensors()); },
                {path, "No such file or directory"});
  CHECK(dir_entries(dir.path()).empty());
}

TEST_CASE("safetensors save fails on rename onto a directory and cleans up", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("occupied");
  fs::create_directory(path);
  write_bytes(path + "/keep", "x");
  require_error([&] { ddp::save_safetensors(path, sample_tensors()); },
                {path, "rename", "Is a directory"});
  CHECK(dir_entries(dir.path()) == std::vector<std::string>{"occupied"});
  CHECK(read_bytes(path + "/keep") == "x");
}

namespace {
const std::vector<NamedTensor> kOldTensors = {{"old", {4}, {1, 2, 3, 4}}};
const std::vector<NamedTensor> kBigTensors = {{"big", {100000}, std::vector<float>(100000, 0.5f)}};
}  // namespace

TEST_CASE("safetensors short write leaves the old file intact and no temp file", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  ddp::save_safetensors(path, kOldTensors);
  {
    FileSizeLimit limit(4096);
    require_error([&] { ddp::save_safetensors(path, kBigTensors); },
                  {path, "write '" + path + ".tmp.", "File too large"});
  }
  require_same_tensors(ddp::load_safetensors(path), kOldTensors);
  CHECK(dir_entries(dir.path()) == std::vector<std::string>{"model.safetensors"});
}

TEST_CASE("safetensors save on a full device (ENOSPC) keeps the old file", "[safetensors]") {
  TempDir dir;
  const std::string mount_dir = dir.file("tiny");
  fs::create_directory(mount_dir);
  TinyTmpfs tmpfs(mount_dir, "size=64k");
  if (!tmpfs.ok()) {
    WARN("skipped: needs root and permission to mount a tmpfs");
    return;
  }
  const std::string path = mount_dir + "/model.safetensors";
  ddp::save_safetensors(path, kOldTensors);
  require_error([&] { ddp::save_safetensors(path, kBigTensors); },
                {path, "No space left on device"});
  require_same_tensors(ddp::load_safetensors(path), kOldTensors);
  CHECK(dir_entries(mount_dir) == std::vector<std::string>{"model.safetensors"});
}

TEST_CASE("safetensors load reads a hand-made file and returns tensors in data order",
          "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("crafted.safetensors");
  // "a" sorts first by name but its bytes come second; no padding, which readers must accept.
  write_bytes(path, craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                          R"("b":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},)"
                          R"("e":{"dtype":"F32","shape":[0,3],"data_offsets":[8,8]}})",
                          float_bytes({1.5f, -2.0f, 3.25f, 4.0f})));
  require_same_tensors(
      ddp::load_safetensors(path),
      {{"b", {1, 2}, {1.5f, -2.0f}}, {"e", {0, 3}, {}}, {"a", {2}, {3.25f, 4.0f}}});
}

namespace {
struct BadFile {
  const char* what;
  std::string header;
  size_t data_bytes;
  std::vector<std::string> parts;  // each must appear in the error message
};

std::string entry(const std::string& name, const std::string& body) {
  return "\"" + name + "\":{" + body + "}";
}

const std::string kA = entry("a", R"("dtype":"F32","shape":[2],"data_offsets":[0,8])");

// A header holding one entry, tensor "a", with the given fields.
std::string only_a(const std::string& body) { return "{" + entry("a", body) + "}"; }

std::vector<BadFile> bad_files() {
  return {
      {"bad JSON", R"({"a":{"dtype":"F32",)", 8, {"not valid JSON"}},
      {"not an object", "[1, 2]", 0, {"not a JSON object"}},
      {"NUL in header", std::string("{}\0\0", 4), 0, {"NUL"}},
      {"bad UTF-8", "{\"a\xff\":{}}", 0, {"not valid JSON"}},
      {"number out of range", R"({"a":1e400})", 0, {"not valid JSON", "1e400"}},
      {"duplicate name", "{" + kA + "," + kA + "}", 8, {"'a'", "more than once"}},
      {"entry not object", R"({"a":5})", 0, {"tensor 'a'", "not a JSON object"}},
      {"missing dtype",
       only_a(R"("shape":[2],"data_offsets":[0,8])"),
       8,
       {"tensor 'a'", "missing \"dtype\""}},
      {"missing shape",
       only_a(R"("dtype":"F32","data_offsets":[0,8])"),
       8,
       {"tensor 'a'", "missing \"shape\""}},
      {"missing offsets",
       only_a(R"("dtype":"F32","shape":[2])"),
       8,
       {"tensor 'a'", "missing \"data_offsets\""}},
      {"dtype number",
       only_a(R"("dtype":32,"shape":[2],"data_offsets":[0,8])"),
       8,
       {"tensor 'a'", "\"dtype\" must be a string"}},
      {"dtype F16",
       only_a(R"("dtype":"F16","shape":[4],"data_offsets":[0,8])"),
       8,
       {"tensor 'a'", "dtype F16 is not supported"}},
      {"shape string",
       only_a(R"("dtype":"F32","shape":"2","data_offsets":[0,8])"),
       8,
       {"tensor 'a'", "\"shape\" must be an array of integers"}},
      {"shape float",
       only_a(R"("dtype":"F32","shape":[2.0],"data_offsets":[0,8])"),
       8,
       {"tensor 'a'", "\"shape\" must be an array of integers"}},
      {"negative dim",
       only_a(R"("dtype":"F32","shape":[-2],"data_offsets":[0,8])"),
       8,
       {"tensor 'a'", "negative dimension -2"}},
      {"offsets one",
       only_a(R"("dtype":"F32","shape":[2],"data_offsets":[8])"),
       8,
       {"tensor 'a'", "\"data_offsets\" must be [begin, end]"}},
      {"offsets negative",
       only_a(R"("dtype":"F32","shape":[2],"data_offsets":[-8,0])"),
       8,
       {"tensor 'a'", "\"data_offsets\" must be [begin, end]"}},
      {"begin > end",
       only_a(R"("dtype":"F32","shape":[2],"data_offsets":[8,0])"),
       8,
       {"tensor 'a'", "begin > end"}},
      {"offsets past end",
       only_a(R"("dtype":"F32","shape":[200],"data_offsets":[0,800])"),
       8,
       {"tensor 'a'", "past the end of the data section (8 bytes"}},
      {"shape vs offsets",
       only_a(R"("dtype":"F32","shape":[3],"data_offsets":[0,8])"),
       8,
       {"tensor 'a'", "needs 12 bytes", "span 8"}},
      {"overlap",
       "{" + kA + "," + entry("b", R"("dtype":"F32","shape":[2],"data_offsets":[4,12])") + "}",
       12,
       {"'a' [0, 8)", "'b' [4, 12)", "overlap"}},
      {"gap between",
       "{" + kA + "," + entry("b", R"("dtype":"F32","shape":[2],"data_offsets":[12,20])") + "}",
       20,
       {"gap", "[8, 12)", "'b'", "not covered by any tensor"}},
      {"gap at start",
       only_a(R"("dtype":"F32","shape":[2],"data_offsets":[4,12])"),
       12,
       {"gap", "[0, 4)", "not covered by any tensor"}},
      {"trailing bytes", "{" + kA + "}", 12, {"gap", "trailing", "[8, 12)", "not covered"}},
      {"data but no tensors", "{}", 4, {"trailing", "[0, 4)"}},
      {"metadata not object", "{\"__metadata__\":[1]}", 0, {"__metadata__ must be an object"}},
      {"metadata value", "{\"__metadata__\":{\"epoch\":3}}", 0, {"'epoch'", "is not a string"}},
  };
}
}  // namespace

TEST_CASE("safetensors load rejects malformed headers, naming file and tensor", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  for (const BadFile& bad : bad_files()) {
    DYNAMIC_SECTION(bad.what) {
      write_bytes(path, craft(bad.header, std::string(bad.data_bytes, '\x3f')));
      std::vector<std::string> parts = bad.parts;
      parts.push_back(path);
      require_error([&] { ddp::load_safetensors(path); }, parts);
    }
  }
}

TEST_CASE("safetensors load rejects short, truncated and corrupt-length files", "[safetensors]") {
  TempDir dir;
  const std::string good = dir.file("good.safetensors");
  const std::string path = dir.file("bad.safetensors");
  ddp::save_safetensors(good, {{"w", {2, 2}, {1, 2, 3, 4}}, {"b", {2}, {5, 6}}});
  const std::string bytes = read_bytes(good);
  const uint64_t n = read_le64(bytes);
  auto load = [&] { ddp::load_safetensors(path); };

  require_error([&] { ddp::load_safetensors(dir.file("missing")); },
                {"cannot open", dir.file("missing"), "No such file or directory"});
  require_error([&] { ddp::load_safetensors(dir.path().string()); }, {"not a regular file"});
  write_bytes(path, "");
  require_error(load, {path, "0 bytes, too short"});
  write_bytes(path, bytes.substr(0, 7));
  require_error(load, {path, "7 bytes, too short"});
  write_bytes(path, bytes.substr(0, 8 + n / 2));  // truncated header
  require_error(load, {path, "header length", "is larger than"});
  write_bytes(path, bytes.substr(0, bytes.size() - 4));  // truncated data
  require_error(load, {path, "tensor 'b'", "past the end of the data section"});
  write_bytes(path, le64(200000000) + bytes.substr(8));
  require_error(load, {path, "exceeds the 100 MB limit"});

  for (int bit = 0; bit < 64; ++bit) {  // any single flipped bit of the length must be caught
    INFO("flipped bit " << bit);
    write_bytes(path, le64(n ^ (uint64_t{1} << bit)) + bytes.substr(8));
    CHECK_THROWS_AS(ddp::load_safetensors(path), ddp::Error);
  }
  write_bytes(path, bytes);  // the harness itself must not be what fails
  CHECK(ddp::load_safetensors(path).size() == 2);
}

namespace {
// A file of `n` one-float tensors "t0", "t1", ... tiling 4n data bytes.
std::string many_tensors_file(uint64_t n) {
  std::string header = "{";
  for (uint64_t i = 0; i < n; ++i) {
    header += (i == 0 ? "" : ",") +
              entry("t" + std::to_string(i), R"("dtype":"F32","shape":[1],"data_offsets":[)" +
                                                 std::to_string(4 * i) + "," +
                                                 std::to_string(4 * i + 4) + "]");
  }
  return craft(header + "}", std::string(4 * n, '\0'));
}

// The CPU seconds `fn` takes on this thread: unlike wall time, not stretched by other programs
// on a loaded machine.
template <typename Fn>
double cpu_seconds_of(Fn&& fn) {
  const double t0 = ddp::thread_cpu_seconds();
  fn();
  return ddp::thread_cpu_seconds() - t0;
}

// What a header of the most tensors may take to load: well above an optimised build's time
// (0.3-0.5 s on a 2-core VM, most of it allocation and one read per tensor), far below the old
// parse's, which grew with the square of the entries (3 s at 16k entries, about a minute at
// 65k). Builds under AddressSanitizer get ten times more.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DDP_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(DDP_TEST_ASAN)
constexpr double kLoadBudgetSeconds = 10.0;
#else
constexpr double kLoadBudgetSeconds = 1.0;
#endif
}  // namespace

TEST_CASE("safetensors load parses a header in linear time and caps the tensor count",
          "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("many.safetensors");
  const uint64_t cap = ddp::kMaxSafetensorsTensors;
  write_bytes(path, many_tensors_file(cap));
  std::vector<NamedTensor> tensors;
  const double at_cap = cpu_seconds_of([&] { tensors = ddp::load_safetensors(path); });
  REQUIRE(tensors.size() == cap);
  CHECK(tensors.back().name == "t" + std::to_string(cap - 1));
  INFO(cap << " tensors loaded in " << at_cap << " s of CPU time");
  CHECK(at_cap < kLoadBudgetSeconds);

  for (const uint64_t n : {cap + 1, uint64_t{100000}}) {
    write_bytes(path, many_tensors_file(n));
    const double refused = cpu_seconds_of([&] {
      require_error([&] { ddp::load_safetensors(path); },
                    {path, "more than 65536 tensors, the most a file may hold"});
    });
    INFO(n << " tensors refused in " << refused << " s of CPU time");
    CHECK(refused < kLoadBudgetSeconds);
  }
  std::vector<NamedTensor> too_many(cap + 1, NamedTensor{"", {0}, {}});
  for (size_t i = 0; i < too_many.size(); ++i) too_many[i].name = "t" + std::to_string(i);
  require_error([&] { ddp::save_safetensors(path, too_many); },
                {path, "65537 tensors, more than the 65536 a file may hold"});
}

TEST_CASE("safetensors metadata that is not valid UTF-8 is saved with replacement characters",
          "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("meta.safetensors");
  // A data path in Latin-1, as a file system may hold it: "caf\xe9" is not UTF-8.
  ddp::save_safetensors(path, {{"w", {1}, {1.0f}}}, {{"data", "/data/caf\xe9/x.npy"}, {"ok", "λ"}});
  std::map<std::string, std::string> metadata;
  ddp::load_safetensors(path, &metadata);
  CHECK(metadata.at("data") == "/data/caf\xef\xbf\xbd/x.npy");  // U+FFFD
  CHECK(metadata.at("ok") == "λ");
  require_error(
      [&] {
        ddp::save_safetensors(path, {}, {{"bad\xff", "x"}});
      },
      {path, "metadata key is not valid UTF-8"});
}

TEST_CASE("safetensors require_finite names the tensor, the value and where it is",
          "[safetensors]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<NamedTensor> tensors = {{"layers.0.weight", {2, 3}, {1, 2, 3, 4, 5, 6}},
                                      {"layers.0.bias", {2}, {0, 0}},
                                      {"empty", {0, 4}, {}}};
  ddp::require_finite(tensors, "model 'm'");
  tensors[1].data[1] = -inf;
  require_error([&] { ddp::require_finite(tensors, "model 'm'"); },
                {"model 'm': tensor 'layers.0.bias' holds -inf at index 1"});
  tensors[0].data[4] = nan;  // the first tensor's is found first
  CHECK(ddp_test::error_of([&] { ddp::require_finite(tensors, "model 'm'"); }) ==
        "model 'm': tensor 'layers.0.weight' holds nan at index 4 (row 1, column 1)");
  tensors[0].data[4] = inf;
  CHECK(ddp_test::error_of([&] { ddp::require_finite(tensors, "model 'm'"); }) ==
        "model 'm': tensor 'layers.0.weight' holds inf at index 4 (row 1, column 1)");
}
