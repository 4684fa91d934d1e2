// NumPy .npy reader and writer: round trips for every type and 1-D/2-D/3-D shapes, header bytes
// equal to numpy.save's (expected values taken from numpy 1.24), versions 2.0 and 3.0, the header
// syntax numpy accepts, and every refusal naming the file and the field at fault.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "data/npy.h"
#include "temp_files.h"

using Catch::Contains;
using ddp::NpyFile;
using ddp::NpyType;

namespace {

const std::string kFile = "bad.npy";

/// A .npy preamble (magic, version, header length) and `dict`, padded with spaces and '\n' to
/// `align` bytes as numpy does, then `data_bytes` bytes of data.
std::string npy_bytes(const std::string& dict, int major = 1, size_t data_bytes = 0,
                      size_t align = 64) {
  const size_t length_bytes = major == 1 ? 2 : 4;
  const size_t preamble = 8 + length_bytes;
  std::string header = dict;
  while ((preamble + header.size() + 1) % align != 0) header += ' ';
  header += '\n';
  std::string out = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
  for (size_t i = 0; i < length_bytes; ++i)
    out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\x5a');
}

std::string dict(const std::string& descr, const std::string& shape,
                 const std::string& fortran = "False") {
  return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
}

ddp::NpyHeader parse(const std::string& bytes) {
  return ddp::parse_npy_header(kFile, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

/// Bytes 0, 1, 2, ... (wrapping): distinct enough that a swapped or shifted element shows.
std::vector<unsigned char> pattern(size_t bytes) {
  std::vector<unsigned char> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<unsigned char>(i * 7 + 1);
  return v;
}

const std::vector<NpyType> kAllTypes = {NpyType::U8,  NpyType::I8,  NpyType::U16, NpyType::I16,
                                        NpyType::U32, NpyType::I32, NpyType::U64, NpyType::I64,
                                        NpyType::F16, NpyType::F32, NpyType::F64};

}  // namespace

TEST_CASE("npy: descr strings and item sizes are numpy's", "[npy]") {
  const char* descr[] = {"|u1", "|i1", "<u2", "<i2", "<u4", "<i4",
                         "<u8", "<i8", "<f2", "<f4", "<f8"};
  const size_t size[] = {1, 1, 2, 2, 4, 4, 8, 8, 2, 4, 8};
  for (size_t i = 0; i < kAllTypes.size(); ++i) {
    CHECK(std::string(ddp::to_string(kAllTypes[i])) == descr[i]);
    CHECK(ddp::npy_item_size(kAllTypes[i]) == size[i]);
  }
}

TEST_CASE("npy: write_npy then NpyFile::open round-trips every type and shape", "[npy]") {
  ddp_test::TempDir dir("ddp_npy");
  const std::vector<std::vector<int64_t>> shapes = {{5}, {3, 4}, {2, 28, 28}, {1, 1, 1, 7}};
  for (NpyType type : kAllTypes) {
    for (const auto& shape : shapes) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      const auto data = pattern(static_cast<size_t>(n) * ddp::npy_item_size(type));
      const std::string path = dir.file("a.npy");
      ddp::write_npy(path, type, shape, data.data());
      const NpyFile f = NpyFile::open(path);
      INFO(ddp::to_string(type) << " shape size " << shape.size());
      CHECK(f.type() == type);
      CHECK(f.header().shape == shape);
      CHECK(f.rows() == shape[0]);
      CHECK(f.row_elements() == n / shape[0]);
      CHECK(f.header().elements == static_cast<uint64_t>(n));
      CHECK(f.data_bytes() == data.size());
      CHECK(f.header().data_offset % 64 == 0);
      CHECK(reinterpret_cast<uintptr_t>(f.data()) % 64 == 0);
      CHECK(std::memcmp(f.data(), data.data(), data.size()) == 0);
    }
  }
  const auto images = pattern(2 * 28 * 28);
  ddp::write_npy(dir.file("images.npy"), NpyType::U8, {2, 28, 28}, images.data());
  CHECK(NpyFile::open(dir.file("images.npy")).row_elements() == 784);
  CHECK(ddp_test::dir_entries(dir.path()) == std::vector<std::string>{"a.npy", "images.npy"});
}

TEST_CASE("npy: an empty array has rows but no data", "[npy]") {
  ddp_test::TempDir dir("ddp_npy");
  ddp::write_npy(dir.file("e.npy"), NpyType::F32, {0, 784}, nullptr);
  const NpyFile f = NpyFile::open(dir.file("e.npy"));
  CHECK(f.rows() == 0);
  CHECK(f.row_elements() == 784);
  CHECK(f.data_bytes() == 0);
  CHECK(f.data() == nullptr);
}

TEST_CASE("npy: header bytes equal numpy.save's", "[npy]") {
  ddp_test::TempDir dir("ddp_npy");
  // np.save(f, np.zeros((3, 4), np.float32)): the dict, 20 spaces of room for the first axis to
  // grow (numpy >= 1.24), spaces to 127 bytes, '\n'; the length field holds 128 - 10 = 118.
  const std::string f4 = std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
                         "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }" +
                         std::string(58, ' ') + "\n";
  REQUIRE(f4.size() == 128);
  CHECK(ddp::npy_header(NpyType::F32, {3, 4}) == f4);
  const std::vector<float> values(12, 1.5f);
  ddp::write_npy(dir.file("f4.npy"), NpyType::F32, {3, 4}, values.data());
  const std::string file = ddp_test::read_bytes(dir.file("f4.npy"));
  REQUIRE(file.size() == 128 + 48);
  CHECK(file.substr(0, 128) == f4);
  CHECK(std::memcmp(file.data() + 128, values.data(), 48) == 0);

  const std::string u1 = std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
                         "{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }" +
                         std::string(60, ' ') + "\n";
  CHECK(ddp::npy_header(NpyType::U8, {3}) == u1);

  // Data offsets numpy 1.24 gives: 15 dimensions cross 128 only with the growth padding, and a
  // header that ends exactly on 64 bytes gets a whole 64 more (numpy's _wrap_header).
  CHECK(ddp::npy_header(NpyType::F32, std::vector<int64_t>(14, 1)).size() == 128);
  CHECK(ddp::npy_header(NpyType::F32, std::vector<int64_t>(15, 1)).size() == 192);
  std::vector<int64_t> exact = {2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 100};
  CHECK(ddp::npy_header(NpyType::F32, exact).size() == 192);
  CHECK(parse(ddp::npy_header(NpyType::F32, exact)).shape == exact);
}

TEST_CASE("npy: versions 2.0 and 3.0 headers are read", "[npy]") {
  for (int major : {2, 3}) {
    const auto h = parse(npy_bytes(dict("<i8", "(6, 2)"), major));
    CHECK(h.type == NpyType::I64);
    CHECK(h.shape == std::vector<int64_t>{6, 2});
    CHECK(h.data_offset == 128);
    CHECK(h.data_bytes == 96);
  }
  // Older numpy padded version 1.0 headers to 16 bytes only.
  const auto old = parse(npy_bytes(dict("<f8", "(2,)"), 1, 0, 16));
  CHECK(old.data_offset == 80);
}

TEST_CASE("npy: header syntax numpy accepts", "[npy]") {
  // Keys in any order, double quotes, whitespace and line breaks, no trailing comma, native or
  // explicit byte order on one-byte types, Python 2 long literals.
  const auto h =
      parse(npy_bytes("{ \"shape\" : ( 4 ,\n 3 ) ,'fortran_order':False,\t'descr':'=f4'}"));
  CHECK(h.type == NpyType::F32);
  CHECK(h.shape == std::vector<int64_t>{4, 3});
  CHECK(parse(npy_bytes(dict("<u1", "(3,)"))).type == NpyType::U8);
  CHECK(parse(npy_bytes(dict(">i1", "(3,)"))).type == NpyType::I8);
  CHECK(parse(npy_bytes(dict("|f2", "(3,)"))).type == NpyType::F16);
  CHECK(parse(npy_bytes(dict("<u8", "(3L, 2L)"))).shape == std::vector<int64_t>{3, 2});
  CHECK(parse(npy_bytes(dict("<f4", "(0, 5)"))).elements == 0);
}

TEST_CASE("npy: refusals name the file and the field", "[npy]") {
  auto refused = [](const std::string& bytes, const std::string& field, const std::string& detail) {
    INFO(field << ": " << detail);
    CHECK_THROWS_WITH(parse(bytes), Contains("'bad.npy'") && Contains(field) && Contains(detail));
  };
  const std::string good = npy_bytes(dict("<f4", "(3, 4)"));
  SECTION("preamble") {
    refused("", "magic", "the file is empty");
    refused("PK\x03\x04 a zip", "magic", "not a .npy file");
    refused(good.substr(0, 4), "truncated header", "4 bytes");
    std::string v4 = good;
    v4[6] = 4;
    refused(v4, "version 4.0", "not supported");
    std::string v11 = good;
    v11[7] = 1;
    refused(v11, "version 1.1", "not supported");
    refused(good.substr(0, 9), "truncated header", "10-byte preamble");
    refused(good.substr(0, 40), "truncated header", "header length field says 118 bytes");
    refused(npy_bytes(dict("<f4", "(3,)"), 2).substr(0, 11), "truncated header", "12-byte");
  }
  SECTION("dict syntax and keys") {
    refused(npy_bytes("[1, 2]"), "header is not a dict", "'[1, 2]");
    refused(npy_bytes(""), "header is not a dict", "end of header");
    refused(npy_bytes("{'descr': '<f4', 'shape': (3,)}"), "header field 'fortran_order'",
            "missing");
    refused(npy_bytes("{'descr': '<f4', 'fortran_order': False}"), "header field 'shape'",
            "missing");
    refused(npy_bytes("{'fortran_order': False, 'shape': (3,)}"), "header field 'descr'",
            "missing");
    refused(npy_bytes("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,)}"),
            "header field 'descr'", "more than once");
    refused(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}"),
            "unknown key 'x'", "exactly 'descr', 'fortran_order' and 'shape'");
    refused(npy_bytes("{'descr': '<f4' 'fortran_order': False, 'shape': (3,)}"), "header dict",
            "expected ',' or '}'");
    refused(npy_bytes("{descr: '<f4'}"), "header dict", "expected a quoted key");
    refused(npy_bytes("{'descr' '<f4'}"), "header dict", "expected ':' after 'descr'");
    refused(npy_bytes("{'descr: '<f4'}"), "header", "unknown key 'descr: '");
    refused(npy_bytes("{'descr': '<f4}"), "header", "unterminated descr string");
    refused(npy_bytes("{'de\\x73cr': '<f4'}"), "header", "escape");
    refused(npy_bytes(dict("<f4", "(3,)") + " junk"), "header", "unexpected text after the dict");
    std::string nul = npy_bytes(dict("<f4", "(3,)"));
    nul[20] = '\0';
    refused(nul, "header", "\\x00");
  }
  SECTION("descr") {
    refused(npy_bytes(dict(">f4", "(3,)")), "header field 'descr'", "a.astype('<f4')");
    refused(npy_bytes(dict(">i8", "(3,)")), "big-endian", "a.astype('<i8')");
    refused(npy_bytes(dict("|O", "(3,)")), "header field 'descr'", "object arrays");
    refused(npy_bytes("{'descr': [('x', '<f4'), ('y', '<i4')], 'fortran_order': False, "
                      "'shape': (3,)}"),
            "header field 'descr'", "structured (record) dtypes are not supported");
    refused(npy_bytes(dict("|b1", "(3,)")), "header field 'descr'", "bool arrays");
    refused(npy_bytes(dict("<c8", "(3,)")), "header field 'descr'", "complex");
    refused(npy_bytes(dict("|S5", "(3,)")), "header field 'descr'", "string and unicode");
    refused(npy_bytes(dict("<U3", "(3,)")), "header field 'descr'", "string and unicode");
    refused(npy_bytes(dict("<M8[ns]", "(3,)")), "header field 'descr'", "datetime");
    refused(npy_bytes(dict("<f16", "(3,)")), "header field 'descr'", "item size");
    refused(npy_bytes(dict("<i3", "(3,)")), "header field 'descr'", "item size");
    refused(npy_bytes(dict("float32", "(3,)")), "header field 'descr'", "expected one of");
    refused(npy_bytes(dict("", "(3,)")), "header field 'descr'", "expected one of");
    refused(npy_bytes("{'descr': 5, 'fortran_order': False, 'shape': (3,)}"),
            "header field 'descr'", "must be a dtype string");
  }
  SECTION("fortran_order") {
    refused(npy_bytes(dict("<f4", "(3, 4)", "True")), "header field 'fortran_order'",
            "np.ascontiguousarray");
    refused(npy_bytes(dict("<f4", "(3, 4)", "0")), "header field 'fortran_order'",
            "must be True or False");
  }
  SECTION("shape") {
    const std::string tuple = "must be a tuple of non-negative integers";
    refused(npy_bytes(dict("<f4", "[3, 4]")), "header field 'shape'", tuple);
    refused(npy_bytes(dict("<f4", "(3.5,)")), "header field 'shape'", tuple);
    refused(npy_bytes(dict("<f4", "(3, 'a')")), "header field 'shape'", tuple);
    refused(npy_bytes(dict("<f4", "(3,,)")), "header field 'shape'", tuple);
    refused(npy_bytes(dict("<f4", "(3")), "header field 'shape'", tuple);
    refused(npy_bytes(dict("<f4", "(3, -1)")), "header field 'shape'", "negative dimension -1");
    refused(npy_bytes(dict("<f4", "(3)")), "header field 'shape'", "not a tuple");
    refused(npy_bytes(dict("<f4", "()")), "header field 'shape'", "0-d");
    refused(npy_bytes(dict("<f4", "(99999999999999999999,)")), "header field 'shape'",
            "99999999999999999999 is too large");
    refused(npy_bytes(dict("<f4", "(9223372036854775807,)")), "header field 'shape'", "overflows");
    refused(npy_bytes(dict("<u1", "(4294967296, 4294967296)")), "header field 'shape'",
            "overflows");
    refused(npy_bytes(dict("<u1", "(0, 4294967296, 4294967296)")), "header field 'shape'",
            "overflows");
  }
  SECTION("data alignment") {
    // numpy always aligns the data to 64 bytes; a foreign writer might not.
    refused(npy_bytes(dict("<f4", "(3, 4)"), 1, 0, 2), "header length", "starts at byte 70");
    std::string odd = npy_bytes(dict("<f4", "(12,)"), 1, 0, 1);
    REQUIRE(odd.size() % 4 != 0);
    refused(odd, "header length", "not a multiple of the 4-byte item size");
  }
}

TEST_CASE("npy: NpyFile::open refuses files that do not hold the array", "[npy]") {
  ddp_test::TempDir dir("ddp_npy");
  const std::string path = dir.file("short.npy");
  ddp_test::write_bytes(path, npy_bytes(dict("<f4", "(3, 4)"), 1, 47));
  CHECK_THROWS_WITH(NpyFile::open(path), Contains(path) && Contains("truncated data") &&
                                             Contains("needs 48 bytes") && Contains("has 47") &&
                                             Contains("expected 176 bytes in all, got 175"));
  ddp_test::write_bytes(path, npy_bytes(dict("<f4", "(3, 4)"), 1, 52));
  CHECK_THROWS_WITH(NpyFile::open(path), Contains(path) && Contains("4 bytes after the end"));
  ddp_test::write_bytes(path, npy_bytes(dict(">f4", "(3, 4)"), 1, 48));
  CHECK_THROWS_WITH(NpyFile::open(path), Contains(path) && Contains("'descr'"));
  ddp_test::write_bytes(path, "");
  CHECK_THROWS_WITH(NpyFile::open(path), Contains(path) && Contains("empty"));
  CHECK_THROWS_WITH(NpyFile::open(dir.file("missing.npy")),
                    Contains("missing.npy") && Contains("cannot open"));
  CHECK_THROWS_WITH(NpyFile::open(dir.path().string()), Contains("not a regular file"));
}

TEST_CASE("npy: NpyFile moves keep the mapping", "[npy]") {
  ddp_test::TempDir dir("ddp_npy");
  const std::vector<int32_t> values = {1, -2, 3, -4, 5, -6};
  ddp::write_npy(dir.file("m.npy"), NpyType::I32, {3, 2}, values.data());
  NpyFile a = NpyFile::open(dir.file("m.npy"));
  const void* data = a.data();
  NpyFile b = std::move(a);
  CHECK(b.data() == data);
  CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  NpyFile c;
  c = std::move(b);
  CHECK(c.rows() == 3);
  CHECK(c.row_elements() == 2);
  CHECK(static_cast<const int32_t*>(c.data())[5] == -6);
  CHECK(c.path() == dir.file("m.npy"));
}

TEST_CASE("npy: write_npy refuses bad shapes and replaces files atomically", "[npy]") {
  ddp_test::TempDir dir("ddp_npy");
  const std::string path = dir.file("w.npy");
  const float x[2] = {1, 2};
  CHECK_THROWS_WITH(ddp::write_npy(path, NpyType::F32, {}, x),
                    Contains(path) && Contains("shape is empty"));
  CHECK_THROWS_WITH(ddp::write_npy(path, NpyType::F32, {2, -1}, x),
                    Contains(path) && Contains("negative dimension -1"));
  CHECK_THROWS_WITH(ddp::write_npy(path, NpyType::F32, {2}, nullptr),
                    Contains(path) && Contains("no data"));
  CHECK_THROWS_WITH(ddp::write_npy(path, NpyType::F64, {int64_t{1} << 62, 4}, x),
                    Contains(path) && Contains("overflows"));
  CHECK(ddp_test::dir_entries(dir.path()).empty());
  ddp::write_npy(path, NpyType::F32, {2}, x);
  const float y[1] = {7};
  ddp::write_npy(path, NpyType::F32, {1}, y);
  CHECK(NpyFile::open(path).header().shape == std::vector<int64_t>{1});
  CHECK(ddp_test::dir_entries(dir.path()) == std::vector<std::string>{"w.npy"});
  CHECK_THROWS_WITH(ddp::write_npy(dir.file("no/such/dir.npy"), NpyType::F32, {2}, x),
                    Contains("no/such/dir.npy") && Contains("No such file"));
}
