// Config lines for comparison (fingerprint.h), from the config's own YAML writer.
#include "config/fingerprint.h"

#include <yaml-cpp/yaml.h>

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
  static const std::vector<std::string> kKeys = {
      "model.layers",   "model.activation", "data.format", "data.train.samples", "data.shuffle",
      "data.drop_last", "data.csv_header",  "data.seed",   "optimizer.",         "training.seed"};
  std::string out;
  for (const std::string& line : config_lines(cfg)) {
    const std::string key = line.substr(0, line.find(" = "));
    for (const std::string& k : kKeys) {
      if (k.back() == '.' ? key.rfind(k, 0) == 0 : key == k) {
        out += line + "\n";
        break;
      }
    }
  }
  return out;
}

}  // namespace ddp
