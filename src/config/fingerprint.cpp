// Config lines for comparison (fingerprint.h), from the config's own YAML writer; the keys a
// resume must keep are the schema's (src/config/schema.h).
#include "config/fingerprint.h"

#include <yaml-cpp/yaml.h>

#include <set>

#include "config/schema.h"

namespace ddp {

namespace {

void flatten_yaml(const YAML::Node& node, const std::string& prefix,
                  std::vector<std::string>& out) {
  if (node.IsMap()) {
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      flatten_yaml(kv.second, prefix.empty() ? key : prefix + "." + key, out);
    }
    return;
  }
  YAML::Emitter emitter;
  emitter << YAML::Flow << node;
  out.push_back(prefix + " = " + emitter.c_str());
}

}  // namespace

std::vector<std::string> config_lines(const TrainConfig& cfg) {
  std::vector<std::string> lines;
  flatten_yaml(YAML::Load(to_yaml(cfg)), "", lines);
  return lines;
}

std::vector<std::string> shared_config_lines(const TrainConfig& cfg) {
  TrainConfig comparable = cfg;
  comparable.source.clear();
  comparable.output = OutputConfig{};
  return config_lines(comparable);
}

std::string resume_fingerprint(const TrainConfig& cfg) {
  std::set<std::string> keys;
  for (const KeyRow& row : config_schema()) {
    if (row.resume) keys.insert(row.path);
  }
  std::string out;
  for (const std::string& line : config_lines(cfg)) {
    if (keys.count(line.substr(0, line.find(" = ")))) out += line + "\n";
  }
  return out;
}

}  // namespace ddp
