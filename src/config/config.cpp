// YAML loader for TrainConfig: parses the file, applies --set overrides, and walks the schema
// (schema.h) to read every key with strict types (unknown keys are errors), to validate, to print
// the effective config back and to list the keys. Messages read "<origin>: <key.path>: <problem>".
#include "ddp/config.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>

#include "config/gradient_path.h"
#include "config/resources.h"
#include "config/schema.h"
#include "core/check.h"
#include "core/device_memory.h"
#include "core/input_file.h"

namespace ddp {
namespace {

// ---------------------------------------------------------------------------------------------
// Where a value came from, and how errors name it.

/// The file name for messages, plus the key paths that --set overrides wrote (in order).
struct Origin {
  std::string file;
  std::vector<std::string> override_keys;
};

std::string join_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

/// True when `path` lies strictly inside `prefix` ("model.layers" contains "model.layers[1]").
bool path_inside(const std::string& prefix, const std::string& path) {
  return path.size() > prefix.size() && path.compare(0, prefix.size(), prefix) == 0 &&
         (path[prefix.size()] == '.' || path[prefix.size()] == '[');
}

/// "file: key.path", or "--set K" / "--set K: key.path" when the value came from override K
/// (the override set this key, a section above it, or created the section it names).
std::string locate(const Origin& origin, const std::string& path) {
  for (auto it = origin.override_keys.rbegin(); it != origin.override_keys.rend(); ++it) {
    if (*it == path) return "--set " + *it;
    if (path_inside(*it, path) || path_inside(path, *it)) return "--set " + *it + ": " + path;
  }
  return origin.file + ": " + path;
}

[[noreturn]] void fail(const Origin& origin, const std::string& path, const std::string& what) {
  DDP_THROW(locate(origin, path) << ": " << what);
}

std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "an empty value";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    default:
      return "'" + node.Scalar() + "'";
  }
}

/// Shortest text that reads back as exactly `v` (0.1 prints as 0.1, not 0.10000000000000001).
std::string format_double(double v) {
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // keep it visibly a float
  return s;
}

/// A bound of the schema as messages and the key listing write it: integer keys' as integers.
std::string format_bound(double v, bool integer) {
  return integer ? std::to_string(static_cast<int64_t>(v)) : format_double(v);
}

// ---------------------------------------------------------------------------------------------
// Strict scalar conversion. yaml-cpp's as<T>() accepts "yes" for bools and truncates nothing
// helpful for ints, so every key type is parsed here with its own rule and message.

bool is_integer_text(const std::string& s) {
  size_t start = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
  return start < s.size() && s.find_first_not_of("0123456789", start) == std::string::npos;
}

void read_value(const YAML::Node& node, const std::string& path, const Origin& origin,
                int64_t& out) {
  if (!node.IsScalar()) fail(origin, path, "expected an integer, got " + describe(node));
  const std::string& s = node.Scalar();
  if (!is_integer_text(s)) fail(origin, path, "expected an integer, got '" + s + "'");
  errno = 0;
  long long v = std::strtoll(s.c_str(), nullptr, 10);
  if (errno == ERANGE) fail(origin, path, "integer out of range, got '" + s + "'");
  out = static_cast<int64_t>(v);
}

void read_value(const YAML::Node& node, const std::string& path, const Origin& origin,
                uint64_t& out) {
  if (!node.IsScalar()) fail(origin, path, "expected an integer, got " + describe(node));
  const std::string& s = node.Scalar();
  if (!is_integer_text(s)) fail(origin, path, "expected an integer, got '" + s + "'");
  if (s[0] == '-') fail(origin, path, "must be >= 0, got " + s);
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
  if (errno == ERANGE) fail(origin, path, "integer out of range, got '" + s + "'");
  out = static_cast<uint64_t>(v);
}

void read_value(const YAML::Node& node, const std::string& path, const Origin& origin,
                double& out) {
  if (!node.IsScalar()) fail(origin, path, "expected a number, got " + describe(node));
  const std::string& s = node.Scalar();
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  bool whole = !s.empty() && end == s.c_str() + s.size();
  if (!whole || !std::isfinite(v) || s.find_first_of("xX") != std::string::npos) {
    fail(origin, path, "expected a finite number, got '" + s + "'");
  }
  out = v;
}

void read_value(const YAML::Node& node, const std::string& path, const Origin& origin, bool& out) {
  if (!node.IsScalar()) fail(origin, path, "expected true or false, got " + describe(node));
  const std::string& s = node.Scalar();
  if (s == "true" || s == "True" || s == "TRUE") {
    out = true;
  } else if (s == "false" || s == "False" || s == "FALSE") {
    out = false;
  } else {
    fail(origin, path, "expected true or false, got '" + s + "'");
  }
}

void read_value(const YAML::Node& node, const std::string& path, const Origin& origin,
                std::string& out) {
  if (node.IsNull()) {  // "init_from:" or "init_from: ~" means "not set"
    out.clear();
    return;
  }
  if (!node.IsScalar()) fail(origin, path, "expected a string, got " + describe(node));
  out = node.Scalar();
}

void read_value(const YAML::Node& node, const std::string& path, const Origin& origin,
                std::vector<int64_t>& out) {
  if (!node.IsSequence()) fail(origin, path, "expected a list of integers, got " + describe(node));
  std::vector<int64_t> values(node.size());
  for (size_t i = 0; i < node.size(); ++i) {
    read_value(node[i], path + "[" + std::to_string(i) + "]", origin, values[i]);
  }
  out = values;
}

template <size_t N>
void read_value(const YAML::Node& node, const std::string& path, const Origin& origin,
                std::array<double, N>& out) {
  const std::string expected = "expected a list of " + std::to_string(N) + " numbers";
  if (!node.IsSequence()) fail(origin, path, expected + ", got " + describe(node));
  if (node.size() != N)
    fail(origin, path,
         expected + ", got " + std::to_string(node.size()) +
             (node.size() == 1 ? " entry" : " entries"));
  for (size_t i = 0; i < N; ++i)
    read_value(node[i], path + "[" + std::to_string(i) + "]", origin, out[i]);
}

/// none, standardize or a list [mean, std].
void read_value(const YAML::Node& node, const std::string& path, const Origin& origin,
                Normalization& out) {
  const std::string expected = "must be none, standardize or [mean, std]";
  if (node.IsSequence()) {
    std::array<double, 2> v{};
    read_value(node, path, origin, v);
    out.mode = Normalization::Mode::Fixed;
    out.mean = v[0];
    out.std = v[1];
    return;
  }
  if (!node.IsScalar()) fail(origin, path, expected + ", got " + describe(node));
  const std::string& s = node.Scalar();
  if (s == "none") {
    out = Normalization{};
  } else if (s == "standardize") {
    out = Normalization{};
    out.mode = Normalization::Mode::Standardize;
  } else {
    fail(origin, path, expected + "; got '" + s + "'");
  }
}

/// An enum by its name table; an empty value reads as the name "" (and is refused by name).
template <typename E, typename = std::enable_if_t<IsConfigEnum<E>::value>>
void read_value(const YAML::Node& node, const std::string& path, const Origin& origin, E& out) {
  if (!node.IsNull() && !node.IsScalar()) {
    fail(origin, path, "expected a string, got " + describe(node));
  }
  const std::string name = node.IsNull() ? "" : node.Scalar();
  if (!parse_enum(name, out))
    fail(origin, path, "must be " + enum_choices<E>() + "; got '" + name + "'");
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

/// Reads a map node into struct fields; remembers the keys it knows so that finish() can
/// reject the rest (a typo must not silently fall back to a default).
class Reader {
 public:
  Reader(const YAML::Node& node, std::string path, const Origin& origin)
      : node_(node), path_(std::move(path)), origin_(origin) {
    if (node_.IsDefined() && !node_.IsNull() && !node_.IsMap()) {
      fail(origin_, path_, "expected a map of keys, got " + describe(node_));
    }
  }

  template <typename T>
  void field(const char* key, T& out, const Key&) {
    known_.emplace_back(key);
    YAML::Node child = lookup(key);
    if (child.IsDefined()) read_value(child, join_path(path_, key), origin_, out);
  }

  template <typename Visit>
  void section(const char* key, Visit visit) {
    known_.emplace_back(key);
    Reader sub(lookup(key), join_path(path_, key), origin_);
    visit(sub);
    sub.finish();
  }

  /// Rejects unknown and repeated keys (yaml-cpp keeps both copies of a repeated key).
  void finish() const {
    if (!node_.IsDefined() || !node_.IsMap()) return;
    std::vector<std::string> seen;
    for (const auto& kv : node_) {
      if (!kv.first.IsScalar()) {
        fail(origin_, path_.empty() ? "(top level)" : path_,
             "keys must be plain names, got " + describe(kv.first));
      }
      const std::string& key = kv.first.Scalar();
      std::string path = join_path(path_, key);
      if (std::find(known_.begin(), known_.end(), key) == known_.end()) {
        fail(origin_, path, unknown_key_message(key));
      }
      if (std::find(seen.begin(), seen.end(), key) != seen.end())
        fail(origin_, path, "duplicate key");
      seen.push_back(key);
    }
  }

 private:
  YAML::Node lookup(const char* key) const {
    if (!node_.IsDefined() || !node_.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node& map = node_;  // const access: a lookup must not insert the key
    return map[key];
  }

  std::string unknown_key_message(const std::string& key) const {
    std::ostringstream oss;
    oss << "unknown key";
    size_t best = 3;  // suggest only near misses (at most 2 edits) of keys longer than 2
    std::string guess;
    for (const auto& k : known_) {
      size_t d = edit_distance(key, k);
      if (d < best && key.size() > 2) {
        best = d;
        guess = k;
      }
    }
    if (!guess.empty()) oss << ", did you mean '" << guess << "'?";
    oss << " (known " << (path_.empty() ? "top-level keys" : "keys in " + path_) << ": ";
    for (size_t i = 0; i < known_.size(); ++i) oss << (i ? ", " : "") << known_[i];
    oss << ")";
    return oss.str();
  }

  YAML::Node node_;
  std::string path_;
  const Origin& origin_;
  std::vector<std::string> known_;
};

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string format_value(const std::string& v) { return quote(v); }
std::string format_value(int64_t v) { return std::to_string(v); }
std::string format_value(uint64_t v) { return std::to_string(v); }
std::string format_value(double v) { return format_double(v); }
std::string format_value(bool v) { return v ? "true" : "false"; }
std::string format_value(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

template <size_t N>
std::string format_value(const std::array<double, N>& v) {
  std::string out = "[";
  for (size_t i = 0; i < N; ++i) out += (i ? ", " : "") + format_double(v[i]);
  return out + "]";
}

std::string format_value(const Normalization& v) {
  if (v.mode == Normalization::Mode::Fixed)
    return format_value(std::array<double, 2>{v.mean, v.std});
  return v.mode == Normalization::Mode::Standardize ? "standardize" : "none";
}

template <typename E, typename = std::enable_if_t<IsConfigEnum<E>::value>>
std::string format_value(E v) {
  return quote(to_string(v));
}

/// Prints struct fields as block YAML, leaving out keys that data.format does not use (the
/// reader would reject them).
class Writer {
 public:
  Writer(std::ostringstream& out, DataFormat format, int depth)
      : out_(out), format_(format), depth_(depth) {}

  template <typename T>
  void field(const char* key, T& value, const Key& k) {
    if (!k.applies_to(format_)) return;
    out_ << std::string(2 * depth_, ' ') << key << ": " << format_value(value) << "\n";
  }

  template <typename Visit>
  void section(const char* key, Visit visit) {
    out_ << std::string(2 * depth_, ' ') << key << ":\n";
    Writer sub(out_, format_, depth_ + 1);
    visit(sub);
  }

 private:
  std::ostringstream& out_;
  DataFormat format_;
  int depth_;
};

/// Collects the schema's rows: the defaults are the fields of a default TrainConfig.
class RowLister {
 public:
  RowLister(std::vector<KeyRow>& rows, std::string path) : rows_(rows), path_(std::move(path)) {}

  template <typename T>
  void field(const char* key, T& value, const Key& k) {
    KeyRow row;
    row.path = join_path(path_, key);
    row.type = type_name(value);
    row.default_value = format_value(value);
    row.allowed = allowed(value, k);
    if (k.bounded()) row.maximum = format_bound(k.max, is_integer<T>());
    row.format = k.owners_text();
    row.resume = k.must_match;
    row.doc = k.text;
    rows_.push_back(row);
  }

  template <typename Visit>
  void section(const char* key, Visit visit) {
    RowLister sub(rows_, join_path(path_, key));
    visit(sub);
  }

 private:
  static std::string type_name(int64_t) { return "integer"; }
  static std::string type_name(uint64_t) { return "integer"; }
  static std::string type_name(double) { return "number"; }
  static std::string type_name(bool) { return "bool"; }
  static std::string type_name(const std::string&) { return "string"; }
  static std::string type_name(const std::vector<int64_t>&) { return "list of integers"; }
  static std::string type_name(const Normalization&) { return "string or list of 2 numbers"; }
  template <size_t N>
  static std::string type_name(const std::array<double, N>&) {
    return "list of " + std::to_string(N) + " numbers";
  }
  template <typename E, typename = std::enable_if_t<IsConfigEnum<E>::value>>
  static std::string type_name(E) {
    return "string";
  }

  template <typename T>
  static std::string allowed(const T&, const Key& k) {
    if constexpr (std::is_same_v<T, Normalization>)
      return "none, standardize, [mean, std]: float32, std normal > 0";
    if constexpr (IsConfigEnum<T>::value) {
      std::string out;
      for (const auto& entry : EnumNames<T>::table)
        out += (out.empty() ? "" : ", ") + std::string(entry.second);
      return out;
    }
    const std::string each =
        std::is_same_v<T, std::vector<int64_t>> || IsNumberList<T>::value ? "each " : "";
    if (k.bounded()) return each + range(k, is_integer<T>());
    switch (k.rule) {
      case Key::Rule::AtLeast:
        return each + ">= " + std::to_string(k.min);
      case Key::Rule::NotBelow:
        return ">= " + format_bound(k.lo, false);
      case Key::Rule::Positive:
        return "> 0";
      case Key::Rule::NonNegative:
        return ">= 0";
      case Key::Rule::Fraction:
        return each + "in [0, 1)";
      case Key::Rule::UnitInterval:
        return "in (0, 1]";
      case Key::Rule::NonEmpty:
        return "non-empty";
      case Key::Rule::Equals:
        return k.only;
      case Key::Rule::OffOrAbove:
        return "0 or > " + format_bound(k.lo, false);
      case Key::Rule::None:
        break;
    }
    return std::is_same_v<T, uint64_t> ? ">= 0" : "";
  }

  template <typename T>
  static constexpr bool is_integer() {
    return std::is_same_v<T, int64_t> || std::is_same_v<T, std::vector<int64_t>>;
  }

  /// A bounded key's interval: "in [1, 1000000]", "in (0, 1e+09]".
  static std::string range(const Key& k, bool integer) {
    const std::string hi = format_bound(k.max, integer) + "]";
    switch (k.rule) {
      case Key::Rule::AtLeast:
        return "in [" + std::to_string(k.min) + ", " + hi;
      case Key::Rule::NotBelow:
        return "in [" + format_bound(k.lo, false) + ", " + hi;
      case Key::Rule::Positive:
        return "in (0, " + hi;
      case Key::Rule::NonNegative:
        return "in [0, " + hi;
      case Key::Rule::OffOrAbove:
        return "0 or in (" + format_bound(k.lo, false) + ", " + hi;
      default:
        return "<= " + format_bound(k.max, integer);
    }
  }

  std::vector<KeyRow>& rows_;
  std::string path_;
};

// ---------------------------------------------------------------------------------------------
// Parsing the document and applying --set overrides.

struct Override {
  std::string key;                 ///< normalised dotted path
  std::vector<std::string> parts;  ///< the path's components
  YAML::Node value;
};

std::string trim(const std::string& s) {
  size_t begin = s.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t") - begin + 1);
}

Override parse_override(const std::string& arg) {
  size_t eq = arg.find('=');
  Override ov;
  ov.key = eq == std::string::npos ? "" : trim(arg.substr(0, eq));
  std::stringstream ss(ov.key);
  for (std::string part; std::getline(ss, part, '.');) ov.parts.push_back(part);
  bool ok = !ov.key.empty() && ov.key.back() != '.' &&
            std::none_of(ov.parts.begin(), ov.parts.end(),
                         [](const std::string& p) { return p.empty(); });
  DDP_CHECK(ok, "--set " << arg << ": expected key.path=value");
  try {
    ov.value = YAML::Load(arg.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    DDP_THROW("--set " << arg << ": invalid YAML value: " << e.msg);
  }
  return ov;
}

/// Sets ov.key in the tree, creating missing (or empty) sections on the way.
void apply_override(YAML::Node& root, const Override& ov) {
  YAML::Node node = root;  // node handles share identity; reset() re-points them
  std::string path;
  for (size_t i = 0; i + 1 < ov.parts.size(); ++i) {
    const std::string& part = ov.parts[i];
    path = join_path(path, part);
    YAML::Node child = node[part];
    if (!child.IsDefined() || child.IsNull()) {
      node[part] = YAML::Node(YAML::NodeType::Map);
      child.reset(node[part]);
    } else if (!child.IsMap()) {
      DDP_THROW("--set " << ov.key << ": " << path << " is " << describe(child)
                         << ", not a section, so it has no key '" << ov.parts[i + 1] << "'");
    }
    node.reset(child);
  }
  node[ov.parts.back()] = ov.value;
}

/// Sees a document go by without building it. Counting documents with YAML::LoadAll is not
/// safe: yaml-cpp 0.7 returns empty documents forever, allocating as it goes, when a document
/// starts with a stray ',' (", 3]" or "- a\n,"), so the count stops at kMaxDocuments.
class DocumentCounter : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};
constexpr int kMaxDocuments = 100;

/// The single document in `text` as a map (an empty document is an empty map).
YAML::Node parse_document(const std::string& text, const std::string& name) {
  YAML::Node doc;
  int docs = 0;
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    DocumentCounter counter;
    while (docs <= kMaxDocuments && parser.HandleNextDocument(counter)) ++docs;
    if (docs == 1) doc = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    if (e.mark.is_null()) DDP_THROW(name << ": invalid YAML: " << e.msg);
    DDP_THROW(name << ":" << e.mark.line + 1 << ":" << e.mark.column + 1
                   << ": invalid YAML: " << e.msg);
  } catch (const YAML::Exception& e) {
    DDP_THROW(name << ": invalid YAML: " << e.msg);
  }
  if (docs > kMaxDocuments) {
    DDP_THROW(name << ": expected one YAML document, found more than " << kMaxDocuments
                   << " (a stray ',' outside [...] or {...}?)");
  }
  DDP_CHECK(docs <= 1, name << ": expected one YAML document, found " << docs);
  if (docs == 0 || doc.IsNull()) return YAML::Node(YAML::NodeType::Map);
  DDP_CHECK(doc.IsMap(), name << ": expected a map of sections (device, model, data, ...) at the "
                              << "top level, got " << describe(doc));
  return doc;
}

std::string read_text_file(const std::string& path) {
  // A FIFO, a device or a directory is refused before a byte is read.
  const InputStream file = open_input_stream(path, "config file '" + path + "'");
  std::string text;
  char buf[1 << 14];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, file.get())) > 0) text.append(buf, n);
  if (std::ferror(file.get()))  // a device error (EIO) after the open
    DDP_THROW("cannot read config file " << path << ": " << std::strerror(errno));
  return text;
}

// ---------------------------------------------------------------------------------------------
// Validation: the schema's rules for every key, then the rules that relate keys or need files.
// Doubles are tested as !(x > 0) so that NaN fails too.

void require_min(const Origin& o, const std::string& path, int64_t v, int64_t lo) {
  if (v < lo) fail(o, path, "must be >= " + std::to_string(lo) + ", got " + std::to_string(v));
}

/// The schema's bounds are whole numbers below 2^53 for integer keys: the comparison in double
/// is exact there, and a larger value converts to at least 2^53.
void require_max(const Origin& o, const std::string& path, int64_t v, const Key& k) {
  if (static_cast<double>(v) > k.max)
    fail(o, path, "must be <= " + format_bound(k.max, true) + ", got " + std::to_string(v));
}

void require_max(const Origin& o, const std::string& path, double v, const Key& k) {
  if (v > k.max)
    fail(o, path, "must be <= " + format_bound(k.max, false) + ", got " + format_double(v));
}

[[noreturn]] void misdeclared(const std::string& path) {
  DDP_THROW("config schema: " << path << ": the rule does not fit the key's type");
}

void check_rule(const Origin& o, const std::string& path, int64_t v, const Key& k) {
  if (k.rule == Key::Rule::AtLeast) {
    require_min(o, path, v, k.min);
  } else if (k.rule != Key::Rule::None) {
    misdeclared(path);
  }
  require_max(o, path, v, k);
}

void check_lower_rule(const Origin& o, const std::string& path, double v, const Key& k) {
  const bool finite = std::isfinite(v);
  if (k.rule == Key::Rule::NotBelow) {
    if (!(v >= k.lo) || !finite)
      fail(o, path,
           "must be >= " + format_bound(k.lo, false) +
               (*k.lo_is ? std::string(" (") + k.lo_is + ")" : "") + ", got " + format_double(v));
  } else if (k.rule == Key::Rule::Positive) {
    if (!(v > 0) || !finite) fail(o, path, "must be > 0, got " + format_double(v));
  } else if (k.rule == Key::Rule::NonNegative) {
    if (!(v >= 0) || !finite) fail(o, path, "must be >= 0, got " + format_double(v));
  } else if (k.rule == Key::Rule::Fraction) {
    if (!(v >= 0 && v < 1)) fail(o, path, "must be in [0, 1), got " + format_double(v));
  } else if (k.rule == Key::Rule::UnitInterval) {
    if (!(v > 0 && v <= 1)) fail(o, path, "must be in (0, 1], got " + format_double(v));
  } else if (k.rule == Key::Rule::OffOrAbove) {
    if (!(v == 0 || (v > k.lo && finite)))
      fail(o, path, "must be 0 (off) or > " + format_bound(k.lo, false) + ", got " +
                        format_double(v));
  } else if (k.rule != Key::Rule::None) {
    misdeclared(path);
  }
}

void check_rule(const Origin& o, const std::string& path, double v, const Key& k) {
  check_lower_rule(o, path, v, k);
  require_max(o, path, v, k);
}

void check_rule(const Origin& o, const std::string& path, const std::string& v, const Key& k) {
  if (k.bounded()) misdeclared(path);
  if (k.rule == Key::Rule::NonEmpty) {
    if (v.empty()) fail(o, path, "must not be empty");
  } else if (k.rule == Key::Rule::Equals) {
    if (v != k.only) fail(o, path, std::string("must be ") + k.only + ", got '" + v + "'");
  } else if (k.rule != Key::Rule::None) {
    misdeclared(path);
  }
}

void check_rule(const Origin& o, const std::string& path, const std::vector<int64_t>& v,
                const Key& k) {
  for (size_t i = 0; i < v.size(); ++i) {
    check_rule(o, path + "[" + std::to_string(i) + "]", v[i], k);
  }
}

template <size_t N>
void check_rule(const Origin& o, const std::string& path, const std::array<double, N>& v,
                const Key& k) {
  for (size_t i = 0; i < N; ++i) check_rule(o, path + "[" + std::to_string(i) + "]", v[i], k);
}

/// The transform is (x - mean) / std in float32: the mean must be a finite float32 and the std
/// a normal one, whose reciprocal is finite too (1e-320 is 0 in float32, 1e-40 subnormal).
void check_rule(const Origin& o, const std::string& path, const Normalization& v, const Key& k) {
  if (k.rule != Key::Rule::None || k.bounded()) misdeclared(path);
  if (v.mode != Normalization::Mode::Fixed) return;
  if (!(std::fabs(v.mean) <= FLT_MAX)) {
    fail(o, path + "[0]",
         "mean must be finite as a float32 (at most " + format_double(FLT_MAX) +
             " in magnitude), got " + format_double(v.mean));
  }
  if (!(v.std > 0) || !std::isfinite(v.std))
    fail(o, path + "[1]", "std must be > 0, got " + format_double(v.std));
  const float std32 = v.std <= FLT_MAX ? static_cast<float>(v.std) : HUGE_VALF;
  if (!std::isnormal(std32) || !std::isfinite(1.0f / std32)) {
    fail(o, path + "[1]",
         "std must be a normal float32 (from " + format_double(FLT_MIN) + " to " +
             format_double(FLT_MAX) + ") with a finite reciprocal, got " + format_double(v.std));
  }
}

/// bool, uint64_t (the reader refuses negatives) and enums (the reader refuses other names).
template <typename T>
void check_rule(const Origin&, const std::string& path, const T&, const Key& k) {
  if (k.rule != Key::Rule::None || k.bounded()) misdeclared(path);
}

/// Walks the schema: each key's rule; a key of another data.format must keep its default.
class Validator {
 public:
  Validator(const Origin& origin, DataFormat format, std::string path)
      : origin_(origin), format_(format), path_(std::move(path)) {}

  template <typename T>
  void field(const char* key, T& value, const Key& k) {
    const std::string path = join_path(path_, key);
    if (k.applies_to(format_)) return check_rule(origin_, path, value, k);
    if (value == T{}) return;
    fail(origin_, path,
         std::string("does not apply to data.format ") + to_string(format_) + " (only to " +
             k.owners_text() + k.misuse + ")");
  }

  template <typename Visit>
  void section(const char* key, Visit visit) {
    Validator sub(origin_, format_, join_path(path_, key));
    visit(sub);
  }

 private:
  const Origin& origin_;
  DataFormat format_;
  std::string path_;
};

void require_file(const Origin& o, const std::string& path, const std::string& file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path shown = fs::absolute(file, ec);
  if (ec) shown = file;
  fs::file_status st = fs::status(file, ec);
  if (!fs::exists(st)) fail(o, path, "file not found: " + shown.string());
  if (!fs::is_regular_file(st)) fail(o, path, "not a regular file: " + shown.string());
}

void require_set(const Origin& o, const std::string& path, const std::string& v,
                 DataFormat format) {
  if (v.empty()) fail(o, path, std::string("required for data.format ") + to_string(format));
}

/// A format whose splits are a pair of files (idx: images and labels; npy: features and labels):
/// the training pair is required, a test pair is whole or absent, and every file set exists.
void validate_file_pair(const Origin& o, const DataConfig& d, const char* first,
                        std::string SplitSource::*member) {
  const std::string train_first = std::string("data.train.") + first;
  const std::string test_first = std::string("data.test.") + first;
  require_set(o, train_first, d.train.*member, d.format);
  require_set(o, "data.train.labels", d.train.labels, d.format);
  require_file(o, train_first, resolve_data_path(d, d.train.*member));
  require_file(o, "data.train.labels", resolve_data_path(d, d.train.labels));
  const std::string& test = d.test.*member;
  if (test.empty() != d.test.labels.empty()) {
    const bool first_missing = test.empty();
    fail(o, first_missing ? test_first : "data.test.labels",
         "required when " + (first_missing ? std::string("data.test.labels") : test_first) +
             " is set (a test split needs both " + first + " and labels)");
  }
  if (test.empty()) return;
  require_file(o, test_first, resolve_data_path(d, test));
  require_file(o, "data.test.labels", resolve_data_path(d, d.test.labels));
}

void validate_data_files(const Origin& o, const DataConfig& d) {
  if (d.format == DataFormat::Idx) {
    validate_file_pair(o, d, "images", &SplitSource::images);
  } else if (d.format == DataFormat::Npy) {
    validate_file_pair(o, d, "features", &SplitSource::features);
  } else if (d.format == DataFormat::Csv) {
    require_set(o, "data.train.path", d.train.path, DataFormat::Csv);
    require_file(o, "data.train.path", resolve_data_path(d, d.train.path));
    if (!d.test.path.empty()) require_file(o, "data.test.path", resolve_data_path(d, d.test.path));
  }
}

/// What must hold before the rules of single keys mean anything: a device this build has, and
/// a model (an empty file reports the missing model.layers first).
void validate_basics(const Origin& o, const TrainConfig& c) {
  if (c.device == DeviceChoice::Cuda && !cuda_built()) {
    fail(o, "device",
         "cuda is not available in this build (built without the CUDA toolkit); use cpu or auto");
  }
  if (c.model.layers.size() < 2) {
    fail(
        o, "model.layers",
        "needs at least 2 widths (input and output), got " + std::to_string(c.model.layers.size()));
  }
}

void validate_nccl(const Origin& o, const TrainConfig& c) {
  if (c.distributed.backend != BackendChoice::Nccl) return;
  if (!cuda_built()) {
    fail(o, "distributed.backend", "nccl needs the CUDA build; this build supports mpi");
  }
  if (c.device == DeviceChoice::Cpu) {
    fail(o, "distributed.backend",
         "nccl moves GPU memory and needs device: cuda (or auto); with device: cpu use mpi");
  }
}

/// fp16 GEMM operands need fp16 tensor cores and loss scaling: a GPU's path. The CPU path has
/// bf16 (its vector units and oneDNN's kernels speak bf16, and bf16 needs no loss scale).
void validate_precision(const Origin& o, const TrainConfig& c) {
  if (c.training.precision == Precision::Fp16 && c.device == DeviceChoice::Cpu)
    fail(o, "training.precision",
         "fp16 runs on GPUs only (with loss scaling); on device: cpu use bf16 or fp32");
}

/// The gradient path's refusals that the config alone decides (config/gradient_path.h).
void validate_gradient_path(const Origin& o, const TrainConfig& c) {
  if (const auto no = gradient_path_refusal(c)) fail(o, no->key, no->message);
}

/// A key of one optimizer set for another is refused (torch.optim.Adam has no momentum): the
/// user who set it expects it to act.
void validate_optimizer_keys(const Origin& o, const OptimizerConfig& opt) {
  const OptimizerConfig defaults;
  auto refuse_if = [&](bool set, const char* key, const char* owners) {
    if (!set) return;
    fail(o, std::string("optimizer.") + key,
         std::string("applies to ") + owners + " only, not to optimizer.name " +
             to_string(opt.name));
  };
  if (opt.name == OptimizerName::Sgd) {
    refuse_if(opt.betas != defaults.betas, "betas", "adam and adamw");
    refuse_if(opt.eps != defaults.eps, "eps", "adam and adamw");
    refuse_if(opt.amsgrad != defaults.amsgrad, "amsgrad", "adam and adamw");
  } else {
    refuse_if(opt.momentum != defaults.momentum, "momentum", "sgd");
    refuse_if(opt.dampening != defaults.dampening, "dampening", "sgd");
    refuse_if(opt.nesterov != defaults.nesterov, "nesterov", "sgd");
  }
}

/// Like the optimizer's keys: a schedule's key set for another schedule is refused; a step
/// schedule needs its step_size; an explicit decay has steps after the warmup.
void validate_scheduler_keys(const Origin& o, const TrainConfig& c) {
  const SchedulerConfig& s = c.scheduler;
  const SchedulerConfig defaults;
  const bool step = s.name == SchedulerName::Step;
  const bool decays = s.name == SchedulerName::Cosine || s.name == SchedulerName::Linear;
  auto refuse_if = [&](bool set, const char* key, const char* owners) {
    if (!set) return;
    fail(o, std::string("scheduler.") + key,
         std::string("applies to ") + owners + " only, not to scheduler.name " + to_string(s.name));
  };
  refuse_if(!step && s.step_size != defaults.step_size, "step_size", "step");
  refuse_if(!step && s.gamma != defaults.gamma, "gamma", "step");
  refuse_if(!decays && s.min_lr != defaults.min_lr, "min_lr", "cosine and linear");
  refuse_if(!decays && s.total_steps != defaults.total_steps, "total_steps", "cosine and linear");
  if (s.warmup_steps == 0 && s.warmup_start_factor != defaults.warmup_start_factor)
    fail(o, "scheduler.warmup_start_factor",
         "applies to a warmup only; set scheduler.warmup_steps > 0");
  if (step && s.step_size < 1)
    fail(o, "scheduler.step_size", "required (>= 1) for scheduler.name step");
  if (decays && s.min_lr > c.optimizer.lr)
    fail(o, "scheduler.min_lr",
         format_double(s.min_lr) + " is above optimizer.lr " + format_double(c.optimizer.lr) +
             ": the schedule decays from optimizer.lr to min_lr");
  if (decays && s.total_steps > 0 && s.total_steps <= s.warmup_steps)
    fail(o, "scheduler.total_steps",
         std::to_string(s.total_steps) + " leaves no steps to decay after scheduler.warmup_steps " +
             std::to_string(s.warmup_steps));
}

/// The rules that relate keys to each other or to files.
void validate_across_keys(const Origin& o, const TrainConfig& c) {
  if (!c.model.init_from.empty()) require_file(o, "model.init_from", c.model.init_from);
  validate_data_files(o, c.data);
  const OptimizerConfig& opt = c.optimizer;
  validate_optimizer_keys(o, opt);
  validate_scheduler_keys(o, c);
  if (opt.nesterov && !(opt.momentum > 0 && opt.dampening == 0)) {
    fail(o, "optimizer.nesterov",
         "requires momentum > 0 and dampening == 0 (as in PyTorch), got momentum " +
             format_double(opt.momentum) + ", dampening " + format_double(opt.dampening));
  }
  // training.resume is not checked here: only rank 0 reads the checkpoint (other nodes may not
  // see the file), and it reports a missing one.
  if (c.training.start_over && !c.training.resume.empty()) {
    fail(o, "training.start_over",
         "starts a fresh run; training.resume '" + c.training.resume + "' continues one: not both");
  }
  if (c.checkpoint.every_steps > 0 && c.checkpoint.every_epochs > 0) {
    fail(o, "checkpoint.every_epochs",
         "set either checkpoint.every_steps or checkpoint.every_epochs, not both");
  }
  validate_nccl(o, c);
  validate_precision(o, c);
  validate_gradient_path(o, c);
}

/// Of the keys a product is made of, the one a --set override set last (that is what changed),
/// else the first.
std::string blamed_key(const Origin& o, const std::vector<std::string>& keys) {
  for (auto it = o.override_keys.rbegin(); it != o.override_keys.rend(); ++it) {
    for (const std::string& key : keys) {
      if (*it == key || path_inside(*it, key) || path_inside(key, *it)) return key;
    }
  }
  return keys.front();
}

std::string format_bytes(int64_t bytes) {
  char gib[32];
  std::snprintf(gib, sizeof gib, "%.1f", static_cast<double>(bytes) / (1 << 30));
  return std::to_string(bytes) + " bytes (" + gib + " GiB)";
}

/// Each product of several keys fits in int64 (checked first: that does not depend on the
/// machine), then in this machine's memory. The comparison is generous: each demand is a lower
/// bound of what the run allocates, held against all of the physical memory.
void validate_memory(const Origin& o, const TrainConfig& c) {
  const std::vector<MemoryDemand> demands = memory_demands(c);
  for (const MemoryDemand& d : demands) {
    if (d.overflows)
      fail(o, blamed_key(o, d.keys), d.what + " overflow 64-bit integers: " + d.product);
  }
  const int64_t available = physical_memory_bytes();
  for (const MemoryDemand& d : demands) {
    if (available == 0 || d.bytes <= available) continue;
    fail(o, blamed_key(o, d.keys),
         d.what + " need " + format_bytes(d.bytes) + " (" + d.product + "), more than the " +
             format_bytes(available) + " of this machine's physical memory");
  }
}

/// The global batch, batch_size x accumulate_steps x ranks, is an int64 for any number of ranks.
void validate_step_samples(const Origin& o, const TrainConfig& c) {
  const TrainingConfig& t = c.training;
  int64_t samples = 0;
  if (!__builtin_mul_overflow(t.batch_size, t.accumulate_steps, &samples) &&
      samples <= kMaxRankStepSamples) {
    return;
  }
  const std::string most = std::to_string(kMaxRankStepSamples);
  fail(o, blamed_key(o, {"training.accumulate_steps", "training.batch_size"}),
       "training.batch_size " + std::to_string(t.batch_size) + " x training.accumulate_steps " +
           std::to_string(t.accumulate_steps) +
           " samples per rank and optimizer step is more than " + most +
           ", which keeps the global batch over any number of ranks in 64 bits");
}

/// The run's optimizer steps, epochs x steps per epoch, are an int64 (the lr schedule's length
/// is that product). An epoch of generated data has at most ceil(samples / batch_size) steps on
/// any number of ranks; files' sizes are known only once read (an IDX file has < 2^32 samples).
void validate_run_steps(const Origin& o, const TrainConfig& c) {
  if (c.data.format != DataFormat::Synthetic) return;
  const int64_t samples = c.data.train.samples, batch = c.training.batch_size;
  const int64_t per_epoch = samples / batch + (samples % batch != 0 ? 1 : 0);
  int64_t steps = 0;
  if (!__builtin_mul_overflow(c.training.epochs, per_epoch, &steps)) return;
  fail(o, blamed_key(o, {"training.epochs", "data.train.samples", "training.batch_size"}),
       "training.epochs " + std::to_string(c.training.epochs) + " x up to " +
           std::to_string(per_epoch) + " optimizer steps per epoch (data.train.samples " +
           std::to_string(samples) + " / training.batch_size " + std::to_string(batch) +
           ") overflow 64-bit integers");
}

void validate(const Origin& o, const TrainConfig& c) {
  validate_basics(o, c);
  TrainConfig copy = c;  // the visitor hands out mutable references; the validator only reads
  Validator validator(o, c.data.format, "");
  visit_config(copy, validator);
  validate_step_samples(o, c);
  validate_run_steps(o, c);
  validate_memory(o, c);
  validate_across_keys(o, c);
}

}  // namespace

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  return parse_config(read_text_file(path), path, overrides);
}

TrainConfig parse_config(const std::string& yaml_text, const std::string& name,
                         const std::vector<std::string>& overrides) {
  std::vector<Override> parsed;
  for (const auto& arg : overrides) parsed.push_back(parse_override(arg));
  YAML::Node root = parse_document(yaml_text, name);
  Origin origin{name, {}};
  for (const auto& ov : parsed) {
    apply_override(root, ov);
    origin.override_keys.push_back(ov.key);
  }
  TrainConfig cfg;
  try {
    Reader reader(root, "", origin);
    visit_config(cfg, reader);
    reader.finish();
  } catch (const YAML::Exception& e) {  // a safety net: the reader checks node types first
    DDP_THROW(name << ": " << e.what());
  }
  cfg.source = name;
  validate(origin, cfg);
  return cfg;
}

void validate_config(const TrainConfig& cfg) {
  validate(Origin{cfg.source.empty() ? "<config>" : cfg.source, {}}, cfg);
}

std::string to_yaml(const TrainConfig& cfg) {
  TrainConfig copy = cfg;  // the visitor hands out mutable references; the writer only reads
  std::ostringstream out;
  out << "# Effective configuration: every key, defaults included (see docs/config.md).\n";
  Writer writer(out, copy.data.format, 0);
  visit_config(copy, writer);
  return out.str();
}

std::string resolve_data_path(const DataConfig& data, const std::string& path) {
  if (path.empty() || data.dir.empty() || path.front() == '/') return path;
  if (data.dir.back() == '/') return data.dir + path;
  return data.dir + "/" + path;
}

const char* to_string(DeviceChoice v) { return enum_name(v); }
const char* to_string(BackendChoice v) { return enum_name(v); }
const char* to_string(NanPolicy v) { return enum_name(v); }
const char* to_string(DataFormat v) { return enum_name(v); }
const char* to_string(NcclAlgo v) { return enum_name(v); }
const char* to_string(Compression v) { return enum_name(v); }
const char* to_string(CompressedSum v) { return enum_name(v); }
const char* to_string(Precision v) { return enum_name(v); }
const char* to_string(LossScaling v) { return enum_name(v); }
const char* to_string(Hierarchy v) { return enum_name(v); }
const char* to_string(Tune v) { return enum_name(v); }
const char* to_string(OptimizerName v) { return enum_name(v); }
const char* to_string(SchedulerName v) { return enum_name(v); }

std::vector<KeyRow> config_schema() {
  TrainConfig defaults;
  std::vector<KeyRow> rows;
  RowLister lister(rows, "");
  visit_config(defaults, lister);
  return rows;
}

std::string config_schema_table() {
  std::vector<std::vector<std::string>> cells = {
      {"key", "type", "default", "allowed", "format", "resume", "doc"}};
  for (const KeyRow& r : config_schema()) {
    cells.push_back({r.path, r.type, r.default_value, r.allowed.empty() ? "-" : r.allowed,
                     r.format.empty() ? "-" : r.format, r.resume ? "must match" : "-", r.doc});
  }
  std::vector<size_t> width(cells[0].size(), 0);
  for (const auto& row : cells) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : cells) {
    for (size_t i = 0; i + 1 < row.size(); ++i)
      out += row[i] + std::string(width[i] - row[i].size() + 2, ' ');
    out += row.back() + "\n";
  }
  return out;
}

}  // namespace ddp
