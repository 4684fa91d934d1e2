// Data sets from .npy pairs (load_npy) and back (save_npy, convert_to_npy): the floats every
// feature dtype reads as, every integer label dtype, a data set that survives the round trip
// bit for bit, every refusal named by its file and field, and NaN and infinities found where
// they are stored.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/float16.h"
#include "data/convert.h"
#include "data/dataset.h"
#include "data/features.h"
#include "data/npy.h"
#include "temp_files.h"
#include "test_helpers.h"

using Catch::Contains;
using ddp::NpyType;

namespace {

template <typename T>
void save(const std::string& path, NpyType type, const std::vector<int64_t>& shape,
          const std::vector<T>& values) {
  ddp::write_npy(path, type, shape, values.data());
}

std::vector<int64_t> labels_of(const ddp::Dataset& ds) { return {ds.y.begin(), ds.y.end()}; }

}  // namespace

TEST_CASE("npy data: uint8 reads as v/255, float16 widens exactly, float32 as is", "[npy][data]") {
  ddp_test::TempDir dir("npy_data");
  const std::string y = dir.file("y.npy");
  save<int64_t>(y, NpyType::I64, {3}, {2, 0, 1});

  SECTION("uint8, [n, 2, 2]: every element after the first dimension is a feature") {
    std::vector<uint8_t> px(12);
    for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i * 23);
    save(dir.file("x.npy"), NpyType::U8, {3, 2, 2}, px);
    const ddp::Dataset ds = ddp::load_npy(dir.file("x.npy"), y);
    CHECK(ds.size == 3);
    CHECK(ds.features == 4);
    CHECK(ds.x.type() == ddp::FeatureType::U8Over255);
    for (size_t i = 0; i < px.size(); ++i) CHECK(ds.x[i] == static_cast<float>(px[i]) / 255.0f);
    CHECK(labels_of(ds) == std::vector<int64_t>{2, 0, 1});
    CHECK_THAT(ds.source, Contains("x.npy") && Contains("y.npy"));
  }
  SECTION("float16: every code but NaN decodes to the float it stands for") {
    std::vector<uint16_t> h = {0x0000, 0x8000, 0x3c00, 0xc000, 0x0001, 0x7bff, 0x7c00, 0x3555};
    save(dir.file("x.npy"), NpyType::F16, {2, 4}, h);
    save<uint8_t>(y, NpyType::U8, {2}, {1, 1});
    const ddp::Dataset ds = ddp::load_npy(dir.file("x.npy"), y);
    CHECK(ds.x.type() == ddp::FeatureType::F16);
    const std::vector<float> want = {
        0.0f, -0.0f, 1.0f, -2.0f, std::ldexp(1.0f, -24), 65504.0f, INFINITY, 0.333251953125f};
    for (size_t i = 0; i < want.size(); ++i) {
      CHECK(ddp::float_bits(ds.x[i]) == ddp::float_bits(want[i]));
      CHECK(ddp::float_bits(ds.x[i]) == ddp::float_bits(ddp::fp16_to_float(h[i])));
    }
  }
  SECTION("float32, read in place") {
    const std::vector<float> v = {0.5f, -1.25f, 3e-39f, 7.0f, 1e30f, -0.0f};
    save(dir.file("x.npy"), NpyType::F32, {3, 2}, v);
    const ddp::Dataset ds = ddp::load_npy(dir.file("x.npy"), y);
    CHECK(ds.x.type() == ddp::FeatureType::F32);
    for (size_t i = 0; i < v.size(); ++i) CHECK(ddp::float_bits(ds.x[i]) == ddp::float_bits(v[i]));
  }
}

TEST_CASE("npy data: labels of every integer dtype widen to int32", "[npy][data]") {
  ddp_test::TempDir dir("npy_labels");
  save<float>(dir.file("x.npy"), NpyType::F32, {3, 1}, {1, 2, 3});
  const std::string x = dir.file("x.npy"), y = dir.file("y.npy");
  const std::vector<int64_t> want = {0, 7, 120};
  save<uint8_t>(y, NpyType::U8, {3}, {0, 7, 120});
  CHECK(labels_of(ddp::load_npy(x, y)) == want);
  save<int8_t>(y, NpyType::I8, {3}, {0, 7, 120});
  CHECK(labels_of(ddp::load_npy(x, y)) == want);
  save<uint16_t>(y, NpyType::U16, {3}, {0, 7, 120});
  CHECK(labels_of(ddp::load_npy(x, y)) == want);
  save<int16_t>(y, NpyType::I16, {3}, {0, 7, 120});
  CHECK(labels_of(ddp::load_npy(x, y)) == want);
  save<uint32_t>(y, NpyType::U32, {3}, {0, 7, 120});
  CHECK(labels_of(ddp::load_npy(x, y)) == want);
  save<int32_t>(y, NpyType::I32, {3}, {0, 7, 120});
  CHECK(labels_of(ddp::load_npy(x, y)) == want);
  save<uint64_t>(y, NpyType::U64, {3}, {0, 7, 120});
  CHECK(labels_of(ddp::load_npy(x, y)) == want);
  save<int64_t>(y, NpyType::I64, {3}, {0, 7, 2147483647});
  CHECK(labels_of(ddp::load_npy(x, y)) == std::vector<int64_t>{0, 7, 2147483647});
  // A negative label reads as itself: the class check against the model names it.
  save<int8_t>(y, NpyType::I8, {3}, {0, -1, 2});
  const ddp::Dataset ds = ddp::load_npy(x, y);
  CHECK(labels_of(ds) == std::vector<int64_t>{0, -1, 2});
  CHECK_THROWS_WITH(ddp::check_dataset(ds, 1, 3, "data.train"),
                    Contains("label -1 at sample 1 is outside [0, 3)"));
}

TEST_CASE("npy data: every refusal names the file and what is wrong", "[npy][data]") {
  ddp_test::TempDir dir("npy_refusals");
  const std::string x = dir.file("x.npy"), y = dir.file("y.npy");
  save<float>(x, NpyType::F32, {4, 2}, std::vector<float>(8, 1.0f));
  save<uint8_t>(y, NpyType::U8, {4}, {0, 1, 0, 1});
  REQUIRE_NOTHROW(ddp::load_npy(x, y));
  const std::string bad = dir.file("bad.npy");
  auto refused = [&](bool bad_is_features) {
    return bad_is_features ? ddp::load_npy(bad, y) : ddp::load_npy(x, bad);
  };

  save<float>(bad, NpyType::F32, {8}, std::vector<float>(8, 1.0f));
  CHECK_THROWS_WITH(refused(true), Contains("npy file '" + bad +
                                            "': shape (8,): features need "
                                            "(samples, features...)") &&
                                       Contains("x.reshape(-1, 1)"));
  save<float>(bad, NpyType::F32, {0, 3}, {});
  CHECK_THROWS_WITH(refused(true), Contains(bad) && Contains("shape (0, 3): zero samples"));
  save<float>(bad, NpyType::F32, {4, 0}, {});
  CHECK_THROWS_WITH(refused(true), Contains(bad) && Contains("samples of zero features"));
  save<double>(bad, NpyType::F64, {4, 2}, std::vector<double>(8, 1.0));
  CHECK_THROWS_WITH(refused(true), Contains(bad) && Contains("descr '<f8': features must be "
                                                             "uint8 (read as v/255), float16 or "
                                                             "float32"));
  save<int32_t>(bad, NpyType::I32, {4, 2}, std::vector<int32_t>(8, 1));
  CHECK_THROWS_WITH(refused(true), Contains("descr '<i4': features must be"));
  save<float>(bad, NpyType::F32, {3, 2}, std::vector<float>(6, 1.0f));
  CHECK_THROWS_WITH(refused(true), Contains("sample/label count mismatch: npy file '" + bad +
                                            "' has 3 samples (shape (3, 2)) but npy file '" + y +
                                            "' has 4 labels"));

  save<uint8_t>(bad, NpyType::U8, {4, 1}, {0, 1, 0, 1});
  CHECK_THROWS_WITH(refused(false), Contains("npy file '" + bad +
                                             "': shape (4, 1): labels need "
                                             "(samples,); save y.reshape(-1)"));
  save<float>(bad, NpyType::F32, {4}, {0, 1, 0, 1});
  CHECK_THROWS_WITH(refused(false), Contains(bad) && Contains("descr '<f4': labels must be "
                                                              "integers"));
  save<int64_t>(bad, NpyType::I64, {4}, {0, 1, -2147483649LL, 1});
  CHECK_THROWS_WITH(refused(false), Contains(bad) && Contains("label -2147483649 at sample 2 "
                                                              "does not fit a 32-bit class index"));
  save<uint32_t>(bad, NpyType::U32, {4}, {0, 1, 0, 2147483648u});
  CHECK_THROWS_WITH(refused(false), Contains("label 2147483648 at sample 3 does not fit"));

  // The file layer's refusals reach through: Fortran order, a truncated file, a missing one.
  std::ofstream(bad, std::ios::binary)
      << ddp::npy_header(NpyType::F32, {4, 2})
             .replace(ddp::npy_header(NpyType::F32, {4, 2}).find("False"), 5, "True ")
      << std::string(32, '\0');
  CHECK_THROWS_WITH(refused(true), Contains(bad) && Contains("fortran_order"));
  std::ofstream(bad, std::ios::binary | std::ios::trunc)
      << ddp::npy_header(NpyType::F32, {4, 2}) << std::string(31, '\0');
  CHECK_THROWS_WITH(refused(true), Contains(bad) && Contains("truncated data"));
  CHECK_THROWS_WITH(ddp::load_npy(dir.file("missing.npy"), y),
                    Contains("npy file '" + dir.file("missing.npy") + "': cannot open"));
}

TEST_CASE("npy data: save_npy and convert write what load_npy reads back bit for bit",
          "[npy][data]") {
  ddp_test::TempDir dir("npy_convert");
  SECTION("CSV floats and labels beyond a byte: float32 features, int32 labels") {
    std::ofstream(dir.file("d.csv")) << "a,b,label\n0.1,-2.5,3\n1e-3,7,300\n";
    ddp::ConvertRequest r;
    r.format = "csv";
    r.data = dir.file("d.csv");
    r.csv_header = true;
    r.out = dir.file("out/nested");
    const ddp::ConvertResult got = ddp::convert_to_npy(r);
    CHECK(got.samples == 2);
    CHECK(got.features == 2);
    const ddp::Dataset src = ddp::load_csv(r.data, true);
    const ddp::Dataset back = ddp::load_npy(got.features_path, got.labels_path);
    CHECK(back.x.type() == ddp::FeatureType::F32);
    CHECK(back.rows() == src.rows());
    CHECK(back.y == src.y);
    CHECK(ddp::NpyFile::open(got.labels_path).type() == NpyType::I32);
  }
  SECTION("IDX bytes stay bytes, labels in a byte are uint8") {
    ddp::Dataset ds;
    ds.size = 3;
    ds.features = 2;
    ds.x = ddp::FeatureStore::scaled_bytes({0, 255, 17, 128, 3, 9});
    ds.y = {4, 0, 9};
    ddp::save_npy(ds, dir.file("x.npy"), dir.file("y.npy"));
    const ddp::Dataset back = ddp::load_npy(dir.file("x.npy"), dir.file("y.npy"));
    CHECK(back.x.type() == ddp::FeatureType::U8Over255);
    CHECK(back.rows() == ds.rows());
    CHECK(back.y == ds.y);
    CHECK(ddp::NpyFile::open(dir.file("y.npy")).type() == NpyType::U8);
    ds.transform.mean = {0.0f, 0.0f};
    ds.transform.std = {2.0f, 2.0f};
    CHECK_THROWS_WITH(ddp::save_npy(ds, dir.file("x.npy"), ""),
                      Contains("convert writes features as stored, before data.normalize"));
  }
  SECTION("refusals name the option or file") {
    ddp::ConvertRequest r;
    r.format = "idx";
    r.out = dir.file("o");
    CHECK_THROWS_WITH(ddp::convert_to_npy(r), Contains("--format idx needs --images and --labels"));
    r.format = "csv";
    CHECK_THROWS_WITH(ddp::convert_to_npy(r), Contains("--format csv needs --data"));
    r.format = "parquet";
    CHECK_THROWS_WITH(ddp::convert_to_npy(r),
                      Contains("--format must be idx or csv, got 'parquet'"));
    std::ofstream(dir.file("d.csv")) << "1,2,0\n";
    std::ofstream(dir.file("file")) << "x";
    r.format = "csv";
    r.data = dir.file("d.csv");
    r.out = dir.file("file");
    CHECK_THROWS_WITH(ddp::convert_to_npy(r),
                      Contains("--out " + dir.file("file") + ": cannot create the directory"));
    r.data = dir.file("missing.csv");
    CHECK_THROWS_WITH(ddp::convert_to_npy(r), Contains(dir.file("missing.csv")));
  }
}

TEST_CASE("npy data: a file-backed store knows which rows are in memory and reads ahead",
          "[npy][data]") {
  ddp_test::TempDir dir("npy_resident");
  const size_t rows = 512, features = 4096;  // a page a row
  save(dir.file("x.npy"), NpyType::U8, {static_cast<int64_t>(rows), static_cast<int64_t>(features)},
       std::vector<uint8_t>(rows * features, 7));
  save<uint8_t>(dir.file("y.npy"), NpyType::U8, {static_cast<int64_t>(rows)},
                std::vector<uint8_t>(rows, 1));
  // Not file-backed: always in memory, and announcing does nothing.
  const ddp::FeatureStore owned(std::vector<float>(8, 1.0f));
  CHECK(owned.resident(0, 8));
  owned.will_need(0, 8);

  // The file's pages out of the page cache (before this process maps any of them).
  {
    const int fd = ::open(dir.file("x.npy").c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  const ddp::Dataset ds = ddp::load_npy(dir.file("x.npy"), dir.file("y.npy"));
  REQUIRE(ds.x.file_backed());
  const size_t last = (rows - 1) * features;
  if (ds.x.resident(last, features)) {
    WARN("skipped: the file system keeps " << dir.path() << " in memory (tmpfs?)");
    return;
  }
  // Another row, for what will_need must not read (the drop may have missed a page in flight).
  const size_t other = last - 100 * features;
  const bool other_was_resident = ds.x.resident(other, features);
  ds.x.will_need(last, features);
  bool arrived = false;
  for (int i = 0; i < 200 && !arrived; ++i) {
    arrived = ds.x.resident(last, features);
    if (!arrived) ::usleep(5000);
  }
  CHECK(arrived);  // read in the background, without touching it
  CHECK(ds.x.resident(other, features) == other_was_resident);  // nothing else was
  CHECK(ds.x[last] == 7.0f / 255.0f);
}

TEST_CASE("npy data: the first NaN or infinity is found at every position, and only those",
          "[npy][data]") {
  // Finite extremes must pass; each non-finite kind is found wherever it sits, block
  // boundaries (256 values) included, and the first of two wins.
  std::vector<float> v(600);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) - 300.0f;
  v[1] = std::numeric_limits<float>::max();
  v[2] = -std::numeric_limits<float>::max();
  v[3] = std::numeric_limits<float>::denorm_min();
  v[4] = -0.0f;
  REQUIRE(ddp::first_non_finite(v.data(), v.size()) == v.size());
  REQUIRE(ddp::first_non_finite(v.data(), 0) == 0);
  for (const float bad : {NAN, -NAN, INFINITY, -INFINITY}) {
    for (size_t at = 0; at < v.size(); ++at) {
      std::vector<float> w = v;
      w[at] = bad;
      if (at + 7 < w.size()) w[at + 7] = bad;
      INFO("value " << bad << " at " << at);
      REQUIRE(ddp::first_non_finite(w.data(), w.size()) == at);
      REQUIRE(ddp::first_non_finite(w.data(), at) == at);  // not within the first `at`
    }
  }
}

TEST_CASE("npy data: a stored NaN or infinity is named by sample and feature", "[npy][data]") {
  ddp_test::TempDir dir("npy_data");
  const std::string x = dir.file("x.npy");
  SECTION("float32") {
    std::vector<float> v(4 * 3, 0.5f);
    save(x, NpyType::F32, {4, 3}, v);
    ddp::Dataset ds = ddp::load_npy(x, "");
    ddp::require_finite_rows(ds.x, ds.features, 0, ds.size, ds.source);
    v[2 * 3 + 1] = -INFINITY;
    v[3 * 3 + 0] = NAN;
    save(x, NpyType::F32, {4, 3}, v);
    ds = ddp::load_npy(x, "");
    CHECK(ds.x.first_non_finite(0, 12) == 7);
    CHECK(ds.x.first_non_finite(8, 4) == 9);
    CHECK(ds.x.first_non_finite(0, 7) == 7);  // none in [0, 7)
    CHECK(ddp_test::error_of([&] {
            ddp::require_finite_rows(ds.x, ds.features, 0, ds.size, ds.source);
          }) == x + ": sample 2, feature 1 is -inf (features must be finite)");
    CHECK(ddp_test::error_of([&] {
            ddp::require_finite_rows(ds.x, ds.features, 3, 1, ds.source);
          }) == x + ": sample 3, feature 0 is nan (features must be finite)");
    ddp::require_finite_rows(ds.x, ds.features, 0, 2, ds.source);  // rows 0 and 1 are fine
  }
  SECTION("float16: exponent all ones is NaN or infinity, the largest half is finite") {
    std::vector<uint16_t> h = {0x3c00, 0x7bff, 0xfbff, 0x0001, 0x7c00, 0x3c00};
    save(x, NpyType::F16, {3, 2}, h);
    ddp::Dataset ds = ddp::load_npy(x, "");
    CHECK(ds.x.first_non_finite(0, 6) == 4);
    CHECK(ddp_test::error_of([&] {
            ddp::require_finite_rows(ds.x, ds.features, 0, ds.size, ds.source);
          }) == x + ": sample 2, feature 0 is inf (features must be finite)");
    h[4] = 0x3c00;
    h[1] = 0xfe01;  // a NaN with a sign and a payload
    save(x, NpyType::F16, {3, 2}, h);
    ds = ddp::load_npy(x, "");
    CHECK(ddp_test::error_of([&] {
            ddp::require_finite_rows(ds.x, ds.features, 0, ds.size, ds.source);
          }) == x + ": sample 0, feature 1 is nan (features must be finite)");
  }
  SECTION("bytes are always finite") {
    std::vector<uint8_t> b(6, 255);
    save(x, NpyType::U8, {3, 2}, b);
    const ddp::Dataset ds = ddp::load_npy(x, "");
    CHECK(ds.x.first_non_finite(0, 6) == 6);
  }
}
