// Training checkpoints (see training_checkpoint.h): one safetensors file holding weights,
// momentum and state metadata, written through save_safetensors (atomic, durable) and read
// back with every field validated and a CRC-32 compared.
#include "io/training_checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <map>
#include <random>
#include <sstream>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/tensor.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormatKey = "ddp.checkpoint";
constexpr const char* kFormatVersion = "1";
constexpr const char* kCrcKey = "ddp.crc32";
constexpr const char* kOptimizerPrefix = "optimizer.";
constexpr const char* kErrorPrefix = "powersgd.error.";
constexpr const char* kQPrefix = "powersgd.q.";
// Written before the optimizer_steps key had its name.
constexpr const char* kOldStepsKey = "ddp.sgd_steps";
constexpr const char* kScheduleKey = "ddp.schedule_steps";
constexpr const char* kRunKey = "ddp.run";
constexpr const char* kScalerKeys[] = {"ddp.scaler_skipped_steps", "ddp.loss_scale",
                                       "ddp.loss_scale_growth_tracker"};
constexpr const char* kFilePrefix = "step-";
// Counters above 2^53 are not exact as doubles (a resumed position is broadcast as doubles) and
// no run takes that many steps: a larger one is corruption or a crafted file.
constexpr int64_t kMaxCounter = int64_t{1} << 53;
constexpr const char* kFileSuffix = ".safetensors";

using Metadata = std::map<std::string, std::string>;

uint32_t crc_bytes(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const Bytef*>(data);
  while (bytes > 0) {  // zlib takes uInt lengths
    const auto n = static_cast<uInt>(std::min<size_t>(bytes, 1u << 30));
    crc = static_cast<uint32_t>(crc32(crc, p, n));
    p += n;
    bytes -= n;
  }
  return crc;
}

uint32_t crc_string(uint32_t crc, const std::string& s) {
  return crc_bytes(crc, s.c_str(), s.size() + 1);  // with the NUL: "ab"+"c" != "a"+"bc"
}

// Over every tensor (name, shape, data) in order and every metadata entry but the checksum
// itself: any change to what the file means changes it.
uint32_t checkpoint_crc(const std::vector<TensorView>& tensors, const Metadata& metadata) {
  uint32_t crc = static_cast<uint32_t>(crc32(0L, Z_NULL, 0));
  for (const TensorView& view : tensors) {
    const NamedTensor& t = *view.tensor;
    crc = crc_string(crc, view.name);
    for (int64_t d : t.shape) crc = crc_bytes(crc, &d, sizeof d);
    crc = crc_bytes(crc, t.data.data(), t.data.size() * sizeof(float));
  }
  for (const auto& [key, value] : metadata) {  // std::map: sorted, the same on both sides
    if (key == kCrcKey) continue;
    crc = crc_string(crc, key);
    crc = crc_string(crc, value);
  }
  return crc;
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08" PRIx32, v);
  return buf;
}

// Hexadecimal floating point: exact in both directions.
std::string exact_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

std::string encode(int64_t v) { return std::to_string(v); }
std::string encode(double v) { return exact_double(v); }
const std::string& encode(const std::string& v) { return v; }

Metadata encode_state(const TrainingState& s) {
  Metadata m = {{"format", "pt"}, {kFormatKey, kFormatVersion}};
  visit_training_state(s, [&](const char* name, const auto& value) {
    m[std::string("ddp.") + name] = encode(value);
  });
  return m;
}

class MetadataReader {
 public:
  MetadataReader(const Metadata& m, const std::string& where) : m_(m), where_(where) {}

  const std::string& text(const std::string& key) const {
    auto it = m_.find(key);
    DDP_CHECK(it != m_.end(), where_ << ": metadata '" << key << "' is missing");
    return it->second;
  }

  int64_t count(const std::string& key) const {
    const std::string& s = text(key);
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    DDP_CHECK(
        !s.empty() && end == s.c_str() + s.size() && errno == 0 && v >= 0,
        where_ << ": metadata '" << key << "' is '" << s << "', expected a non-negative integer");
    DDP_CHECK(v <= kMaxCounter, where_ << ": metadata '" << key << "' is " << s
                                       << ", more than the largest count a run can reach (2^53)");
    return static_cast<int64_t>(v);
  }

  void read(const std::string& key, int64_t& out) const { out = count(key); }
  void read(const std::string& key, double& out) const { out = number(key); }
  void read(const std::string& key, std::string& out) const { out = text(key); }

  double number(const std::string& key) const {
    const std::string& s = text(key);
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    DDP_CHECK(!s.empty() && end == s.c_str() + s.size(),
              where_ << ": metadata '" << key << "' is '" << s << "', expected a number");
    return v;
  }

 private:
  const Metadata& m_;
  const std::string& where_;
};

// A loss scale is 0 (none) or what the scaler's can be: a float32 value in [2^-126, 2^126].
void check_loss_scale(const TrainingState& s, const std::string& where) {
  const double v = s.loss_scale;
  const bool scale =
      v >= FLT_MIN && v <= 0x1p126 && static_cast<double>(static_cast<float>(v)) == v;
  DDP_CHECK(v == 0 || scale, where << ": metadata 'ddp.loss_scale' is " << v
                                   << ", not 0 or a float32 value in [2^-126, 2^126]");
}

TrainingState decode_state(Metadata m, const std::string& where) {
  const std::string steps_key = "ddp.optimizer_steps";
  if (m.count(steps_key) == 0 && m.count(kOldStepsKey) != 0) m[steps_key] = m[kOldStepsKey];
  if (m.count(kScheduleKey) == 0) m[kScheduleKey] = "0";  // written before schedules
  if (m.count(kRunKey) == 0) m[kRunKey] = "";             // written before runs were named
  for (const char* key : kScalerKeys) {
    if (m.count(key) == 0) m[key] = "0";  // written before loss scaling: none
  }
  MetadataReader r(m, where);
  TrainingState s;
  visit_training_state(
      s, [&](const char* name, auto& value) { r.read(std::string("ddp.") + name, value); });
  DDP_CHECK(s.run.size() <= 64 && s.run.find_first_not_of("0123456789abcdef") == std::string::npos,
            where << ": metadata '" << kRunKey << "' is not a run name (hex digits)");
  DDP_CHECK(s.world_size >= 1, where << ": metadata 'ddp.world_size' is 0");
  DDP_CHECK(s.global_batch >= 1, where << ": metadata 'ddp.global_batch' is 0");
  DDP_CHECK(s.train_samples >= 1, where << ": metadata 'ddp.train_samples' is 0");
  DDP_CHECK(s.epoch_position < s.train_samples,
            where << ": metadata 'ddp.epoch_position' " << s.epoch_position
                  << " is not inside the training set of " << s.train_samples << " samples");
  const int64_t skipped = s.skipped_steps + s.scaler_skipped_steps;
  DDP_CHECK(s.step_in_epoch <= s.global_step && s.optimizer_steps + skipped <= s.global_step,
            where << ": step counters disagree (global " << s.global_step << ", in epoch "
                  << s.step_in_epoch << ", applied " << s.optimizer_steps << ", skipped " << skipped
                  << ")");
  check_loss_scale(s, where);
  return s;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// The global step of a complete checkpoint's file name, or -1 for any other name.
int64_t step_of_file_name(const std::string& name) {
  const std::string prefix = kFilePrefix, suffix = kFileSuffix;
  if (name.size() <= prefix.size() + suffix.size() || !starts_with(name, prefix) ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return -1;
  }
  const std::string digits =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream iss(text);
  for (std::string line; std::getline(iss, line);) lines.push_back(line);
  return lines;
}

// "key.path = value" -> "key.path".
std::string key_of(const std::string& line) { return line.substr(0, line.find(" = ")); }

std::string value_of(const std::string& line) {
  const size_t eq = line.find(" = ");
  return eq == std::string::npos ? "" : line.substr(eq + 3);
}

const NamedTensor* weight_named(const TrainingCheckpoint& ckpt, const std::string& name) {
  auto w = std::find_if(ckpt.weights.begin(), ckpt.weights.end(),
                        [&](const NamedTensor& t) { return t.name == name; });
  return w == ckpt.weights.end() ? nullptr : &*w;
}

// Every tensor of `tensors` (what names them: "optimizer momentum") has a weight's name and
// shape, and every weight has one.
void check_matches_weights(const std::vector<NamedTensor>& tensors, const std::string& what,
                           const TrainingCheckpoint& ckpt, const std::string& where) {
  for (const NamedTensor& m : tensors) {
    const NamedTensor* w = weight_named(ckpt, m.name);
    DDP_CHECK(w != nullptr,
              where << ": " << what << " tensor '" << m.name << "' has no weight of that name");
    DDP_CHECK(w->shape == m.shape, where << ": " << what << " tensor '" << m.name << "' has shape "
                                         << shape_string(m.shape) << ", its weight "
                                         << shape_string(w->shape));
  }
  DDP_CHECK(tensors.size() == ckpt.weights.size(), where << ": " << what << " is stored for "
                                                         << tensors.size() << " of "
                                                         << ckpt.weights.size() << " tensors");
}

// "<state>.<weight>" of an optimizer tensor into ckpt.optimizer.
void add_optimizer_tensor(NamedTensor t, const std::string& rest, TrainingCheckpoint& ckpt,
                          const std::string& where) {
  const size_t dot = rest.find('.');
  DDP_CHECK(dot != std::string::npos && dot > 0 && dot + 1 < rest.size(),
            where << ": tensor '" << t.name << "' is not optimizer.<state>.<weight>");
  const std::string state = rest.substr(0, dot);
  auto it = std::find_if(ckpt.optimizer.begin(), ckpt.optimizer.end(),
                         [&](const OptimizerState& o) { return o.name == state; });
  if (it == ckpt.optimizer.end()) it = ckpt.optimizer.insert(it, OptimizerState{state, {}});
  t.name = rest.substr(dot + 1);
  it->tensors.push_back(std::move(t));
}

// "<rank>.<weight>" of a PowerSGD error feedback into ckpt.powersgd.error.
void add_error_tensor(NamedTensor t, const std::string& rest, TrainingCheckpoint& ckpt,
                      const std::string& where) {
  const size_t dot = rest.find('.');
  const std::string digits = rest.substr(0, std::min(dot, rest.size()));
  const bool number =
      !digits.empty() && digits.size() <= 9 &&
      std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  DDP_CHECK(number && dot + 1 < rest.size(),
            where << ": tensor '" << t.name << "' is not powersgd.error.<rank>.<weight>");
  const size_t rank = std::stoul(digits);
  DDP_CHECK(rank < static_cast<size_t>(std::max<int64_t>(ckpt.state.world_size, 0)),
            where << ": tensor '" << t.name << "' is the error feedback of rank " << rank
                  << ", and the run had " << ckpt.state.world_size << " rank(s)");
  if (ckpt.powersgd.error.size() <= rank) ckpt.powersgd.error.resize(rank + 1);
  t.name = rest.substr(dot + 1);
  ckpt.powersgd.error[rank].push_back(std::move(t));
}

// Each rank's error feedback covers the weights, and each Q is [in, r] for a weight [out, in].
void check_powersgd(const TrainingCheckpoint& ckpt, const std::string& where) {
  const PowerSgdCheckpoint& s = ckpt.powersgd;
  DDP_CHECK(s.error.empty() || static_cast<int64_t>(s.error.size()) == ckpt.state.world_size,
            where << ": PowerSGD error feedback is stored for " << s.error.size() << " of "
                  << ckpt.state.world_size << " ranks");
  for (size_t rank = 0; rank < s.error.size(); ++rank)
    check_matches_weights(s.error[rank], "PowerSGD error feedback of rank " + std::to_string(rank),
                          ckpt, where);
  for (const NamedTensor& q : s.q) {
    const NamedTensor* w = weight_named(ckpt, q.name);
    DDP_CHECK(w != nullptr,
              where << ": PowerSGD Q tensor '" << q.name << "' has no weight of that name");
    const bool fits = w->shape.size() == 2 && q.shape.size() == 2 && q.shape[0] == w->shape[1] &&
                      q.shape[1] >= 1 && q.shape[1] <= std::min(w->shape[0], w->shape[1]);
    DDP_CHECK(fits, where << ": PowerSGD Q tensor '" << q.name << "' has shape "
                          << shape_string(q.shape) << ", which is not [in, r] for its weight "
                          << shape_string(w->shape));
  }
}

}  // namespace

std::string checkpoint_path(const std::string& dir, int64_t global_step) {
  char name[64];
  std::snprintf(name, sizeof name, "%s%09" PRId64 "%s", kFilePrefix, global_step, kFileSuffix);
  return (dir.empty() ? std::string(".") : dir) + "/" + name;
}

void write_checkpoint(const std::string& path, const TrainingCheckpoint& ckpt) {
  std::vector<TensorView> tensors;  // the checkpoint's own tensors, not copies
  for (const NamedTensor& t : ckpt.weights) tensors.push_back({t.name, &t});
  for (const OptimizerState& state : ckpt.optimizer) {
    DDP_CHECK(!state.name.empty() && state.name.find('.') == std::string::npos,
              "checkpoint: optimizer state name '" << state.name << "' is empty or has a dot");
    for (const NamedTensor& t : state.tensors)
      tensors.push_back({kOptimizerPrefix + state.name + "." + t.name, &t});
  }
  for (size_t rank = 0; rank < ckpt.powersgd.error.size(); ++rank) {
    for (const NamedTensor& t : ckpt.powersgd.error[rank])
      tensors.push_back({kErrorPrefix + std::to_string(rank) + "." + t.name, &t});
  }
  for (const NamedTensor& t : ckpt.powersgd.q) tensors.push_back({kQPrefix + t.name, &t});
  Metadata metadata = encode_state(ckpt.state);
  metadata[kCrcKey] = hex32(checkpoint_crc(tensors, metadata));
  save_safetensors_views(path, tensors, metadata);
}

TrainingCheckpoint read_checkpoint(const std::string& path) {
  const std::string where = "checkpoint '" + path + "'";
  Metadata metadata;
  std::vector<NamedTensor> tensors;
  try {
    tensors = load_safetensors(path, &metadata);
  } catch (const Error& e) {
    DDP_THROW(where << " is unreadable or corrupt: " << e.message());
  }
  DDP_CHECK(metadata.count(kFormatKey) != 0,
            where << ": not a training checkpoint (no '" << kFormatKey
                  << "' metadata; a model file such as model.safetensors cannot be resumed, "
                  << "use model.init_from for it)");
  DDP_CHECK(metadata[kFormatKey] == kFormatVersion,
            where << ": checkpoint format version '" << metadata[kFormatKey]
                  << "' is not the supported " << kFormatVersion);
  const std::string stored = metadata.count(kCrcKey) ? metadata[kCrcKey] : "";
  DDP_CHECK(!stored.empty(), where << ": metadata '" << kCrcKey << "' is missing");
  std::vector<TensorView> views;
  for (const NamedTensor& t : tensors) views.push_back({t.name, &t});
  const std::string computed = hex32(checkpoint_crc(views, metadata));
  DDP_CHECK(stored == computed, where << ": checksum mismatch (stored " << stored << ", computed "
                                      << computed << "): the file is corrupt");
  require_finite(tensors, where);
  TrainingCheckpoint ckpt;
  ckpt.state = decode_state(metadata, where);
  for (NamedTensor& t : tensors) {
    if (starts_with(t.name, kOptimizerPrefix)) {
      const std::string rest = t.name.substr(std::strlen(kOptimizerPrefix));
      add_optimizer_tensor(std::move(t), rest, ckpt, where);
    } else if (starts_with(t.name, kErrorPrefix)) {
      const std::string rest = t.name.substr(std::strlen(kErrorPrefix));
      add_error_tensor(std::move(t), rest, ckpt, where);
    } else if (starts_with(t.name, kQPrefix)) {
      t.name = t.name.substr(std::strlen(kQPrefix));
      ckpt.powersgd.q.push_back(std::move(t));
    } else {
      ckpt.weights.push_back(std::move(t));
    }
  }
  for (const OptimizerState& state : ckpt.optimizer)
    check_matches_weights(state.tensors, "optimizer " + state.name, ckpt, where);
  check_powersgd(ckpt, where);
  return ckpt;
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return found;
  fs::directory_iterator it(dir, ec);
  DDP_CHECK(!ec, "checkpoint.dir: cannot list " << dir << ": " << ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    DDP_CHECK(!ec, "checkpoint.dir: cannot list " << dir << ": " << ec.message());
    const int64_t step = step_of_file_name(it->path().filename().string());
    if (step >= 0 && it->is_regular_file(ec)) found.emplace_back(step, it->path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::string checkpoint_run(const std::string& path) {
  try {
    const Metadata m = load_safetensors_metadata(path);
    const auto it = m.find(kRunKey);
    return it == m.end() ? "" : it->second;
  } catch (const Error&) {
    return "";  // unreadable: not provably this run's, so never pruned
  }
}

std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep_last,
                                           const std::string& run, const std::string& written) {
  std::vector<std::string> removed;
  std::vector<std::string> older;  // this run's, oldest first, but the one just written
  if (!run.empty()) {
    for (const auto& [step, path] : list_checkpoints(dir))
      if (path != written && checkpoint_run(path) == run) older.push_back(path);
  }
  const size_t keep = keep_last <= 0 ? older.size() + 1 : static_cast<size_t>(keep_last);
  for (size_t i = 0; i + keep < older.size() + 1; ++i) {
    std::error_code ec;
    fs::remove(older[i], ec);
    DDP_CHECK(!ec, "checkpoint.keep_last: cannot remove " << older[i] << ": " << ec.message());
    removed.push_back(older[i]);
  }
  for (std::string& path : remove_abandoned_temporaries(dir)) removed.push_back(std::move(path));
  return removed;
}

std::string new_run_name() {
  std::random_device random;  // the kernel's generator: two runs started at once differ
  std::ostringstream name;
  name << std::hex << std::setfill('0') << std::setw(8) << random() << std::setw(8) << random();
  return name.str();
}

namespace {

void check_parameters(const TrainingCheckpoint& ckpt, const std::string& where,
                      const ResumeExpectation& expected) {
  for (const auto& [name, shape] : expected.parameters) {
    // (a structured binding cannot be captured in C++17: bind a reference to it)
    auto it = std::find_if(ckpt.weights.begin(), ckpt.weights.end(),
                           [&, &wanted = name](const NamedTensor& t) { return t.name == wanted; });
    DDP_CHECK(it != ckpt.weights.end(),
              where << ": has no tensor '" << name << "' (the model differs)");
    DDP_CHECK(it->shape == shape, where << ": tensor '" << name << "' has shape "
                                        << shape_string(it->shape) << ", the model's is "
                                        << shape_string(shape));
  }
  for (const NamedTensor& t : ckpt.weights) {
    const bool known = std::any_of(
        expected.parameters.begin(), expected.parameters.end(),
        [&](const std::pair<std::string, std::vector<int64_t>>& p) { return p.first == t.name; });
    DDP_CHECK(known, where << ": tensor '" << t.name << "' is not a parameter of the model");
  }
}

void check_config_lines(const TrainingCheckpoint& ckpt, const std::string& where,
                        const ResumeExpectation& expected) {
  const auto theirs = split_lines(ckpt.state.config), mine = split_lines(expected.config);
  const auto defaults = split_lines(expected.defaults);
  for (const std::string& line : mine) {
    auto it = std::find_if(theirs.begin(), theirs.end(),
                           [&](const std::string& t) { return key_of(t) == key_of(line); });
    // A key newer than the checkpoint: it ran as the key's default does.
    const bool is_default = std::find(defaults.begin(), defaults.end(), line) != defaults.end();
    if (it == theirs.end() && is_default) continue;
    DDP_CHECK(it != theirs.end(), where << ": " << key_of(line)
                                        << ": not recorded in the checkpoint (this run has "
                                        << value_of(line) << ")");
    DDP_CHECK(*it == line, where << ": " << key_of(line) << ": the checkpoint was written with "
                                 << value_of(*it) << ", this run has " << value_of(line)
                                 << " (resume with the same settings)");
  }
  for (const std::string& line : theirs) {
    const bool known = std::any_of(mine.begin(), mine.end(),
                                   [&](const std::string& m) { return key_of(m) == key_of(line); });
    DDP_CHECK(known, where << ": " << key_of(line) << ": set to " << value_of(line)
                           << " in the checkpoint, unknown to this run");
  }
}

void check_optimizer_state(const TrainingCheckpoint& ckpt, const std::string& where,
                           const ResumeExpectation& expected) {
  const auto& kept = expected.optimizer_state;
  for (const OptimizerState& state : ckpt.optimizer) {
    DDP_CHECK(std::find(kept.begin(), kept.end(), state.name) != kept.end(),
              where << ": holds optimizer state '" << state.name
                    << "', which this run's optimizer does not keep");
  }
  for (const std::string& name : kept) {
    const bool stored = std::any_of(ckpt.optimizer.begin(), ckpt.optimizer.end(),
                                    [&](const OptimizerState& o) { return o.name == name; });
    DDP_CHECK(stored || ckpt.state.optimizer_steps == 0,
              where << ": has no optimizer state '" << name << "', which this run's optimizer "
                    << "keeps (after " << ckpt.state.optimizer_steps << " updates)");
  }
}

}  // namespace

void check_resumable(const TrainingCheckpoint& ckpt, const std::string& path,
                     const ResumeExpectation& expected) {
  const std::string where = "checkpoint '" + path + "'";
  check_parameters(ckpt, where, expected);
  DDP_CHECK(ckpt.state.train_samples == expected.train_samples,
            where << ": was written for a training set of " << ckpt.state.train_samples
                  << " samples, this run's has " << expected.train_samples);
  // The config lines first: a different optimizer setting is named by its key.
  check_config_lines(ckpt, where, expected);
  check_optimizer_state(ckpt, where, expected);
}

}  // namespace ddp
