// The flight log (src/train/flight_log.h): the record it writes carries the job's identity and
// the recorder's state; a folder it cannot write to costs the record, never the job's own error
// (write() returns "" and says why); a failure that was not a timeout writes "error" and
// returns at once, without waiting for other ranks' records; a stop request writes it once.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/clock.h"
#include "io/flight_analysis.h"
#include "train/flight_log.h"
#include "train/stop_request.h"

namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("ddp_flight_log_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

ddp::FlightLog::Identity identity(const fs::path& dir) {
  return ddp::FlightLog::Identity{dir.string(), "job-7", 1, 2, 30};
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("flight log: the record carries the job, the rank and the recorder's state", "[flight]") {
  const fs::path dir = fresh_dir("write");
  auto rec = std::make_shared<ddp::FlightRecorder>(8);
  rec->set_step(4);
  rec->ended(rec->issued("barrier", 0, ""), true);
  ddp::FlightLog log(rec, identity(dir));
  const std::string path = log.write("exit", "", /*reported=*/true);
  REQUIRE(path == ddp::flight_record_path(dir.string(), 1));
  const nlohmann::json r = read_json(path);
  CHECK(r["format"] == "ddp flight record");
  CHECK(r["run"] == "job-7");
  CHECK(r["rank"] == 1);
  CHECK(r["world_size"] == 2);
  CHECK(r["reason"] == "exit");
  CHECK(r["reported"] == true);
  CHECK_FALSE(r.contains("error"));
  CHECK(r["step"] == 4);
  CHECK(r["completed"] == 1);
  // The reader accepts what the writer writes.
  CHECK(ddp::read_flight_records(dir.string()).records.size() == 1);
  fs::remove_all(dir);
}

TEST_CASE("flight log: a file or a link in the folder's place costs the record, not the job",
          "[flight]") {
  auto rec = std::make_shared<ddp::FlightRecorder>(8);
  const fs::path dir = fresh_dir("blocked");
  std::ofstream(dir / "flight") << "not a folder";
  {
    ddp::FlightLog log(rec, identity(dir));
    CHECK(log.write("error", "boom").empty());
  }
  fs::remove(dir / "flight");
  const fs::path elsewhere = fresh_dir("elsewhere");
  fs::create_directory_symlink(elsewhere, dir / "flight");
  {
    ddp::FlightLog log(rec, identity(dir));
    CHECK(log.write("error", "boom").empty());
  }
  CHECK(fs::is_empty(elsewhere));  // nothing written through the planted link
  fs::remove_all(dir);
  fs::remove_all(elsewhere);
}

TEST_CASE("flight log: an error that is not a timeout is written at once, no analysis wait",
          "[flight]") {
  const fs::path dir = fresh_dir("error");
  auto rec = std::make_shared<ddp::FlightRecorder>(8);
  rec->issued("allreduce of 3 double(s)", 24, "float64");
  ddp::FlightLog log(rec, identity(dir));  // world of 2: rank 0's record never comes
  const double start = ddp::seconds_now();
  log.on_failure("rank 1: bad label 7");
  CHECK(ddp::seconds_now() - start < 5);  // a timeout would wait min(30, 10) s for rank 0
  const nlohmann::json r = read_json(ddp::flight_record_path(dir.string(), 1));
  CHECK(r["reason"] == "error");
  CHECK(r["error"] == "rank 1: bad label 7");
  CHECK(r["issued"] == 1);
  CHECK(r["completed"] == 0);
  CHECK_FALSE(fs::exists(ddp::flight_verdict_path(dir.string())));
  fs::remove_all(dir);
}

TEST_CASE("flight log: after a timeout the reporting rank keeps the verdict and marks its record",
          "[flight]") {
  const fs::path dir = fresh_dir("timeout");
  auto rec = std::make_shared<ddp::FlightRecorder>(8);
  const uint64_t seq = rec->issued("allreduce of 3 double(s)", 24, "float64");
  rec->timed_out(seq);
  ddp::FlightLog log(rec, ddp::FlightLog::Identity{dir.string(), "job-9", 0, 1, 30});
  log.on_failure("rank 0: allreduce of 3 double(s) did not complete within 30 s");
  int by = -1;
  const std::string verdict = ddp::read_flight_verdict(dir.string(), "job-9", &by);
  CHECK(by == 0);
  CHECK_THAT(verdict, Catch::Contains("collective #1 (allreduce of 3 double(s)"));
  CHECK(read_json(ddp::flight_record_path(dir.string(), 0))["reported"] == true);
  CHECK(ddp::read_flight_verdict(dir.string(), "another-job", &by).empty());
  fs::remove_all(dir);
}

// Rank 1 is not the reporter (rank 0 has a record), and rank 0 reports 2.5 s late (it timed out
// later): rank 1 must not return (and so end the job) before rank 0 has kept the verdict and
// returned itself — it waits for the verdict up to its grace (2 s) and five seconds more.
TEST_CASE("flight log: a rank that is not the reporter returns after the reporter", "[flight]") {
  const fs::path dir = fresh_dir("reporter");
  auto timed_out_recorder = [] {
    auto rec = std::make_shared<ddp::FlightRecorder>(8);
    rec->timed_out(rec->issued("allreduce of 243 floats", 972, "float32"));
    return rec;
  };
  ddp::FlightLog log0(timed_out_recorder(), ddp::FlightLog::Identity{dir.string(), "job-3", 0, 2, 2});
  ddp::FlightLog log1(timed_out_recorder(), ddp::FlightLog::Identity{dir.string(), "job-3", 1, 2, 2});
  REQUIRE_FALSE(log0.write("signal", "").empty());  // rank 0's record is there from the start
  double reporter_done = 0;
  std::thread reporter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    log0.on_failure("rank 0: allreduce of 243 floats did not complete within 2 s");
    reporter_done = ddp::seconds_now();
  });
  log1.on_failure("rank 1: allreduce of 243 floats did not complete within 2 s");
  const double other_done = ddp::seconds_now();
  reporter.join();
  int by = -1;
  CHECK_FALSE(ddp::read_flight_verdict(dir.string(), "job-3", &by).empty());
  CHECK(by == 0);
  CHECK(reporter_done > 0);
  CHECK(reporter_done < other_done);
  fs::remove_all(dir);
}

// Rank 1 times out after rank 0 began to report (its record says "reported"), and rank 0 keeps
// the verdict 1.5 s later: rank 1 must not return (and so end the job, the launcher killing the
// reporter mid-message) before rank 0 has returned. Under load it once did, at once.
TEST_CASE("flight log: a rank that times out after the reporter began waits for it too",
          "[flight]") {
  const fs::path dir = fresh_dir("late");
  auto timed_out_recorder = [] {
    auto rec = std::make_shared<ddp::FlightRecorder>(8);
    rec->timed_out(rec->issued("allreduce of 243 floats", 972, "float32"));
    return rec;
  };
  ddp::FlightLog log0(timed_out_recorder(), ddp::FlightLog::Identity{dir.string(), "job-4", 0, 2, 2});
  ddp::FlightLog log1(timed_out_recorder(), ddp::FlightLog::Identity{dir.string(), "job-4", 1, 2, 2});
  REQUIRE_FALSE(log0.write("timeout", "", /*reported=*/true).empty());
  double reporter_done = 0;
  std::thread reporter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    ddp::write_flight_verdict(dir.string(), "job-4", 0, "collective #1 did not complete");
    reporter_done = ddp::seconds_now();
  });
  log1.on_failure("rank 1: allreduce of 243 floats did not complete within 2 s");
  const double other_done = ddp::seconds_now();
  reporter.join();
  CHECK(reporter_done > 0);
  CHECK(reporter_done < other_done);
  fs::remove_all(dir);
}

// A stop request (the launcher's SIGTERM after a peer died) writes the record once, within the
// watcher's poll; a second request does not write it again.
TEST_CASE("flight log: the first stop request writes the record, quietly and once", "[flight]") {
  const fs::path dir = fresh_dir("stop");
  auto rec = std::make_shared<ddp::FlightRecorder>(8);
  rec->issued("allreduce of 243 floats", 972, "float32");
  ddp::clear_stop_request();
  ddp::FlightLog log(rec, identity(dir));
  const std::string path = ddp::flight_record_path(dir.string(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  CHECK_FALSE(fs::exists(path));  // no request, no record
  ddp::request_stop(SIGTERM);
  const double deadline = ddp::seconds_now() + 5;
  while (!fs::exists(path) && ddp::seconds_now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(fs::exists(path));
  const nlohmann::json r = read_json(path);
  CHECK(r["reason"] == "signal");
  CHECK(r["issued"] == 1);
  CHECK(r["completed"] == 0);
  fs::remove(path);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK_FALSE(fs::exists(path));  // written once
  ddp::clear_stop_request();
  fs::remove_all(dir);
}
