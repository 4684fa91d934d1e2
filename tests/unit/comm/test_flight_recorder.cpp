// The flight recorder (src/comm/flight_recorder.h) and the lane recording into it: numbering in
// issue order, the ring, what "completed" means when collectives end out of order or fail, the
// step and bucket each collective is stamped with, and a timed-out collective kept as such.
#include <catch2/catch.hpp>

#include <thread>

#include "comm/flight_recorder.h"
#include "comm/mpi/lane.h"
#include "core/check.h"

using ddp::FlightRecorder;

namespace {

// The entries' states, oldest first: "completed,started,...".
std::string states(const nlohmann::json& record) {
  std::string s;
  for (const auto& e : record["entries"]) s += (s.empty() ? "" : ",") + e["state"].get<std::string>();
  return s;
}

}  // namespace

TEST_CASE("flight recorder: numbers collectives, keeps the last N, stamps step and bucket",
          "[flight]") {
  FlightRecorder rec(3);
  rec.set_step(7);
  CHECK(rec.issued("barrier", 0, "") == 1);
  rec.set_bucket(2);
  CHECK(rec.issued("allreduce of 10 floats", 40, "bf16") == 2);
  rec.set_bucket(-1);
  rec.set_step(8);
  CHECK(rec.issued("allreduce of 3 double(s)", 24, "float64") == 3);
  CHECK(rec.issued("broadcast of 8 bytes from rank 0", 8, "bytes") == 4);
  const nlohmann::json r = rec.snapshot();
  CHECK(r["issued"] == 4);
  CHECK(r["completed"] == 0);
  CHECK(r["capacity"] == 3);
  CHECK(r["step"] == 8);
  REQUIRE(r["entries"].size() == 3);  // #1 left the ring
  const auto& bucket = r["entries"][0];
  CHECK(bucket["seq"] == 2);
  CHECK(bucket["what"] == "allreduce of 10 floats");
  CHECK(bucket["bytes"] == 40);
  CHECK(bucket["wire"] == "bf16");
  CHECK(bucket["bucket"] == 2);
  CHECK(bucket["step"] == 7);
  CHECK(bucket["state"] == "queued");
  CHECK(bucket["enqueued"].is_number());
  CHECK(bucket["started"].is_null());
  CHECK(bucket["ended"].is_null());
  CHECK(r["entries"][1]["bucket"] == -1);
  CHECK(r["entries"][1]["step"] == 8);
  CHECK(r["entries"][2]["seq"] == 4);
}

TEST_CASE("flight recorder: completed counts up to the first collective not yet completed",
          "[flight]") {
  FlightRecorder rec(8);
  for (int i = 0; i < 5; ++i) rec.issued("c" + std::to_string(i + 1), 4, "float32");
  rec.started(2);
  rec.ended(2, true);  // out of order: #1 is still open
  CHECK(rec.completed_through() == 0);
  rec.ended(1, true);
  CHECK(rec.completed_through() == 2);
  rec.started(3);
  rec.ended(3, false);  // a failed collective did not complete
  rec.ended(4, true);
  CHECK(rec.completed_through() == 2);
  rec.started(5);
  rec.timed_out(5);
  rec.ended(5, false);  // the lane ends a timed-out collective with its error: still timed out
  CHECK(rec.saw_timeout());
  const nlohmann::json r = rec.snapshot();
  CHECK(states(r) == "completed,completed,failed,completed,timed_out");
  CHECK(r["entries"][1]["started"].is_number());
  CHECK(r["entries"][1]["ended"].is_number());
  CHECK(r["entries"][0]["started"].is_null());  // ended without a known start
  CHECK(rec.last_issued() == 5);
  rec.ended(99, true);  // never issued: ignored
  rec.ended(1, true);   // twice: ignored
  CHECK(rec.completed_through() == 2);
}

TEST_CASE("flight recorder: with no room it still counts", "[flight]") {
  FlightRecorder rec(0);
  rec.issued("a", 1, "");
  rec.issued("b", 1, "");
  rec.ended(1, true);
  const nlohmann::json r = rec.snapshot();
  CHECK(r["issued"] == 2);
  CHECK(r["completed"] == 1);
  CHECK(r["entries"].empty());
}

TEST_CASE("lane: records what it runs, in submission order, and a timed-out collective",
          "[flight][comm]") {
  auto rec = std::make_shared<FlightRecorder>(16);
  ddp::Lane lane;
  lane.set_timeout(0.3);
  lane.set_recorder(rec);
  rec->set_step(3);
  auto a = lane.submit({"allreduce of 3 double(s)", 24, "float64"}, [] {});
  auto b = lane.submit("barrier", [] { DDP_THROW("peer gone"); });
  a->wait();
  CHECK_THROWS(b->wait());
  auto c = lane.submit({"allreduce of 1 floats", 4, "float32"},
                       [&] { lane.wait_until([] { return false; }); });
  CHECK_THROWS_WITH(c->wait(), Catch::Contains("did not complete within 0.3 s"));
  CHECK(rec->saw_timeout());
  const nlohmann::json r = rec->snapshot();
  CHECK(r["issued"] == 3);
  CHECK(r["completed"] == 1);
  CHECK(states(r) == "completed,failed,timed_out");
  CHECK(r["entries"][0]["bytes"] == 24);
  CHECK(r["entries"][0]["wire"] == "float64");
  CHECK(r["entries"][0]["step"] == 3);
  CHECK(r["entries"][2]["started"].is_number());
  CHECK_FALSE(lane.stop_broken());
}

TEST_CASE("lane: a waiter's timeout marks the collective it waited for", "[flight][comm]") {
  auto rec = std::make_shared<FlightRecorder>(4);
  auto lane = std::make_unique<ddp::Lane>();
  lane->set_timeout(0.3);
  lane->set_recorder(rec);
  auto release = std::make_shared<std::atomic<bool>>(false);
  auto stuck = lane->submit("allreduce of 5 floats", [release] {
    while (!*release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }, nullptr, /*any_thread=*/false);
  CHECK_THROWS(stuck->wait());
  CHECK(rec->saw_timeout());
  CHECK(rec->snapshot()["entries"][0]["state"] == "timed_out");
  *release = true;
  CHECK_FALSE(lane->stop_broken());
  lane.reset();
  CHECK(rec->snapshot()["entries"][0]["state"] == "timed_out");  // its end keeps the verdict
}

// A replayed step graph's collectives name their bucket, not the one the reducer set; the
// device's collectives end when the probe, run by snapshot(), sees them end.
TEST_CASE("flight recorder: an explicit bucket, and the probe run before a snapshot", "[flight]") {
  FlightRecorder rec(8);
  rec.set_bucket(5);
  CHECK(rec.bucket() == 5);
  const uint64_t first = rec.issued("NCCL allreduce of 4 floats", 16, "float32", 0);
  const uint64_t second = rec.issued("NCCL allreduce of 8 floats", 32, "float32");
  int probes = 0;
  rec.set_probe([&] {
    ++probes;
    rec.ended(first, true);  // the device finished the first one only
  });
  nlohmann::json r = rec.snapshot();
  CHECK(probes == 1);
  CHECK(r["entries"][0]["bucket"] == 0);
  CHECK(r["entries"][1]["bucket"] == 5);
  CHECK(r["completed"] == first);
  CHECK(states(r) == "completed,queued");
  rec.set_probe(nullptr);
  rec.ended(second, true);
  r = rec.snapshot();
  CHECK(probes == 1);  // cleared: not called again
  CHECK(r["completed"] == second);
}
