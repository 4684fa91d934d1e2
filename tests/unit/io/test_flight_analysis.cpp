// Flight records (io/flight_analysis.h): the hang verdict on hand-made records (a rank that never
// entered the stuck collective, missing ranks, a desync, nothing pending, rings that no longer
// hold the collective) and every refusal of the reader, on files written into a temp folder.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "core/check.h"
#include "io/flight_analysis.h"
#include "temp_files.h"

namespace {

namespace fs = std::filesystem;
using Catch::Contains;
using Catch::StartsWith;
using ddp_test::TempDir;
using ddp_test::write_bytes;
using nlohmann::json;

// Collective `seq` as every rank issues it: its size and bucket follow from seq.
json entry(uint64_t seq, int64_t step, const std::string& state) {
  const bool done = state == "completed";
  return {{"seq", seq},
          {"what", "allreduce of " + std::to_string(seq * 10) + " floats"},
          {"bucket", static_cast<int64_t>(seq % 3)},
          {"bytes", seq * 40},
          {"wire", "float32"},
          {"step", step},
          {"state", state},
          {"enqueued", 1000.0 + static_cast<double>(seq)},
          {"started", done ? json(1000.25 + static_cast<double>(seq)) : json(nullptr)},
          {"ended", done ? json(1000.5 + static_cast<double>(seq)) : json(nullptr)}};
}

// A rank's record written at t = 2000 s: its ring holds the last `capacity` collectives it
// issued, those up to `completed` completed, the rest started.
json record(int rank, int world, uint64_t completed, uint64_t issued, int64_t step,
            uint64_t capacity = 8) {
  json entries = json::array();
  const uint64_t first = issued >= capacity ? issued - capacity + 1 : 1;
  for (uint64_t seq = first; seq <= issued && capacity > 0; ++seq)
    entries.push_back(entry(seq, step, seq <= completed ? "completed" : "started"));
  return {{"format", "ddp flight record"},
          {"version", 1},
          {"run", "20261204-201500-ab12cd"},
          {"rank", rank},
          {"world_size", world},
          {"host", "node-" + std::to_string(rank)},
          {"pid", 100 + rank},
          {"reason", "timeout"},
          {"written_at", 2000.0},
          {"step", step},
          {"issued", issued},
          {"completed", completed},
          {"capacity", capacity},
          {"entries", entries}};
}

ddp::FlightRecords records_of(int world, std::vector<json> records) {
  ddp::FlightRecords r;
  r.run = "20261204-201500-ab12cd";
  r.world_size = world;
  r.records = std::move(records);
  return r;
}

std::string first_line(const std::string& message) { return message.substr(0, message.find('\n')); }

// Writes each record to <dir>/flight/rank-<its rank>.json.
void write_records(const TempDir& dir, const std::vector<json>& records) {
  fs::create_directories(dir.path() / "flight");
  for (const auto& r : records)
    write_bytes(ddp::flight_record_path(dir.path().string(), r.at("rank").get<int>()), r.dump(2));
}

std::string rank_file(const TempDir& dir, int rank) {
  return ddp::flight_record_path(dir.path().string(), rank);
}

}  // namespace

TEST_CASE("ranks print compactly, runs of three or more as a range", "[flight]") {
  CHECK(ddp::compact_ranks({5, 0, 1, 2, 3}) == "0-3, 5");
  CHECK(ddp::compact_ranks({0, 2, 3}) == "0, 2, 3");
  CHECK(ddp::compact_ranks({7}) == "7");
  CHECK(ddp::compact_ranks({}).empty());
  CHECK(ddp::flight_record_path("runs/x", 3) == "runs/x/flight/rank-3.json");
}

TEST_CASE("a rank that never entered the stuck collective is named with what it did last",
          "[flight]") {
  // Rank 1's training thread is back in step 13 (its entries agree with the others').
  json behind = record(1, 4, 56, 56, 14);
  behind["step"] = 13;
  const auto v =
      ddp::analyze_hang(records_of(4, {record(0, 4, 56, 57, 14), behind,
                                       record(2, 4, 56, 57, 14), record(3, 4, 56, 57, 14)}));
  CHECK(v.stuck_seq == 57);
  CHECK(v.entered == std::vector<int>{0, 2, 3});
  CHECK(v.never_entered == std::vector<int>{1});
  CHECK(v.missing.empty());
  CHECK(v.culprits == std::vector<int>{1});
  CHECK(first_line(v.message) ==
        "collective #57 (allreduce of 570 floats, bucket 0, step 14) did not complete: ranks 0, "
        "2, 3 entered it, rank 1 never did.");
  CHECK_THAT(v.message, Contains("\nrank 1 (node-1, pid 101, record written on timeout) never "
                                 "issued #57\n  its last collective: #56 (allreduce of 560 "
                                 "floats), completed, ended 943.5 s before the record\n"));
  CHECK_THAT(v.message, Contains("rank 1 is behind: still in step 13 while the others wait in "
                                 "step 14"));
  CHECK_THAT(v.message, Contains("in #57: started on ranks 0, 2, 3"));
  CHECK_THAT(v.message, !Contains("left no flight record") && !Contains("different collectives"));
}

TEST_CASE("a never-entered rank in the same step is not called behind", "[flight]") {
  std::vector<json> records = {record(0, 2, 9, 10, 3), record(1, 2, 9, 9, 3)};
  const auto v = ddp::analyze_hang(records_of(2, records));
  CHECK(v.culprits == std::vector<int>{1});
  CHECK_THAT(v.message, Contains("  its training thread was in step 3") && !Contains("behind"));
  SECTION("an end time unknown: the time since it was issued; the rank's error") {
    records[1]["entries"].back()["ended"] = nullptr;
    records[1]["reason"] = "error";
    records[1]["error"] = "rank 1: CUDA error: an illegal memory access";
    const auto w = ddp::analyze_hang(records_of(2, records));
    CHECK_THAT(w.message, Contains("(node-1, pid 101, record written on error) never issued #10\n"
                                   "  its last collective: #9 (allreduce of 90 floats), "
                                   "completed, issued 991.0 s before the record\n"
                                   "  its error: rank 1: CUDA error: an illegal memory access\n"));
  }
}

TEST_CASE("a rank without a record is the culprit when every recorded rank entered", "[flight]") {
  const auto v =
      ddp::analyze_hang(records_of(3, {record(0, 3, 56, 57, 14), record(1, 3, 56, 57, 14)}));
  CHECK(v.stuck_seq == 57);
  CHECK(v.entered == std::vector<int>{0, 1});
  CHECK(v.never_entered.empty());
  CHECK(v.missing == std::vector<int>{2});
  CHECK(v.culprits == std::vector<int>{2});
  CHECK(first_line(v.message) ==
        "collective #57 (allreduce of 570 floats, bucket 0, step 14) did "
        "not complete: ranks 0, 1 entered it, rank 2 left no record.");
  CHECK_THAT(v.message, Contains("rank 2 left no flight record: it was stopped or killed, or it "
                                 "writes to an output.dir this rank cannot see"));
}

TEST_CASE("two ranks without a record are both named", "[flight]") {
  const auto v =
      ddp::analyze_hang(records_of(4, {record(0, 4, 20, 21, 5), record(3, 4, 20, 21, 5)}));
  CHECK(v.missing == std::vector<int>{1, 2});
  CHECK(v.culprits == std::vector<int>{1, 2});
  CHECK_THAT(v.message, Contains("ranks 1, 2 left no flight record: they were stopped or killed, "
                                 "or they write to an output.dir this rank cannot see"));
  // A rank that never entered outranks the missing ones as the culprit.
  const auto w =
      ddp::analyze_hang(records_of(6, {record(0, 6, 20, 21, 5), record(5, 6, 20, 20, 5)}));
  CHECK(w.missing == std::vector<int>{1, 2, 3, 4});
  CHECK(w.culprits == std::vector<int>{5});
  CHECK_THAT(w.message, Contains("ranks 1-4 left no flight record"));
}

TEST_CASE("ranks that issued different collectives at one seq are named", "[flight]") {
  std::vector<json> records = {record(0, 3, 56, 57, 14), record(1, 3, 56, 57, 14),
                               record(2, 3, 56, 57, 14)};
  auto& odd = records[2]["entries"][4];  // seq 54
  REQUIRE(odd["seq"] == 54);
  odd["what"] = "broadcast of 8 bytes";
  odd["bytes"] = 8;
  const auto v = ddp::analyze_hang(records_of(3, records));
  CHECK(v.stuck_seq == 57);
  CHECK(v.entered == std::vector<int>{0, 1, 2});
  CHECK(v.culprits == std::vector<int>{2});
  CHECK_THAT(v.message, Contains("rank 2's collective #54 is broadcast of 8 bytes, bucket 0, "
                                 "step 14 (8 bytes) where rank 0's is allreduce of 540 floats, "
                                 "bucket 0, step 14 (2160 bytes): the ranks issued different "
                                 "collectives"));
  CHECK_THAT(v.message, !Contains("transport"));
  SECTION("two ranks that disagree: the lower rank is the reference, bytes alone differ too") {
    records = {record(0, 2, 9, 10, 3), record(1, 2, 9, 10, 3)};
    records[1]["entries"][7]["bytes"] = 1;  // seq 10
    const auto w = ddp::analyze_hang(records_of(2, records));
    CHECK(w.culprits == std::vector<int>{1});
    CHECK_THAT(w.message, Contains("rank 1's collective #10 is allreduce of 100 floats, bucket 1, "
                                   "step 3 (1 bytes) where rank 0's is allreduce of 100 floats, "
                                   "bucket 1, step 3 (400 bytes)"));
  }
  SECTION("a skipped bucket: the same collective and size under another bucket is a desync") {
    records = {record(0, 3, 9, 10, 3), record(1, 3, 9, 10, 3), record(2, 3, 9, 10, 3)};
    records[2]["entries"][4]["bucket"] = 0;  // seq 7: bucket 0 where the others have 1
    const auto w = ddp::analyze_hang(records_of(3, records));
    CHECK(w.culprits == std::vector<int>{2});
    CHECK_THAT(w.message, Contains("rank 2's collective #7 is allreduce of 70 floats, bucket 0, "
                                   "step 3 (280 bytes) where rank 0's is allreduce of 70 floats, "
                                   "bucket 1, step 3 (280 bytes)"));
  }
}

TEST_CASE("every rank inside the collective and agreeing points at the transport", "[flight]") {
  const auto v =
      ddp::analyze_hang(records_of(2, {record(0, 2, 56, 58, 14), record(1, 2, 56, 57, 14)}));
  CHECK(v.stuck_seq == 57);
  CHECK(v.entered == std::vector<int>{0, 1});
  CHECK(v.culprits.empty());
  CHECK(first_line(v.message) ==
        "collective #57 (allreduce of 570 floats, bucket 0, step 14) did "
        "not complete: ranks 0, 1 entered it.");
  CHECK_THAT(v.message, Contains("every rank entered #57 and none completed it: the transport"));
}

TEST_CASE("nothing pending when every rank completed all it issued", "[flight]") {
  const auto v =
      ddp::analyze_hang(records_of(2, {record(0, 2, 57, 57, 15), record(1, 2, 57, 57, 15)}));
  CHECK(v.stuck_seq == 0);
  CHECK(v.entered.empty());
  CHECK(v.never_entered.empty());
  CHECK(v.culprits.empty());
  CHECK(v.message == "no collective was pending on any rank: every rank completed #57\n");
  SECTION("ranks idle at different seqs: the one behind never entered the next") {
    const auto w =
        ddp::analyze_hang(records_of(2, {record(0, 2, 57, 57, 15), record(1, 2, 55, 55, 15)}));
    CHECK(w.stuck_seq == 56);
    CHECK(w.never_entered == std::vector<int>{1});
    CHECK_THAT(first_line(w.message), Contains("rank 1 never entered it, rank 0 completed it."));
  }
}

TEST_CASE("a ring that moved past the stuck collective, and empty rings, are said so", "[flight]") {
  SECTION("rank 0 queued 300 more collectives than its ring holds") {
    const auto v = ddp::analyze_hang(
        records_of(2, {record(0, 2, 499, 800, 60, 256), record(1, 2, 499, 499, 59, 256)}));
    CHECK(v.stuck_seq == 500);
    CHECK(v.entered == std::vector<int>{0});
    CHECK(v.culprits == std::vector<int>{1});
    CHECK(first_line(v.message) ==
          "collective #500 (no ring holds it) did not complete: rank 0 "
          "entered it, rank 1 never did.");
    CHECK_THAT(v.message, Contains("rank 0's ring no longer holds #500 (it holds #545-#800): it "
                                   "moved 300 collectives past it"));
    CHECK_THAT(v.message, Contains("in #500: not in its ring on rank 0"));
  }
  SECTION("a ring a million collectives ahead: no ring holds the stuck one, none overlap") {
    const auto v =
        ddp::analyze_hang(records_of(2, {record(0, 2, 10, 1000000, 90), record(1, 2, 10, 10, 2)}));
    CHECK(v.stuck_seq == 11);
    CHECK(v.culprits == std::vector<int>{1});
    CHECK_THAT(v.message, Contains("rank 0's ring no longer holds #11 (it holds #999993-#1000000): "
                                   "it moved 999989 collectives past it"));
  }
  SECTION("capacity 0, and a rank that issued nothing yet") {
    const auto v = ddp::analyze_hang(records_of(
        3, {record(0, 3, 4, 5, 1, 0), record(1, 3, 4, 4, 1, 0), record(2, 3, 0, 0, 0, 0)}));
    CHECK(v.stuck_seq == 1);  // rank 2 has not completed #1: it never entered it
    CHECK(v.never_entered == std::vector<int>{2});
    CHECK(v.culprits == std::vector<int>{2});
    CHECK_THAT(v.message, Contains("rank 2 (node-2, pid 102, record written on timeout) never "
                                   "issued #1\n  it had issued no collective yet"));
    CHECK_THAT(v.message, Contains("ranks 0, 1 completed it."));
  }
  SECTION("an empty ring on the rank that never entered") {
    const auto v =
        ddp::analyze_hang(records_of(2, {record(0, 2, 4, 5, 1, 0), record(1, 2, 4, 4, 1, 0)}));
    CHECK(v.culprits == std::vector<int>{1});
    CHECK_THAT(v.message, Contains("never issued #5\n  it issued #4 last; its ring is empty "
                                   "(capacity 0)"));
    CHECK_THAT(v.message, Contains("rank 0's ring is empty (capacity 0), so it does not hold #5"));
  }
}

TEST_CASE("the records of a run are read ordered by rank and analysed", "[flight]") {
  TempDir dir;
  write_records(dir,
                {record(2, 3, 56, 57, 14), record(0, 3, 56, 57, 14), record(1, 3, 55, 55, 13)});
  write_bytes(dir.file("flight/rank-1.json.tmp"), "half a record");  // a writer's temporary file
  const auto records = ddp::read_flight_records(dir.path().string());
  CHECK(records.run == "20261204-201500-ab12cd");
  CHECK(records.world_size == 3);
  CHECK(records.notes.empty());
  REQUIRE(records.records.size() == 3);
  for (int r = 0; r < 3; ++r) CHECK(records.records[r]["rank"] == r);
  CHECK(ddp::analyze_hang(records).culprits == std::vector<int>{1});
}

TEST_CASE("records of two runs: the newest is read, the other noted, --run selects it",
          "[flight]") {
  TempDir dir;
  json old2 = record(2, 4, 10, 11, 2), old3 = record(3, 4, 10, 11, 2);
  for (json* r : {&old2, &old3}) {
    (*r)["run"] = "older";
    (*r)["written_at"] = 1500.0;
  }
  write_records(dir, {record(0, 2, 56, 57, 14), record(1, 2, 56, 56, 14), old2, old3});
  const auto newest = ddp::read_flight_records(dir.path().string());
  CHECK(newest.run == "20261204-201500-ab12cd");
  CHECK(newest.world_size == 2);
  CHECK(newest.records.size() == 2);
  CHECK(newest.notes ==
        std::vector<std::string>{
            "ignored 2 records of an earlier run, older (rank-2.json, rank-3.json)"});
  const auto older = ddp::read_flight_records(dir.path().string(), "older");
  CHECK(older.run == "older");
  CHECK(older.world_size == 4);
  REQUIRE(older.records.size() == 2);
  CHECK(older.records[0]["rank"] == 2);
  CHECK(older.notes ==
        std::vector<std::string>{"ignored 2 records of a later run, "
                                 "20261204-201500-ab12cd (rank-0.json, rank-1.json)"});
  CHECK(ddp::analyze_hang(older).missing == std::vector<int>{0, 1});
  CHECK_THROWS_WITH(
      ddp::read_flight_records(dir.path().string(), "other"),
      Contains("no flight record of run 'other' (it holds run 20261204-201500-ab12cd, "
               "older)"));
}

TEST_CASE("a folder without records is refused naming it", "[flight]") {
  TempDir dir;
  const std::string folder = dir.file("flight");
  CHECK_THROWS_WITH(ddp::read_flight_records(dir.path().string()),
                    Contains(folder + ": no flight record (cannot list the folder"));
  fs::create_directories(folder);
  write_bytes(dir.file("flight/notes.txt"), "not a record");
  CHECK_THROWS_WITH(ddp::read_flight_records(dir.path().string()),
                    Contains(folder + ": no flight record (no rank-<R>.json in it)"));
}

TEST_CASE("a record file that is not a valid record is refused naming the file", "[flight]") {
  TempDir dir;
  write_records(dir, {record(0, 2, 5, 5, 1)});
  const std::string path = rank_file(dir, 1);
  json r = record(1, 2, 5, 5, 1);
  std::string expected;
  SECTION("not JSON") {
    write_bytes(path, "{\"format\": \"ddp flight record\", ");
    expected = path + ": not JSON (";
  }
  SECTION("another format") {
    r["format"] = "chrome trace";
    expected = path + ": format 'chrome trace', not 'ddp flight record'";
  }
  SECTION("another version") {
    r["version"] = 2;
    expected = path + ": version 2 (this build reads version 1)";
  }
  SECTION("a missing field") {
    r.erase("issued");
    expected = path + ": missing field 'issued'";
  }
  SECTION("a field of the wrong type") {
    r["issued"] = "5";
    expected = path + ": field 'issued' is \"5\", expected a non-negative integer";
  }
  SECTION("a negative count") {
    r["completed"] = -1;
    expected = path + ": field 'completed' is -1, expected a non-negative integer";
  }
  SECTION("an entry's field of the wrong type") {
    r["entries"][2]["started"] = "soon";
    expected = path + ": entry 2: field 'started' is \"soon\", expected a number or null";
  }
  SECTION("an unknown state") {
    r["entries"][0]["state"] = "lost";
    expected = path + ": entry 0: state 'lost' is none of queued, started";
  }
  SECTION("entries not consecutive") {
    r["entries"].erase(3);
    expected = path + ": entry 3 has seq 5 after seq 3 (not consecutive)";
  }
  SECTION("more entries than the capacity") {
    r["capacity"] = 2;
    expected = path + ": 5 entries in a ring of capacity 2";
  }
  SECTION("completed beyond issued") {
    r["completed"] = 6;
    expected = path + ": completed 6 is beyond issued 5";
  }
  SECTION("not an object") {
    write_bytes(path, "[1, 2]");
    expected = path + ": a JSON array, not a flight record";
  }
  if (!fs::exists(path)) write_bytes(path, r.dump());
  CHECK_THROWS_WITH(ddp::read_flight_records(dir.path().string()), Contains(expected));
}

TEST_CASE("a link or a FIFO named like a record is refused, never followed or opened", "[flight]") {
  TempDir dir;
  write_records(dir, {record(0, 2, 5, 5, 1)});
  const std::string path = rank_file(dir, 1);
  std::string expected;
  SECTION("a symbolic link to a valid record") {
    write_bytes(dir.file("elsewhere.json"), record(1, 2, 5, 5, 1).dump());
    REQUIRE(::symlink(dir.file("elsewhere.json").c_str(), path.c_str()) == 0);
    expected = path + ": not a regular file (a symbolic link)";
  }
  SECTION("a FIFO without a writer (opening it for reading would block)") {
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    expected = path + ": not a regular file (a FIFO)";
  }
  SECTION("a directory") {
    fs::create_directories(path);
    expected = path + ": not a regular file (a directory)";
  }
  CHECK_THROWS_WITH(ddp::read_flight_records(dir.path().string()), Contains(expected));
}

TEST_CASE("a run's ranks must be distinct, below world_size, with one world_size", "[flight]") {
  TempDir dir;
  write_records(dir, {record(0, 4, 5, 5, 1)});
  std::string expected;
  SECTION("a rank twice") {
    write_bytes(rank_file(dir, 1), record(0, 4, 5, 5, 1).dump());
    expected = ": rank 0 again (" + rank_file(dir, 0) + " is rank 0 too)";
  }
  SECTION("a rank not below world_size") {
    write_bytes(rank_file(dir, 4), record(4, 4, 5, 5, 1).dump());
    expected = rank_file(dir, 4) + ": rank 4 is not below world_size 4";
  }
  SECTION("another world_size") {
    write_bytes(rank_file(dir, 1), record(1, 3, 5, 5, 1).dump());
    expected = rank_file(dir, 1) + ": world_size 3 where " + rank_file(dir, 0) + " has 4";
  }
  CHECK_THROWS_WITH(ddp::read_flight_records(dir.path().string()), Contains(expected));
}
