// docs/config.md documents exactly the schema's keys (src/config/schema.h): every key has a row in
// its section's table, and every row is a key. The schema is also what the loader reads and writes,
// and what ddp-train --list-config-keys prints.
#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "config/fingerprint.h"
#include "config/schema.h"
#include "ddp/config.h"

namespace {

// "section.key" for every table row of docs/config.md, from the "### `section`" it stands
// under, and the row; the split table (data.train / data.test keys) counts for both splits.
std::map<std::string, std::string> documented_rows(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::map<std::string, std::string> keys;
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
        keys["data.train." + m[1].str()] = line;
        keys["data.test." + m[1].str()] = line;
      } else {
        keys[section + m[1].str()] = line;
      }
    }
  }
  return keys;
}

std::set<std::string> documented_keys(const std::string& path) {
  std::set<std::string> keys;
  for (const auto& [key, row] : documented_rows(path)) keys.insert(key);
  return keys;
}

std::set<std::string> schema_keys() {
  std::set<std::string> keys;
  for (const ddp::KeyRow& row : ddp::config_schema()) keys.insert(row.path);
  return keys;
}

}  // namespace

TEST_CASE("docs/config.md lists exactly the config's keys", "[config]") {
  const std::set<std::string> docs =
      documented_keys(std::string(DDP_SOURCE_DIR) + "/docs/config.md");
  std::set<std::string> schema = schema_keys();
  // Sections that are maps have rows of their own ("train", "test": see the split table).
  schema.insert("data.train");
  schema.insert("data.test");
  for (const std::string& key : schema) {
    INFO("config key " << key << " has no row in docs/config.md");
    CHECK(docs.count(key) == 1);
  }
  for (const std::string& key : docs) {
    INFO("docs/config.md documents " << key << ", which the schema does not declare");
    CHECK(schema.count(key) == 1);
  }
  CHECK(schema.size() > 40);  // the whole tree was walked
}

// The range of a bounded key is the schema's, written the way --list-config-keys writes it.
TEST_CASE("docs/config.md gives each bounded key's range as the schema does", "[config]") {
  const std::map<std::string, std::string> docs =
      documented_rows(std::string(DDP_SOURCE_DIR) + "/docs/config.md");
  int bounded = 0;
  for (const ddp::KeyRow& row : ddp::config_schema()) {
    if (row.maximum.empty() || docs.count(row.path) == 0) continue;
    ++bounded;
    INFO(row.path << ": docs/config.md's row does not say '" << row.allowed << "':\n"
                  << docs.at(row.path));
    CHECK(docs.at(row.path).find(row.allowed) != std::string::npos);
  }
  CHECK(bounded > 20);
}

TEST_CASE("the schema declares exactly the keys the loader writes, for every data.format",
          "[config]") {
  std::set<std::string> written;
  for (const ddp::DataFormat format :
       {ddp::DataFormat::Idx, ddp::DataFormat::Csv, ddp::DataFormat::Synthetic,
        ddp::DataFormat::Npy}) {
    ddp::TrainConfig cfg;
    cfg.data.format = format;
    for (const std::string& line : ddp::config_lines(cfg))
      written.insert(line.substr(0, line.find(" = ")));
  }
  CHECK(written == schema_keys());
}

TEST_CASE("config_schema_table prints one row per schema key, in the schema's order", "[config]") {
  std::istringstream table(ddp::config_schema_table());
  std::string line;
  REQUIRE(std::getline(table, line));
  CHECK(line.rfind("key ", 0) == 0);
  const std::vector<ddp::KeyRow> rows = ddp::config_schema();
  size_t i = 0;
  for (; std::getline(table, line); ++i) {
    REQUIRE(i < rows.size());
    INFO(line);
    CHECK(line.substr(0, line.find(' ')) == rows[i].path);
    CHECK(line.find(rows[i].doc) != std::string::npos);
  }
  CHECK(i == rows.size());
  const std::string text = ddp::config_schema_table();
  CHECK(text.find("device ") != std::string::npos);
  CHECK(text.find("cpu, cuda, auto") != std::string::npos);
}

// The keys a checkpoint records and a resume must keep. A key added later is missing from older
// checkpoints, which resume only while this run keeps the key's default (check_resumable); a
// key removed would make every older checkpoint unresumable.
TEST_CASE("the resume fingerprint's key set is pinned", "[config]") {
  std::vector<std::string> keys;
  for (const ddp::KeyRow& row : ddp::config_schema()) {
    if (row.resume) keys.push_back(row.path);
  }
  CHECK(keys == std::vector<std::string>{"model.layers",
                                         "model.activation",
                                         "data.format",
                                         "data.train.samples",
                                         "data.shuffle",
                                         "data.drop_last",
                                         "data.csv_header",
                                         "data.seed",
                                         "data.normalize",
                                         "optimizer.name",
                                         "optimizer.lr",
                                         "optimizer.momentum",
                                         "optimizer.dampening",
                                         "optimizer.weight_decay",
                                         "optimizer.nesterov",
                                         "optimizer.betas",
                                         "optimizer.eps",
                                         "optimizer.amsgrad",
                                         "scheduler.name",
                                         "scheduler.warmup_steps",
                                         "scheduler.warmup_start_factor",
                                         "scheduler.min_lr",
                                         "scheduler.total_steps",
                                         "scheduler.step_size",
                                         "scheduler.gamma",
                                         "training.seed",
                                         "training.clip_grad_norm"});
}
