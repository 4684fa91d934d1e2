// CSV reader for "f1,...,fd,label" rows (or "f1,...,fd" for data to predict on). Numbers are parsed
// with std::from_chars, which is locale-independent, and every failure names the file, line and
// column.
#include <stdio.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/check.h"
#include "core/input_file.h"
#include "core/stop_flag.h"
#include "data/dataset.h"

namespace ddp {

namespace {

std::string_view trim(std::string_view s) {
  const auto not_space = [](char c) { return c != ' ' && c != '\t' && c != '\r'; };
  while (!s.empty() && !not_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && !not_space(s.back())) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  for (;;) {
    const size_t comma = line.find(',', start);
    fields.push_back(trim(line.substr(start, comma - start)));
    if (comma == std::string_view::npos) return fields;
    start = comma + 1;
  }
}

/// Where a field sits, for messages: "file:line L, column C".
struct Place {
  const std::string& path;
  int64_t line;
};

std::ostream& operator<<(std::ostream& os, const Place& p) { return os << p.path << ":" << p.line; }

float parse_feature(std::string_view f, const Place& at, size_t column) {
  float v = 0.0f;
  const auto [end, ec] = std::from_chars(f.data(), f.data() + f.size(), v);
  DDP_CHECK(ec == std::errc() && end == f.data() + f.size() && !f.empty(),
            at << ", column " << column << ": '" << f << "' is not a number");
  DDP_CHECK(std::isfinite(v),
            at << ", column " << column << ": '" << f << "' is not a finite number");
  return v;
}

int32_t parse_label(std::string_view f, const Place& at, size_t column) {
  int32_t v = -1;
  const auto [end, ec] = std::from_chars(f.data(), f.data() + f.size(), v);
  DDP_CHECK(ec == std::errc() && end == f.data() + f.size() && !f.empty() && v >= 0,
            at << ", column " << column << " (label): '" << f << "' is not a non-negative integer");
  return v;
}

void parse_row(std::string_view line, const Place& at, bool labeled, Dataset& ds,
               std::vector<float>& x) {
  const auto fields = split_fields(line);
  const int64_t label_fields = labeled ? 1 : 0;
  if (ds.features == 0) {
    DDP_CHECK(static_cast<int64_t>(fields.size()) >= 1 + label_fields,
              at << ": expected at least one feature" << (labeled ? " and a label" : "") << ", got "
                 << fields.size() << " field");
    ds.features = static_cast<int64_t>(fields.size()) - label_fields;
  }
  DDP_CHECK(static_cast<int64_t>(fields.size()) == ds.features + label_fields,
            at << ": expected " << ds.features + label_fields
               << " fields (as in the first row), got " << fields.size());
  for (int64_t c = 0; c < ds.features; ++c)
    x.push_back(parse_feature(fields[static_cast<size_t>(c)], at, static_cast<size_t>(c) + 1));
  if (labeled) ds.y.push_back(parse_label(fields.back(), at, fields.size()));
  ++ds.size;
}

/// The file's lines without their '\n', read through a stream opened as input files are
/// (a FIFO or a device is refused, never read from).
class LineReader {
 public:
  explicit LineReader(const std::string& path) : path_(path), in_(open_input_stream(path, path)) {}
  ~LineReader() { std::free(buf_); }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  /// The next line (valid until the next call); false at the end of the file or on an error.
  bool next(std::string_view& line) {
    const ssize_t got = ::getline(&buf_, &capacity_, in_.get());
    if (got < 0) return false;
    line = std::string_view(buf_, static_cast<size_t>(got));
    if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
    return true;
  }
  /// Throws if reading stopped on an error rather than at the end of the file.
  void check_read(int64_t lines) const {
    DDP_CHECK(!std::ferror(in_.get()),
              path_ << ": read error after line " << lines << " (" << std::strerror(errno) << ")");
  }

 private:
  std::string path_;
  InputStream in_;
  char* buf_ = nullptr;  // getline's, grown as needed
  size_t capacity_ = 0;
};

}  // namespace

Dataset load_csv(const std::string& path, bool header, bool labeled) {
  LineReader in(path);
  Dataset ds;
  ds.source = path;
  std::vector<float> x;
  std::string_view line;
  int64_t line_no = 0;
  int64_t first_blank = 0;  // blank lines are only allowed after the last row
  while (in.next(line)) {
    ++line_no;
    if (interrupting_stop() != 0)
      throw_if_stopped("reading " + path + " at line " + std::to_string(line_no));
    if (header && line_no == 1) continue;
    if (trim(line).empty()) {
      if (first_blank == 0) first_blank = line_no;
      continue;
    }
    DDP_CHECK(first_blank == 0, path << ":" << first_blank << ": blank line before more data (line "
                                     << line_no << ")");
    parse_row(line, Place{path, line_no}, labeled, ds, x);
  }
  in.check_read(line_no);
  DDP_CHECK(ds.size > 0, path << ": no data rows" << (header ? " after the header" : ""));
  x.shrink_to_fit();
  ds.x = FeatureStore(std::move(x));
  return ds;
}

}  // namespace ddp
