// docs/config.md documents exactly the keys the loader knows: every key of the effective config
// (for each data.format) has a row in its section's table, and every row is a key.
#include <catch2/catch.hpp>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "config/fingerprint.h"
#include "ddp/config.h"

namespace {

// "section.key" for every table row of docs/config.md, from the "### `section`" it stands
// under; the split table (data.train / data.test keys) counts for both splits.
std::set<std::string> documented_keys(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::set<std::string> keys;
  std::string section, line;
  bool split_table = false;
  const std::regex heading("^### (`([a-z_]+)`|Top level)");
  const std::regex row("^\\| `([a-z_]+)` +\\|");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, heading)) {
      section = m[2].matched ? m[2].str() + "." : "";
      split_table = false;
    } else if (line.rfind("Keys of `data.train` and `data.test`", 0) == 0) {
      split_table = true;
    } else if (line.rfind("## ", 0) == 0) {
      section.clear();
      split_table = false;
    } else if (std::regex_search(line, m, row) && (line.find("| key") == std::string::npos)) {
      if (split_table) {
        keys.insert("data.train." + m[1].str());
        keys.insert("data.test." + m[1].str());
      } else {
        keys.insert(section + m[1].str());
      }
    }
  }
  return keys;
}

std::set<std::string> loader_keys() {
  std::set<std::string> keys;
  for (const char* format : {"idx", "csv", "synthetic"}) {
    ddp::TrainConfig cfg;
    cfg.data.format = format;
    for (const std::string& line : ddp::config_lines(cfg))
      keys.insert(line.substr(0, line.find(" = ")));
  }
  return keys;
}

}  // namespace

TEST_CASE("docs/config.md lists exactly the config's keys", "[config]") {
  const std::set<std::string> docs =
      documented_keys(std::string(DDP_SOURCE_DIR) + "/docs/config.md");
  std::set<std::string> loader = loader_keys();
  // Sections that are maps have rows of their own ("train", "test": see the split table).
  loader.insert("data.train");
  loader.insert("data.test");
  for (const std::string& key : loader) {
    INFO("config key " << key << " has no row in docs/config.md");
    CHECK(docs.count(key) == 1);
  }
  for (const std::string& key : docs) {
    INFO("docs/config.md documents " << key << ", which the loader does not know");
    CHECK(loader.count(key) == 1);
  }
  CHECK(loader.size() > 40);  // the whole tree was walked
}
