// Dataset loaders: IDX (raw and gzipped, every header/data error), CSV (every error with its
// line and column), synthetic data (determinism, statistics), check_dataset and load_split.
// Input files are generated in a temp dir with known contents, so expected values are exact.
#include <zlib.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/random.h"
#include "data/dataset.h"

using Catch::Contains;
using ddp::Dataset;
namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<unsigned char>;

/// A fresh directory removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string templ = (fs::temp_directory_path() / "ddp_data_test_XXXXXX").string();
    REQUIRE(mkdtemp(templ.data()) != nullptr);
    path = templ;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

void write_raw(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

void write_gz(const std::string& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  REQUIRE(out.good());
}

void put_be32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(v >> s));
}

Bytes idx_images(uint32_t n, uint32_t rows, uint32_t cols, const Bytes& pixels,
                 uint32_t magic = 0x00000803) {
  Bytes b;
  put_be32(b, magic);
  put_be32(b, n);
  put_be32(b, rows);
  put_be32(b, cols);
  b.insert(b.end(), pixels.begin(), pixels.end());
  return b;
}

Bytes idx_labels(const Bytes& labels, uint32_t magic = 0x00000801) {
  Bytes b;
  put_be32(b, magic);
  put_be32(b, static_cast<uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

// Three 2x3 images whose pixels span the byte range, and their labels.
const Bytes kPixels = {0, 1, 2, 127, 128, 255, 10, 20, 30, 40, 50, 60, 255, 254, 253, 3, 2, 1};
const Bytes kLabels = {7, 0, 9};

void require_small_idx(const Dataset& ds) {
  REQUIRE(ds.size == 3);
  REQUIRE(ds.features == 6);
  REQUIRE(ds.x.size() == kPixels.size());
  REQUIRE(ds.x.type() == ddp::FeatureType::U8Over255);  // kept as bytes, read as floats
  REQUIRE(ds.x.bytes() == kPixels.size());
  for (size_t i = 0; i < kPixels.size(); ++i) {
    INFO("pixel " << i);
    REQUIRE(ds.x[i] == static_cast<float>(kPixels[i]) / 255.0f);
  }
  REQUIRE(ds.x[5] == 1.0f);
  REQUIRE(ds.x[0] == 0.0f);
  REQUIRE(ds.y == std::vector<int32_t>{7, 0, 9});
}

}  // namespace

TEST_CASE("load_idx reads raw and gzipped pairs exactly", "[data][idx]") {
  TempDir dir;
  write_raw(dir.file("img"), idx_images(3, 2, 3, kPixels));
  write_raw(dir.file("lbl"), idx_labels(kLabels));
  write_gz(dir.file("img.gz"), idx_images(3, 2, 3, kPixels));
  write_gz(dir.file("lbl.gz"), idx_labels(kLabels));

  SECTION("raw") {
    const Dataset ds = ddp::load_idx(dir.file("img"), dir.file("lbl"));
    require_small_idx(ds);
    REQUIRE_THAT(ds.source, Contains(dir.file("img")) && Contains(dir.file("lbl")));
  }
  SECTION("gzipped") { require_small_idx(ddp::load_idx(dir.file("img.gz"), dir.file("lbl.gz"))); }
  SECTION("mixed") { require_small_idx(ddp::load_idx(dir.file("img.gz"), dir.file("lbl"))); }
}

TEST_CASE("load_idx names the file and the problem for every bad input", "[data][idx]") {
  TempDir dir;
  const std::string img = dir.file("img"), lbl = dir.file("lbl"), bad = dir.file("bad");
  write_raw(img, idx_images(3, 2, 3, kPixels));
  write_raw(lbl, idx_labels(kLabels));

  SECTION("missing images file") {
    REQUIRE_THROWS_WITH(ddp::load_idx(dir.file("nope"), lbl),
                        Contains(dir.file("nope")) && Contains("cannot open"));
  }
  SECTION("missing labels file") {
    REQUIRE_THROWS_WITH(ddp::load_idx(img, dir.file("nope")),
                        Contains(dir.file("nope")) && Contains("cannot open"));
  }
  SECTION("wrong images magic") {
    write_raw(bad, idx_images(3, 2, 3, kPixels, 0x12345678));
    REQUIRE_THROWS_WITH(ddp::load_idx(bad, lbl), Contains(bad) &&
                                                     Contains("wrong magic number 0x12345678") &&
                                                     Contains("expected 0x00000803"));
  }
  SECTION("wrong labels magic") {
    write_raw(bad, idx_labels(kLabels, 0x00000802));
    REQUIRE_THROWS_WITH(ddp::load_idx(img, bad), Contains(bad) &&
                                                     Contains("wrong magic number 0x00000802") &&
                                                     Contains("expected 0x00000801"));
  }
  SECTION("swapped files") {
    REQUIRE_THROWS_WITH(ddp::load_idx(lbl, img), Contains(lbl) && Contains("expected 0x00000803") &&
                                                     Contains("look swapped"));
  }
  SECTION("images header shorter than the magic") {
    write_raw(bad, {0, 0});
    REQUIRE_THROWS_WITH(ddp::load_idx(bad, lbl),
                        Contains(bad) && Contains("truncated header: expected 16 bytes, got 2"));
  }
  SECTION("images header cut after the magic") {
    Bytes b = idx_images(3, 2, 3, {});
    b.resize(10);
    write_raw(bad, b);
    REQUIRE_THROWS_WITH(ddp::load_idx(bad, lbl),
                        Contains(bad) && Contains("truncated header: expected 16 bytes, got 10"));
  }
  SECTION("labels header truncated") {
    Bytes b = idx_labels(kLabels);
    b.resize(6);
    write_raw(bad, b);
    REQUIRE_THROWS_WITH(ddp::load_idx(img, bad),
                        Contains(bad) && Contains("truncated header: expected 8 bytes, got 6"));
  }
  SECTION("empty file") {
    write_raw(bad, {});
    REQUIRE_THROWS_WITH(ddp::load_idx(img, bad),
                        Contains(bad) && Contains("truncated header: expected 8 bytes, got 0"));
  }
  SECTION("images data truncated") {
    Bytes b = idx_images(3, 2, 3, kPixels);
    b.resize(b.size() - 5);
    write_gz(bad, b);
    REQUIRE_THROWS_WITH(
        ddp::load_idx(bad, lbl),
        Contains(bad) && Contains("truncated data: expected 18 bytes") && Contains("got 13"));
  }
  SECTION("labels data truncated") {
    Bytes b = idx_labels(kLabels);
    b.pop_back();
    write_raw(bad, b);
    REQUIRE_THROWS_WITH(ddp::load_idx(img, bad), Contains(bad) &&
                                                     Contains("truncated data: expected 3 bytes") &&
                                                     Contains("got 2"));
  }
  SECTION("header claiming a huge image count fails as truncated, not as an allocation") {
    write_raw(bad, idx_images(0xFFFFFFF0u, 28, 28, kPixels));
    write_raw(dir.file("lbl_big"), idx_labels({}, 0x00000801));
    Bytes lb = idx_labels({});
    lb[4] = lb[5] = lb[6] = 0xFF;
    lb[7] = 0xF0;
    write_raw(dir.file("lbl_big"), lb);
    REQUIRE_THROWS_WITH(ddp::load_idx(bad, dir.file("lbl_big")),
                        Contains(bad) && Contains("truncated data"));
  }
  SECTION("header whose sizes multiply past 64 bits is refused before any arithmetic wraps") {
    // 2^32-1 images of (2^32-1)^2 pixels: the product overflowed a signed 64-bit count.
    write_raw(bad, idx_images(0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, {1, 1, 1, 1}));
    Bytes lb = idx_labels({});
    lb[4] = lb[5] = lb[6] = lb[7] = 0xFF;
    write_raw(dir.file("lbl_max"), lb);
    REQUIRE_THROWS_WITH(ddp::load_idx(bad, dir.file("lbl_max")),
                        Contains(bad) &&
                            Contains("header claims 4294967295 images of "
                                     "4294967295x4294967295 pixels") &&
                            Contains("corrupt header"));
  }
  SECTION("image/label count mismatch") {
    write_raw(bad, idx_labels({1, 2}));
    REQUIRE_THROWS_WITH(ddp::load_idx(img, bad), Contains(img) && Contains(bad) &&
                                                     Contains("has 3 images") &&
                                                     Contains("has 2 labels"));
  }
  SECTION("zero samples") {
    write_raw(dir.file("img0"), idx_images(0, 2, 3, {}));
    write_raw(bad, idx_labels({}));
    REQUIRE_THROWS_WITH(ddp::load_idx(dir.file("img0"), bad),
                        Contains(dir.file("img0")) && Contains("zero samples"));
  }
  SECTION("zero-sized images") {
    write_raw(bad, idx_images(3, 0, 3, {}));
    REQUIRE_THROWS_WITH(ddp::load_idx(bad, lbl), Contains(bad) && Contains("0x3 pixels"));
  }
  SECTION("corrupt gzip stream") {
    write_gz(bad, idx_images(3, 2, 3, kPixels));
    Bytes gz;
    {
      std::ifstream in(bad, std::ios::binary);
      gz.assign(std::istreambuf_iterator<char>(in), {});
    }
    gz.resize(gz.size() - 12);  // drop the deflate tail and the CRC trailer
    write_raw(bad, gz);
    REQUIRE_THROWS_WITH(ddp::load_idx(bad, lbl), Contains(bad) && Contains("truncated data"));
  }
  SECTION("a directory instead of a file") {
    REQUIRE_THROWS_WITH(ddp::load_idx(img, dir.path.string()),
                        Contains(dir.path.string() + ": not a regular file (a directory)"));
  }
}

TEST_CASE("load_idx reads the real Fashion-MNIST test set", "[data][idx]") {
  const std::string dir = "/usr/share/datasets/fashion-mnist/";
  if (!fs::exists(dir + "t10k-images-idx3-ubyte.gz") ||
      !fs::exists(dir + "t10k-labels-idx1-ubyte.gz")) {
    WARN("SKIPPED: " << dir << "t10k-*.gz not present");
    return;
  }
  const Dataset ds =
      ddp::load_idx(dir + "t10k-images-idx3-ubyte.gz", dir + "t10k-labels-idx1-ubyte.gz");
  REQUIRE(ds.size == 10000);
  REQUIRE(ds.features == 784);
  REQUIRE(ds.x.size() == size_t{10000} * 784);
  std::vector<int> counts(10, 0);
  for (int32_t l : ds.y) {
    REQUIRE(l >= 0);
    REQUIRE(l < 10);
    ++counts[static_cast<size_t>(l)];
  }
  REQUIRE(counts == std::vector<int>(10, 1000));  // the test set is balanced
  REQUIRE(ds.y[0] == 9);                          // an ankle boot, as in every tutorial
  float lo = 1.0f, hi = 0.0f;
  for (float v : ds.x.floats()) lo = std::min(lo, v), hi = std::max(hi, v);
  REQUIRE(lo == 0.0f);
  REQUIRE(hi == 1.0f);
  double first_sum = 0.0;  // byte sum 33456 of image 0, computed independently with Python
  for (int j = 0; j < 784; ++j) first_sum += ds.x[static_cast<size_t>(j)];
  REQUIRE(first_sum == Approx(33456.0 / 255.0).epsilon(1e-6));
}

TEST_CASE("load_csv parses rows with and without a header", "[data][csv]") {
  TempDir dir;
  const std::string body = "0.5,1.25,-3,2\n1e-3, 4 ,0,0\r\n-0.25,2.5e2,7,11\n\n  \n";
  const std::vector<float> want_x = {0.5f, 1.25f, -3.0f, 1e-3f, 4.0f, 0.0f, -0.25f, 250.0f, 7.0f};
  SECTION("no header") {
    write_text(dir.file("a.csv"), body);
    const Dataset ds = ddp::load_csv(dir.file("a.csv"), false);
    REQUIRE(ds.size == 3);
    REQUIRE(ds.features == 3);
    REQUIRE(ds.x.floats() == want_x);
    REQUIRE(ds.y == std::vector<int32_t>{2, 0, 11});
    REQUIRE(ds.source == dir.file("a.csv"));
  }
  SECTION("header") {
    write_text(dir.file("b.csv"), "f1,f2,f3,label\n" + body);
    const Dataset ds = ddp::load_csv(dir.file("b.csv"), true);
    REQUIRE(ds.size == 3);
    REQUIRE(ds.x.floats() == want_x);
    REQUIRE(ds.y == std::vector<int32_t>{2, 0, 11});
  }
  SECTION("no trailing newline") {
    write_text(dir.file("c.csv"), "1,2,3");
    const Dataset ds = ddp::load_csv(dir.file("c.csv"), false);
    REQUIRE(ds.size == 1);
    REQUIRE(ds.x.floats() == std::vector<float>{1.0f, 2.0f});
    REQUIRE(ds.y == std::vector<int32_t>{3});
  }
}

TEST_CASE("load_csv names file, line and column for every bad input", "[data][csv]") {
  TempDir dir;
  const std::string f = dir.file("d.csv");
  const auto load = [&](const std::string& text, bool header = false) {
    write_text(f, text);
    return ddp::load_csv(f, header);
  };
  SECTION("missing file") {
    REQUIRE_THROWS_WITH(ddp::load_csv(dir.file("nope.csv"), false),
                        Contains(dir.file("nope.csv")) && Contains("cannot open"));
  }
  SECTION("a directory instead of a file") {
    REQUIRE_THROWS_WITH(ddp::load_csv(dir.path.string(), false),
                        Contains(dir.path.string() + ": not a regular file (a directory)"));
  }
  SECTION("ragged row") {
    REQUIRE_THROWS_WITH(load("1,2,0\n3,4,1\n5,1\n"),
                        Contains(f + ":3") && Contains("expected 3 fields") && Contains("got 2"));
  }
  SECTION("ragged row counts the header line") {
    REQUIRE_THROWS_WITH(load("a,b,y\n1,2,0\n3,4,5,1\n", true),
                        Contains(f + ":3") && Contains("got 4"));
  }
  SECTION("non-numeric feature") {
    REQUIRE_THROWS_WITH(load("1,2,0\n3,abc,1\n"),
                        Contains(f + ":2, column 2") && Contains("'abc' is not a number"));
  }
  SECTION("empty feature") {
    REQUIRE_THROWS_WITH(load("1,,0\n"),
                        Contains(f + ":1, column 2") && Contains("is not a number"));
  }
  SECTION("trailing garbage after a number") {
    REQUIRE_THROWS_WITH(load("1.5x,2,0\n"), Contains(f + ":1, column 1") && Contains("'1.5x'"));
  }
  SECTION("non-finite feature") {
    REQUIRE_THROWS_WITH(load("1,2,0\nnan,2,0\n"),
                        Contains(f + ":2, column 1") && Contains("not a finite number"));
  }
  SECTION("fractional label") {
    REQUIRE_THROWS_WITH(load("1,2,1.5\n"), Contains(f + ":1, column 3 (label)") &&
                                               Contains("'1.5' is not a non-negative integer"));
  }
  SECTION("negative label") {
    REQUIRE_THROWS_WITH(load("1,2,0\n1,2,-1\n"),
                        Contains(f + ":2, column 3 (label)") && Contains("'-1'"));
  }
  SECTION("label out of int32 range") {
    REQUIRE_THROWS_WITH(load("1,2,99999999999\n"), Contains(f + ":1, column 3 (label)"));
  }
  SECTION("a row with only a label") {
    REQUIRE_THROWS_WITH(load("5\n"),
                        Contains(f + ":1") && Contains("at least one feature and a label"));
  }
  SECTION("blank line before more data") {
    REQUIRE_THROWS_WITH(load("1,2,0\n\n3,4,1\n"),
                        Contains(f + ":2: blank line before more data (line 3)"));
  }
  SECTION("empty file") { REQUIRE_THROWS_WITH(load(""), Contains(f) && Contains("no data rows")); }
  SECTION("header only") {
    REQUIRE_THROWS_WITH(load("a,b,label\n\n", true),
                        Contains(f) && Contains("no data rows after the header"));
  }
  SECTION("a header read as data") {
    REQUIRE_THROWS_WITH(load("a,b,label\n1,2,0\n"),
                        Contains(f + ":1, column 1") && Contains("'a'"));
  }
}

TEST_CASE("make_synthetic is determined by its seed", "[data][synthetic]") {
  const Dataset a = ddp::make_synthetic(50, 4, 3, 7);
  const Dataset b = ddp::make_synthetic(50, 4, 3, 7);
  const Dataset c = ddp::make_synthetic(50, 4, 3, 8);
  REQUIRE(a.size == 50);
  REQUIRE(a.features == 4);
  REQUIRE(a.source == "synthetic(seed=7)");
  REQUIRE(a.x.floats() == b.x.floats());
  REQUIRE(a.y == b.y);
  REQUIRE(a.x.floats() != c.x.floats());
  REQUIRE(a.y != c.y);
  // The draw order is part of the contract (features first, then labels, one stream).
  ddp::Rng rng(7);
  for (size_t i = 0; i < a.x.size(); ++i) REQUIRE(a.x[i] == static_cast<float>(rng.normal()));
  for (size_t i = 0; i < a.y.size(); ++i) REQUIRE(a.y[i] == static_cast<int32_t>(rng.below(3)));
}

TEST_CASE("make_synthetic draws standard normals and uniform labels", "[data][synthetic]") {
  const int64_t n = 100000, classes = 5;
  const Dataset ds = ddp::make_synthetic(n, 1, classes, 123);
  double sum = 0.0, sum_sq = 0.0;
  for (float v : ds.x.floats()) sum += v, sum_sq += double{v} * v;
  const double mean = sum / n;
  const double stddev = std::sqrt(sum_sq / n - mean * mean);
  // Standard errors are ~0.003 (mean) and ~0.002 (std): these bounds are > 5 sigma.
  REQUIRE(std::fabs(mean) < 0.02);
  REQUIRE(std::fabs(stddev - 1.0) < 0.02);
  std::vector<int64_t> counts(classes, 0);
  for (int32_t l : ds.y) {
    REQUIRE(l >= 0);
    REQUIRE(l < classes);
    ++counts[static_cast<size_t>(l)];
  }
  for (int64_t c : counts) REQUIRE(std::abs(c - n / classes) < n / classes / 20);  // within 5%
}

TEST_CASE("make_synthetic rejects non-positive sizes", "[data][synthetic]") {
  REQUIRE_THROWS_WITH(ddp::make_synthetic(0, 2, 3, 0),
                      Contains("samples (0)") && Contains("must be positive"));
  REQUIRE_THROWS_WITH(ddp::make_synthetic(4, 0, 3, 0), Contains("features (0)"));
  REQUIRE_THROWS_WITH(ddp::make_synthetic(4, 2, -1, 0), Contains("classes (-1)"));
}

TEST_CASE("check_dataset matches the data to the model shape", "[data]") {
  Dataset ds;
  ds.size = 3;
  ds.features = 2;
  ds.x = ddp::FeatureStore(std::vector<float>{0, 0, 0, 0, 0, 0});
  ds.y = {0, 2, 1};
  ds.source = "toy.csv";
  REQUIRE_NOTHROW(ddp::check_dataset(ds, 2, 3, "data.train"));
  REQUIRE_THROWS_WITH(
      ddp::check_dataset(ds, 784, 3, "data.train"),
      Contains("data.train: toy.csv has 2 features per sample but model.layers[0] is 784"));
  REQUIRE_THROWS_WITH(
      ddp::check_dataset(ds, 2, 2, "data.test"),
      Contains("data.test: toy.csv: label 2 at sample 1 is outside [0, 2) (model.layers[-1] = 2)"));
  ds.y[2] = -4;
  REQUIRE_THROWS_WITH(ddp::check_dataset(ds, 2, 3, "data.train"),
                      Contains("label -4 at sample 2 is outside [0, 3)"));
}

TEST_CASE("load_split builds each format from the config", "[data]") {
  TempDir dir;
  write_raw(dir.file("img"), idx_images(3, 2, 3, kPixels));
  write_gz(dir.file("lbl.gz"), idx_labels(kLabels));
  write_text(dir.file("t.csv"), "a,b,label\n1,2,1\n3,4,0\n");
  ddp::DataConfig data;
  data.dir = dir.path.string();

  SECTION("idx with paths relative to data.dir") {
    data.format = ddp::DataFormat::Idx;
    data.train.images = "img";
    data.train.labels = "lbl.gz";
    require_small_idx(ddp::load_split(data, data.train, false, 6, 10));
    REQUIRE_THROWS_WITH(
        ddp::load_split(data, data.train, false, 6, 9),
        Contains("data.train: ") && Contains("label 9 at sample 2 is outside [0, 9)"));
    data.train.labels = "missing.gz";
    REQUIRE_THROWS_WITH(ddp::load_split(data, data.train, false, 6, 10),
                        Contains("data.train: " + dir.file("missing.gz") + ": cannot open"));
    data.train.labels.clear();
    REQUIRE_THROWS_WITH(
        ddp::load_split(data, data.train, false, 6, 10),
        Contains("data.train: data.format is idx but data.train.images and data.train.labels"));
  }
  SECTION("idx with an absolute path ignores data.dir") {
    data.format = ddp::DataFormat::Idx;
    data.test.images = dir.file("img");
    data.test.labels = dir.file("lbl.gz");
    data.dir = "/nonexistent";
    require_small_idx(ddp::load_split(data, data.test, true, 6, 10));
  }
  SECTION("csv with header") {
    data.format = ddp::DataFormat::Csv;
    data.csv_header = true;
    data.test.path = "t.csv";
    const Dataset ds = ddp::load_split(data, data.test, true, 2, 2);
    REQUIRE(ds.x.floats() == std::vector<float>{1, 2, 3, 4});
    REQUIRE(ds.y == std::vector<int32_t>{1, 0});
    REQUIRE_THROWS_WITH(ddp::load_split(data, data.test, true, 3, 2),
                        Contains("data.test: " + dir.file("t.csv") +
                                 " has 2 features per sample but model.layers[0] is 3"));
    data.csv_header = false;
    REQUIRE_THROWS_WITH(ddp::load_split(data, data.test, true, 2, 2),
                        Contains("data.test: " + dir.file("t.csv") + ":1, column 1"));
    data.test.path.clear();
    REQUIRE_THROWS_WITH(ddp::load_split(data, data.test, true, 2, 2),
                        Contains("data.test: data.format is csv but data.test.path is not set"));
  }
  SECTION("synthetic uses data.seed for train and data.seed + 1 for test") {
    data.seed = 41;
    data.train.samples = 20;
    data.test.samples = 20;
    const Dataset train = ddp::load_split(data, data.train, false, 5, 3);
    const Dataset test = ddp::load_split(data, data.test, true, 5, 3);
    const Dataset want_train = ddp::make_synthetic(20, 5, 3, 41);
    const Dataset want_test = ddp::make_synthetic(20, 5, 3, 42);
    REQUIRE(train.x.floats() == want_train.x.floats());
    REQUIRE(train.y == want_train.y);
    REQUIRE(test.x.floats() == want_test.x.floats());
    REQUIRE(test.y == want_test.y);
    data.test.samples = 0;
    REQUIRE_THROWS_WITH(ddp::load_split(data, data.test, true, 5, 3),
                        Contains("data.test.samples: must be positive"));
  }
}

TEST_CASE("IDX images alone and CSV rows without labels: the data predict reads", "[data]") {
  TempDir dir;
  const std::string images = dir.file("images"), labels = dir.file("labels");
  write_raw(images, idx_images(3, 2, 3, kPixels));
  write_raw(labels, idx_labels(kLabels));
  const Dataset imgs = ddp::load_idx_images(images);
  CHECK(imgs.size == 3);
  CHECK(imgs.features == 6);
  CHECK(imgs.y.empty());
  CHECK(imgs.x.floats() == ddp::load_idx(images, labels).x.floats());
  const std::string csv = dir.file("features.csv");
  write_text(csv, "1.5,2,3\n4,5,6.25\n");
  const Dataset rows = ddp::load_csv(csv, false, /*labeled=*/false);
  CHECK(rows.features == 3);
  CHECK(rows.size == 2);
  CHECK(rows.y.empty());
  CHECK(rows.x.floats() == std::vector<float>{1.5f, 2, 3, 4, 5, 6.25f});
  write_text(csv, "1,2\n3\n");
  CHECK_THROWS_WITH(ddp::load_csv(csv, false, false),
                    Contains(csv + ":2: expected 2 fields (as in the first row), got 1"));
}
