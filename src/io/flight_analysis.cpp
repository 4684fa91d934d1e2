// Flight records read and checked field by field, and the hang verdict (flight_analysis.h).
#include "io/flight_analysis.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <utility>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/input_file.h"

namespace ddp {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kFormat = "ddp flight record";
constexpr int64_t kVersion = 1;

// ---- reading ----------------------------------------------------------------------------------

enum class Kind { Text, Integer, Count, Number, NumberOrNull, Array };

bool is_count(const json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
}

bool has_kind(const json& v, Kind kind) {
  switch (kind) {
    case Kind::Text:
      return v.is_string();
    case Kind::Integer:
      return v.is_number_integer();
    case Kind::Count:
      return is_count(v);
    case Kind::Number:
      return v.is_number();
    case Kind::NumberOrNull:
      return v.is_number() || v.is_null();
    case Kind::Array:
      return v.is_array();
  }
  return false;
}

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::Text:
      return "a string";
    case Kind::Integer:
      return "an integer";
    case Kind::Count:
      return "a non-negative integer";
    case Kind::Number:
      return "a number";
    case Kind::NumberOrNull:
      return "a number or null";
    case Kind::Array:
      return "an array";
  }
  return "?";
}

// The value as it reads in the file, cut short: messages quote what is wrong.
std::string quote_value(const json& v) {
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

const json& require_field(const json& obj, const char* key, Kind kind, const std::string& where) {
  const auto it = obj.find(key);
  DDP_CHECK(it != obj.end(), where << ": missing field '" << key << "'");
  DDP_CHECK(has_kind(*it, kind), where << ": field '" << key << "' is " << quote_value(*it)
                                       << ", expected " << kind_name(kind));
  return *it;
}

bool is_one_of(const std::string& value, std::initializer_list<const char*> allowed) {
  return std::any_of(allowed.begin(), allowed.end(), [&](const char* a) { return value == a; });
}

void check_entry(const json& e, const std::string& where) {
  DDP_CHECK(e.is_object(), where << " is " << quote_value(e) << ", expected an object");
  require_field(e, "seq", Kind::Count, where);
  require_field(e, "what", Kind::Text, where);
  require_field(e, "bucket", Kind::Integer, where);
  require_field(e, "bytes", Kind::Count, where);
  require_field(e, "wire", Kind::Text, where);
  require_field(e, "step", Kind::Count, where);
  const auto state = require_field(e, "state", Kind::Text, where).get<std::string>();
  DDP_CHECK(is_one_of(state, {"queued", "started", "completed", "failed", "timed_out"}),
            where << ": state '" << state
                  << "' is none of queued, started, completed, failed, timed_out");
  require_field(e, "enqueued", Kind::Number, where);
  require_field(e, "started", Kind::NumberOrNull, where);
  require_field(e, "ended", Kind::NumberOrNull, where);
}

// Oldest first, consecutive seq, at most `capacity`, none issued after `issued`.
void check_entries(const json& r, const std::string& where) {
  const json& entries = require_field(r, "entries", Kind::Array, where);
  const uint64_t capacity = r.at("capacity").get<uint64_t>();
  DDP_CHECK(entries.size() <= capacity,
            where << ": " << entries.size() << " entries in a ring of capacity " << capacity);
  for (size_t i = 0; i < entries.size(); ++i) {
    check_entry(entries[i], where + ": entry " + std::to_string(i));
    const uint64_t seq = entries[i].at("seq").get<uint64_t>();
    if (i > 0) {
      const uint64_t previous = entries[i - 1].at("seq").get<uint64_t>();
      DDP_CHECK(seq == previous + 1, where << ": entry " << i << " has seq " << seq << " after seq "
                                           << previous << " (not consecutive)");
    }
  }
  if (entries.empty()) return;
  const uint64_t last = entries.back().at("seq").get<uint64_t>();
  const uint64_t issued = r.at("issued").get<uint64_t>();
  DDP_CHECK(last <= issued, where << ": entry of seq " << last << " but issued is " << issued);
}

void check_header(const json& r, const std::string& where) {
  DDP_CHECK(r.is_object(), where << ": a JSON " << r.type_name() << ", not a flight record");
  const auto format = require_field(r, "format", Kind::Text, where).get<std::string>();
  DDP_CHECK(format == kFormat, where << ": format '" << format << "', not '" << kFormat << "'");
  const int64_t version = require_field(r, "version", Kind::Integer, where).get<int64_t>();
  DDP_CHECK(version == kVersion,
            where << ": version " << version << " (this build reads version " << kVersion << ")");
  for (const char* key : {"run", "host", "reason"}) require_field(r, key, Kind::Text, where);
  const auto reason = r.at("reason").get<std::string>();
  DDP_CHECK(is_one_of(reason, {"timeout", "error", "signal", "exit"}),
            where << ": reason '" << reason << "' is none of timeout, error, signal, exit");
  if (r.contains("error")) require_field(r, "error", Kind::Text, where);
  require_field(r, "written_at", Kind::Number, where);
  for (const char* key : {"rank", "world_size", "pid", "step", "issued", "completed", "capacity"})
    require_field(r, key, Kind::Count, where);
  const int64_t rank = r.at("rank").get<int64_t>();
  const int64_t world = r.at("world_size").get<int64_t>();
  DDP_CHECK(world >= 1 && world <= (1 << 24), where << ": world_size " << world);
  DDP_CHECK(rank < world, where << ": rank " << rank << " is not below world_size " << world);
  const uint64_t issued = r.at("issued").get<uint64_t>();
  const uint64_t completed = r.at("completed").get<uint64_t>();
  DDP_CHECK(completed <= issued,
            where << ": completed " << completed << " is beyond issued " << issued);
}

// The whole file, refused unless it is a regular file: lstat first, so a link is never
// followed, then an open that cannot block on a FIFO, checked to be the file lstat saw.
std::string read_record_file(const std::string& path) {
  struct stat link {};
  DDP_CHECK(::lstat(path.c_str(), &link) == 0,
            path << ": cannot stat (" << std::strerror(errno) << ")");
  DDP_CHECK(!S_ISLNK(link.st_mode), path << ": not a regular file (a symbolic link)");
  DDP_CHECK(S_ISREG(link.st_mode),
            path << ": not a regular file (" << describe_file_type(link.st_mode) << ")");
  InputFile file(path, path);
  DDP_CHECK(file.status().st_ino == link.st_ino && file.status().st_dev == link.st_dev,
            path << ": replaced while being opened");
  std::string bytes;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(file.fd(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    DDP_CHECK(n >= 0, path << ": cannot read (" << std::strerror(errno) << ")");
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
  }
  return bytes;
}

json read_record(const std::string& path) {
  const std::string bytes = read_record_file(path);
  json record;
  try {
    record = json::parse(bytes);
  } catch (const json::parse_error& e) {
    DDP_THROW(path << ": not JSON (" << e.what() << ")");
  }
  check_header(record, path);
  check_entries(record, path);
  return record;
}

// rank-<digits>.json; everything else in the folder (a writer's temporary file) is not a record.
bool is_record_name(const std::string& name) {
  const std::string prefix = "rank-", suffix = ".json";
  if (name.size() <= prefix.size() + suffix.size() || name.size() > 24) return false;
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return false;
  const std::string digits =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  return std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

struct RecordFile {
  std::string path;
  json record;
};

std::vector<RecordFile> read_folder(const std::string& folder) {
  std::error_code ec;
  fs::directory_iterator it(folder, ec);
  DDP_CHECK(!ec, folder << ": no flight record (cannot list the folder: " << ec.message() << ")");
  std::vector<std::string> paths;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (is_record_name(it->path().filename().string())) paths.push_back(it->path().string());
  }
  DDP_CHECK(!ec, folder << ": cannot list the folder (" << ec.message() << ")");
  DDP_CHECK(!paths.empty(), folder << ": no flight record (no rank-<R>.json in it)");
  std::sort(paths.begin(), paths.end());
  std::vector<RecordFile> files;
  for (const auto& path : paths) files.push_back({path, read_record(path)});
  return files;
}

double newest_written(const std::vector<const RecordFile*>& files) {
  double newest = 0;
  for (const auto* f : files) newest = std::max(newest, f->record.at("written_at").get<double>());
  return newest;
}

std::string file_names(const std::vector<const RecordFile*>& files) {
  std::string names;
  for (const auto* f : files)
    names += (names.empty() ? "" : ", ") + fs::path(f->path).filename().string();
  return names;
}

// One world_size, every rank once; the records ordered by rank.
void take_run(const std::vector<const RecordFile*>& files, FlightRecords& out) {
  std::vector<const RecordFile*> by_rank = files;
  const auto rank_of = [](const RecordFile* f) { return f->record.at("rank").get<int>(); };
  std::stable_sort(by_rank.begin(), by_rank.end(), [&](const RecordFile* a, const RecordFile* b) {
    return rank_of(a) < rank_of(b);
  });
  const RecordFile& first = *by_rank.front();
  out.world_size = first.record.at("world_size").get<int>();
  for (size_t i = 0; i < by_rank.size(); ++i) {
    const RecordFile& f = *by_rank[i];
    const int world = f.record.at("world_size").get<int>();
    DDP_CHECK(world == out.world_size, f.path << ": world_size " << world << " where " << first.path
                                              << " has " << out.world_size);
    DDP_CHECK(i == 0 || rank_of(by_rank[i - 1]) != rank_of(&f),
              f.path << ": rank " << rank_of(&f) << " again (" << by_rank[i - 1]->path
                     << " is rank " << rank_of(&f) << " too)");
    out.records.push_back(f.record);
  }
}

}  // namespace

std::string flight_record_path(const std::string& output_dir, int rank) {
  return (fs::path(output_dir) / "flight" / ("rank-" + std::to_string(rank) + ".json")).string();
}

FlightRecords read_flight_records(const std::string& output_dir, const std::string& run) {
  const std::string folder = (fs::path(output_dir) / "flight").string();
  const std::vector<RecordFile> files = read_folder(folder);
  std::map<std::string, std::vector<const RecordFile*>> runs;
  for (const auto& f : files) runs[f.record.at("run").get<std::string>()].push_back(&f);
  FlightRecords out;
  out.run = run;
  if (run.empty()) {
    for (const auto& [name, of_run] : runs)
      if (out.run.empty() || newest_written(of_run) > newest_written(runs[out.run])) out.run = name;
  } else if (runs.count(run) == 0) {
    std::string found;
    for (const auto& [name, of_run] : runs) found += (found.empty() ? "" : ", ") + name;
    DDP_THROW(folder << ": no flight record of run '" << run << "' (it holds run " << found << ")");
  }
  for (const auto& [name, of_run] : runs) {
    if (name == out.run) continue;
    const bool earlier = newest_written(of_run) <= newest_written(runs[out.run]);
    out.notes.push_back("ignored " + std::to_string(of_run.size()) + " record" +
                        (of_run.size() == 1 ? "" : "s") + " of " +
                        (earlier ? "an earlier" : "a later") + " run, " + name + " (" +
                        file_names(of_run) + ")");
  }
  take_run(runs[out.run], out);
  return out;
}

// ---- the verdict ------------------------------------------------------------------------------

namespace {

// One rank's record as the analysis reads it.
struct RankView {
  int rank = 0;
  const json* record = nullptr;
  uint64_t issued = 0;
  uint64_t completed = 0;
  int64_t step = 0;
  const json* ring = nullptr;  // the entries, consecutive from first_seq
  uint64_t first_seq = 0;

  const json& entries() const { return *ring; }
  /// The ring's entry of `seq`, or nullptr when the ring does not hold it.
  const json* entry(uint64_t seq) const {
    if (seq < first_seq || seq - first_seq >= ring->size()) return nullptr;
    return &(*ring)[seq - first_seq];
  }
};

std::vector<RankView> views_of(const FlightRecords& records) {
  std::vector<RankView> views;
  for (const json& r : records.records) {
    RankView v;
    v.rank = r.at("rank").get<int>();
    v.record = &r;
    v.issued = r.at("issued").get<uint64_t>();
    v.completed = r.at("completed").get<uint64_t>();
    v.step = r.at("step").get<int64_t>();
    v.ring = &r.at("entries");
    if (!v.ring->empty()) v.first_seq = v.ring->front().at("seq").get<uint64_t>();
    views.push_back(v);
  }
  return views;
}

std::string ranks_phrase(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + compact_ranks(ranks);
}

std::string seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", s);
  return text;
}

// "allreduce of 1234 floats, bucket 1, step 14"
std::string describe_collective(const json& e) {
  const int64_t bucket = e.at("bucket").get<int64_t>();
  std::ostringstream out;
  out << e.at("what").get<std::string>() << ", ";
  if (bucket < 0) {
    out << "a control collective";
  } else {
    out << "bucket " << bucket;
  }
  out << ", step " << e.at("step").get<int64_t>();
  return out.str();
}

// The entry of `seq` in the ring of an entered rank if one holds it, else of any rank.
const json* find_entry(const std::vector<RankView>& views, uint64_t seq) {
  for (const auto& v : views)
    if (v.completed < seq && v.entry(seq) != nullptr) return v.entry(seq);
  for (const auto& v : views)
    if (v.entry(seq) != nullptr) return v.entry(seq);
  return nullptr;
}

struct Desync {
  uint64_t seq = 0;  // 0: the rings agree wherever two of them hold a seq
  std::vector<int> ranks;
  std::string line;
};

// What the ranks must agree on under one number: the collective, its size, and the step and
// bucket the training thread issued it for (a bucket skipped on one rank shifts the others
// under it, even where the buckets have one size).
std::string signature(const json& e) {
  return e.at("what").get<std::string>() + "\n" + std::to_string(e.at("bytes").get<uint64_t>()) +
         "\n" + std::to_string(e.at("bucket").get<int64_t>()) + "\n" +
         std::to_string(e.at("step").get<int64_t>());
}

// "allreduce of 100 floats, bucket 2, step 14 (400 bytes)"
std::string describe_with_bytes(const json& e) {
  return describe_collective(e) + " (" + std::to_string(e.at("bytes").get<uint64_t>()) + " bytes)";
}

// The ranks at `seq` whose collective differs from the majority's (ties: the lowest rank's).
Desync compare_at(const std::vector<RankView>& views, uint64_t seq) {
  std::vector<const RankView*> holders;
  std::map<std::string, int> count;
  for (const auto& v : views) {
    if (v.entry(seq) == nullptr) continue;
    holders.push_back(&v);
    ++count[signature(*v.entry(seq))];
  }
  const RankView* reference = nullptr;
  for (const auto* v : holders) {
    if (reference == nullptr ||
        count[signature(*v->entry(seq))] > count[signature(*reference->entry(seq))])
      reference = v;
  }
  Desync d;
  for (const auto* v : holders)
    if (signature(*v->entry(seq)) != signature(*reference->entry(seq))) d.ranks.push_back(v->rank);
  if (d.ranks.empty()) return d;
  d.seq = seq;
  const RankView& odd = *std::find_if(views.begin(), views.end(),
                                      [&](const RankView& v) { return v.rank == d.ranks.front(); });
  const json& x = *odd.entry(seq);
  const json& y = *reference->entry(seq);
  std::ostringstream line;
  line << "rank " << odd.rank << "'s collective #" << seq << " is " << describe_with_bytes(x)
       << " where rank " << reference->rank << "'s is " << describe_with_bytes(y)
       << ": the ranks issued different collectives";
  d.line = line.str();
  return d;
}

// The first seq that two rings hold with different collectives.
// Only seqs that two rings or more hold are compared: a rank far ahead of the others (a million
// collectives) costs its ring's length, not the gap.
Desync find_desync(const std::vector<RankView>& views) {
  std::map<uint64_t, int> holders;
  for (const auto& v : views)
    for (uint64_t i = 0; i < v.ring->size(); ++i) ++holders[v.first_seq + i];
  for (const auto& [seq, count] : holders) {
    if (count < 2) continue;
    Desync d = compare_at(views, seq);
    if (d.seq != 0) return d;
  }
  return {};
}

// "rank 1 (node-b, pid 7, record written on signal) never issued #57", then what it did last:
// "  its last collective: #55 (allreduce of 3 doubles), completed, ended 4.2 s before the record"
void describe_never_entered(const RankView& v, uint64_t stuck, std::vector<std::string>& lines) {
  const json& r = *v.record;
  std::ostringstream head, last_line;
  head << "rank " << v.rank << " (" << r.at("host").get<std::string>() << ", pid "
       << r.at("pid").get<int64_t>() << ", record written on " << r.at("reason").get<std::string>()
       << ") never issued #" << stuck;
  lines.push_back(head.str());
  const json& ring = v.entries();
  if (v.issued == 0) {
    last_line << "  it had issued no collective yet";
  } else if (ring.empty()) {
    last_line << "  it issued #" << v.issued << " last; its ring is empty (capacity "
              << r.at("capacity").get<uint64_t>() << ")";
  } else {
    const json& last = ring.back();
    const double written = r.at("written_at").get<double>();
    last_line << "  its last collective: #" << last.at("seq").get<uint64_t>() << " ("
              << last.at("what").get<std::string>() << "), " << last.at("state").get<std::string>()
              << ", ";
    if (!last.at("ended").is_null()) {
      last_line << "ended " << seconds(written - last.at("ended").get<double>());
    } else {
      last_line << "issued " << seconds(written - last.at("enqueued").get<double>());
    }
    last_line << " before the record";
  }
  lines.push_back(last_line.str());
  if (r.contains("error")) lines.push_back("  its error: " + r.at("error").get<std::string>());
}

// Whether the rank is behind the stuck collective's step, or where its training thread was.
std::string step_line(const RankView& v, int64_t stuck_step) {
  std::ostringstream line;
  if (stuck_step >= 0 && v.step < stuck_step) {
    line << "  rank " << v.rank << " is behind: still in step " << v.step
         << " while the others wait in step " << stuck_step;
  } else {
    line << "  its training thread was in step " << v.step;
  }
  return line.str();
}

// For a rank that issued `stuck` but whose ring does not hold it: why not.
std::string ring_gap_line(const RankView& v, uint64_t stuck) {
  const json& ring = v.entries();
  std::ostringstream line;
  line << "rank " << v.rank << "'s ring ";
  if (ring.empty()) {
    line << "is empty (capacity " << v.record->at("capacity").get<uint64_t>()
         << "), so it does not hold #" << stuck;
  } else {
    line << "no longer holds #" << stuck << " (it holds #" << ring.front().at("seq").get<uint64_t>()
         << "-#" << ring.back().at("seq").get<uint64_t>() << "): it moved " << v.issued - stuck
         << " collectives past it";
  }
  return line.str();
}

// "in #57: timed_out on ranks 0, 2; started on rank 3"
std::string states_line(const std::vector<RankView>& views, const std::vector<int>& entered,
                        uint64_t stuck) {
  std::map<std::string, std::vector<int>> by_state;
  for (const auto& v : views) {
    if (std::find(entered.begin(), entered.end(), v.rank) == entered.end()) continue;
    const json* e = v.entry(stuck);
    by_state[e ? e->at("state").get<std::string>() : "not in its ring"].push_back(v.rank);
  }
  std::string line = "in #" + std::to_string(stuck) + ":";
  const char* separator = " ";
  for (const auto& [state, ranks] : by_state) {
    line += separator + state + " on " + ranks_phrase(ranks);
    separator = "; ";
  }
  return line;
}

std::string missing_line(const std::vector<int>& missing) {
  const bool one = missing.size() == 1;
  return ranks_phrase(missing) +
         (one ? " left no flight record: it was"
              : " left no flight "
                "record: they were") +
         " stopped or killed, or " + (one ? "it writes" : "they write") +
         " to an output.dir this rank cannot see";
}

struct Split {
  std::vector<int> entered, never_entered, passed;  // passed: completed it already
};

Split split_at(const std::vector<RankView>& views, uint64_t stuck) {
  Split s;
  for (const auto& v : views) {
    if (v.completed >= stuck) {
      s.passed.push_back(v.rank);
    } else if (v.issued >= stuck) {
      s.entered.push_back(v.rank);
    } else {
      s.never_entered.push_back(v.rank);
    }
  }
  return s;
}

// "collective #57 (allreduce of 1234 floats, bucket 1, step 14) did not complete: ranks 0, 2, 3
// entered it, rank 1 never did."
std::string verdict_line(uint64_t stuck, const json* entry, const Split& s,
                         const std::vector<int>& missing) {
  std::ostringstream line;
  line << "collective #" << stuck << " ("
       << (entry ? describe_collective(*entry) : std::string("no ring holds it"))
       << ") did not complete: ";
  std::vector<std::string> clauses;
  if (!s.entered.empty()) clauses.push_back(ranks_phrase(s.entered) + " entered it");
  if (!s.never_entered.empty())
    clauses.push_back(ranks_phrase(s.never_entered) +
                      (s.entered.empty() ? " never entered it" : " never did"));
  if (!s.passed.empty()) clauses.push_back(ranks_phrase(s.passed) + " completed it");
  if (!missing.empty()) clauses.push_back(ranks_phrase(missing) + " left no record");
  for (size_t i = 0; i < clauses.size(); ++i) line << (i ? ", " : "") << clauses[i];
  line << ".";
  return line.str();
}

std::vector<int> missing_ranks(const std::vector<RankView>& views, int world_size) {
  std::vector<bool> seen(static_cast<size_t>(std::max(world_size, 0)), false);
  for (const auto& v : views)
    if (v.rank >= 0 && v.rank < world_size) seen[static_cast<size_t>(v.rank)] = true;
  std::vector<int> missing;
  for (int r = 0; r < world_size; ++r)
    if (!seen[static_cast<size_t>(r)]) missing.push_back(r);
  return missing;
}

bool nothing_pending(const std::vector<RankView>& views) {
  return std::all_of(views.begin(), views.end(), [&](const RankView& v) {
    return v.issued == v.completed && v.issued == views.front().issued;
  });
}

// The detail lines of a stuck collective: the ranks that never came, rings that lost it, the
// state inside it.
void explain_stuck(const std::vector<RankView>& views, const Split& s, uint64_t stuck,
                   const json* entry, std::vector<std::string>& lines) {
  const int64_t stuck_step = entry ? entry->at("step").get<int64_t>() : -1;
  for (const auto& v : views) {
    if (std::find(s.never_entered.begin(), s.never_entered.end(), v.rank) == s.never_entered.end())
      continue;
    describe_never_entered(v, stuck, lines);
    lines.push_back(step_line(v, stuck_step));
  }
  for (const auto& v : views)
    if (v.issued >= stuck && v.entry(stuck) == nullptr) lines.push_back(ring_gap_line(v, stuck));
  if (!s.entered.empty()) lines.push_back(states_line(views, s.entered, stuck));
}

}  // namespace

std::string compact_ranks(const std::vector<int>& ranks) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::string text;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    const std::string first = std::to_string(sorted[i]);
    text += (text.empty() ? "" : ", ");
    if (j - i >= 2) {
      text += first + "-" + std::to_string(sorted[j]);
    } else {
      text += first + (j > i ? ", " + std::to_string(sorted[j]) : "");
    }
    i = j + 1;
  }
  return text;
}

HangVerdict analyze_hang(const FlightRecords& records) {
  HangVerdict verdict;
  const std::vector<RankView> views = views_of(records);
  verdict.missing = missing_ranks(views, records.world_size);
  const Desync desync = find_desync(views);
  std::vector<std::string> lines;
  if (views.empty()) {
    lines.push_back("no flight record to analyse");
  } else if (nothing_pending(views)) {
    lines.push_back("no collective was pending on any rank: every rank completed #" +
                    std::to_string(views.front().issued));
  } else {
    uint64_t stuck = UINT64_MAX;
    for (const auto& v : views) stuck = std::min(stuck, v.completed + 1);
    const Split s = split_at(views, stuck);
    const json* entry = find_entry(views, stuck);
    verdict.stuck_seq = stuck;
    verdict.entered = s.entered;
    verdict.never_entered = s.never_entered;
    lines.push_back(verdict_line(stuck, entry, s, verdict.missing));
    explain_stuck(views, s, stuck, entry, lines);
    if (s.never_entered.empty() && verdict.missing.empty() && s.passed.empty() && desync.seq == 0)
      lines.push_back("every rank entered #" + std::to_string(stuck) +
                      " and none completed it: the transport (network, NCCL) stalled, or a rank "
                      "stopped inside it");
  }
  if (!verdict.missing.empty()) lines.push_back(missing_line(verdict.missing));
  if (desync.seq != 0) lines.push_back(desync.line);
  verdict.culprits = !verdict.never_entered.empty() ? verdict.never_entered
                     : !verdict.missing.empty()     ? verdict.missing
                                                    : desync.ranks;
  if (!verdict.culprits.empty())
    lines.push_back(std::string(verdict.culprits.size() == 1 ? "culprit: " : "culprits: ") +
                    ranks_phrase(verdict.culprits));
  for (const auto& line : lines) verdict.message += line + "\n";
  return verdict;
}

std::string flight_verdict_path(const std::string& output_dir) {
  return output_dir + "/flight/verdict.txt";
}

void write_flight_verdict(const std::string& output_dir, const std::string& run, int rank,
                          const std::string& message) {
  AtomicFile file(flight_verdict_path(output_dir), "hang verdict");
  file.write("run " + run + "\nby rank " + std::to_string(rank) + "\n" + message);
  file.commit();
}

std::string read_flight_verdict(const std::string& output_dir, const std::string& run,
                                int* rank) {
  const std::string path = flight_verdict_path(output_dir);
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return "";
  InputStream in = open_input_stream(path, "hang verdict " + path);
  std::string text;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), in.get())) > 0;) text.append(buffer, n);
  const std::string head = "run " + run + "\nby rank ";
  if (text.compare(0, head.size(), head) != 0) return "";
  const size_t end = text.find('\n', head.size());
  if (end == std::string::npos) return "";
  if (rank != nullptr) *rank = std::atoi(text.substr(head.size(), end - head.size()).c_str());
  return text.substr(end + 1);
}

}  // namespace ddp
