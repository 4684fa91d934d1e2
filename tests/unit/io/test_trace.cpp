// Tracer and write_trace_file: the Chrome trace events each call produces (fields, microseconds
// since the origin, metadata), escaping, thread safety, and the trace file and its error paths.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/check.h"
#include "io/trace.h"
#include "temp_files.h"

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

json events_of(const ddp::Tracer& tracer) {
  json events = json::parse(tracer.events_json());
  REQUIRE(events.is_array());
  return events;
}

std::vector<json> with_phase(const json& events, const std::string& ph) {
  std::vector<json> out;
  for (const auto& e : events) {
    if (e.at("ph") == ph) out.push_back(e);
  }
  return out;
}

// The metadata event `name` for (pid, tid); fails the test when there is not exactly one.
json metadata(const json& events, const std::string& name, int rank, int tid) {
  std::vector<json> found;
  for (const auto& e : events) {
    if (e.at("ph") == "M" && e.at("name") == name && e.at("pid") == rank + 1 && e.at("tid") == tid) {
      found.push_back(e);
    }
  }
  INFO(name << " rank " << rank << " tid " << tid);
  REQUIRE(found.size() == 1);
  return found[0];
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh directory under the system temp directory, removed at scope exit.
struct TempDir {
  TempDir() {
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    path = fs::temp_directory_path() / ("ddp_trace_test_" + std::to_string(stamp));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path path;
};

}  // namespace

TEST_CASE("a disabled tracer records nothing", "[trace]") {
  ddp::Tracer tracer;
  CHECK_FALSE(tracer.enabled());
  const int t = tracer.track("train thread");
  CHECK(t == -1);
  tracer.span(t, "step", 1.0, 2.0, {{"step", 1}});
  tracer.span(5, "unknown track is not checked when disabled", 1.0, 2.0);
  tracer.instant(t, "bucket 0 ready", 1.5);
  tracer.counter("samples/s", 1.5, 100.0);
  CHECK(tracer.event_count() == 0);
  CHECK(events_of(tracer).empty());
}

TEST_CASE("a tracer can be enabled after construction by moving one in", "[trace]") {
  ddp::Tracer tracer;
  CHECK(tracer.rank() == -1);
  ddp::Tracer enabled(4, "p", 0.0);
  const int t = enabled.track("train thread");
  enabled.span(t, "before move", 0.0, 1.0);
  tracer = std::move(enabled);
  REQUIRE(tracer.enabled());
  CHECK(tracer.rank() == 4);
  CHECK(tracer.track("train thread") == t);
  tracer.span(t, "after move", 1.0, 2.0);
  CHECK(tracer.event_count() == 2);
  CHECK(with_phase(events_of(tracer), "X").size() == 2);
  ddp::Tracer moved(std::move(tracer));
  CHECK(moved.event_count() == 2);
}

TEST_CASE("spans, instants and counters carry the format's fields in us since origin", "[trace]") {
  ddp::Tracer tracer(3, "ddp-train", 100.0);
  REQUIRE(tracer.enabled());
  const int train = tracer.track("train thread");
  const int comm = tracer.track("comm thread");
  tracer.span(comm, "allreduce bucket 1", 100.5, 100.75,
              {{"bytes", 4096}, {"bucket", 1}, {"op", "sum"}});
  tracer.instant(train, "bucket 1 ready", 101.0, {{"bucket", 1}});
  tracer.counter("samples/s", 102.000001, 1234.5);
  CHECK(tracer.event_count() == 3);

  const json events = events_of(tracer);
  const auto spans = with_phase(events, "X");
  REQUIRE(spans.size() == 1);
  const json& s = spans[0];
  CHECK(s.at("name") == "allreduce bucket 1");
  CHECK(s.at("pid") == 4);  // rank 3: pid 0 means something else to Perfetto
  CHECK(s.at("tid") == comm + 1);
  CHECK(s.at("ts").get<double>() == Approx(500000.0).margin(1e-6));
  CHECK(s.at("dur").get<double>() == Approx(250000.0).margin(1e-6));
  CHECK(s.at("args") == json({{"bytes", 4096.0}, {"bucket", 1.0}, {"op", "sum"}}));

  const auto instants = with_phase(events, "i");
  REQUIRE(instants.size() == 1);
  CHECK(instants[0].at("name") == "bucket 1 ready");
  CHECK(instants[0].at("s") == "t");
  CHECK(instants[0].at("pid") == 4);
  CHECK(instants[0].at("tid") == train + 1);
  CHECK(instants[0].at("ts").get<double>() == Approx(1e6).margin(1e-6));
  CHECK_FALSE(instants[0].contains("dur"));

  const auto counters = with_phase(events, "C");
  REQUIRE(counters.size() == 1);
  CHECK(counters[0].at("name") == "samples/s");
  CHECK(counters[0].at("pid") == 4);
  CHECK(counters[0].contains("tid"));
  CHECK(counters[0].at("ts").get<double>() == Approx(2000001.0).margin(1e-3));
  CHECK(counters[0].at("args") == json({{"value", 1234.5}}));
}

TEST_CASE("names and strings with quotes, backslashes and newlines round-trip", "[trace]") {
  const std::string odd = "say \"hi\"\\n\nback\\slash\ttab \x01 \xc3\xa9";
  ddp::Tracer tracer(0, "proc \"" + odd + "\"", 0.0);
  const int t = tracer.track(odd);
  tracer.span(t, odd, 1.0, 2.0, {{odd, odd}});
  tracer.instant(t, odd, 1.5);
  tracer.counter(odd, 1.5, 2.0);
  const json events = events_of(tracer);
  CHECK(metadata(events, "thread_name", 0, t + 1).at("args").at("name") == odd);
  CHECK(metadata(events, "process_name", 0, 0).at("args").at("name") ==
        "rank 0 (proc \"" + odd + "\")");
  const auto spans = with_phase(events, "X");
  REQUIRE(spans.size() == 1);
  CHECK(spans[0].at("name") == odd);
  CHECK(spans[0].at("args").at(odd) == odd);
  CHECK(with_phase(events, "i").at(0).at("name") == odd);
  CHECK(with_phase(events, "C").at(0).at("name") == odd);
}

TEST_CASE("invalid UTF-8 in a name is replaced instead of failing the trace", "[trace]") {
  ddp::Tracer tracer(0, "p", 0.0);
  const int t = tracer.track("bad \xff byte");
  tracer.span(t, "x\xfe", 0.0, 1.0);
  const json events = events_of(tracer);
  CHECK(with_phase(events, "X").size() == 1);
  CHECK(metadata(events, "thread_name", 0, t + 1).at("args").at("name") != "bad \xff byte");
}

TEST_CASE("track ids are stable per name and every track and the process get metadata", "[trace]") {
  ddp::Tracer tracer(2, "ddp-train", 0.0);
  const int a = tracer.track("train thread");
  const int b = tracer.track("comm thread");
  const int c = tracer.track("compute stream");
  CHECK(a == 0);
  CHECK(b == 1);
  CHECK(c == 2);
  CHECK(tracer.track("comm thread") == b);
  CHECK(tracer.track("train thread") == a);
  CHECK(tracer.event_count() == 0);

  const json events = events_of(tracer);
  CHECK(metadata(events, "process_name", 2, 0).at("args").at("name") == "rank 2 (ddp-train)");
  CHECK(metadata(events, "process_sort_index", 2, 0).at("args").at("sort_index") == 2);
  const std::vector<std::string> names = {"train thread", "comm thread", "compute stream"};
  int previous_sort = -1;
  for (int id = 0; id < 3; ++id) {
    CHECK(metadata(events, "thread_name", 2, id + 1).at("args").at("name") == names[id]);
    const int sort = metadata(events, "thread_sort_index", 2, id + 1).at("args").at("sort_index");
    CHECK(sort > previous_sort);  // creation order is display order
    previous_sort = sort;
  }
  CHECK(events.size() == 2 + 2 * 3);
}

TEST_CASE("recording from four threads at once loses nothing", "[trace]") {
  ddp::Tracer tracer(1, "p", 0.0);
  constexpr int kThreads = 4;
  constexpr int kPerThread = 10000;
  std::vector<int> tracks;
  for (int i = 0; i < kThreads; ++i) tracks.push_back(tracer.track("t" + std::to_string(i)));
  std::vector<std::thread> threads;
  std::atomic<int> waiting{kThreads};
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      // Start together, so the threads really do record at the same time.
      waiting.fetch_sub(1);
      while (waiting.load() > 0) std::this_thread::yield();
      // Threads also create (existing and new) tracks concurrently with recording.
      const int own = tracer.track("t" + std::to_string(i));
      const int extra = tracer.track("extra " + std::to_string(i % 2));
      for (int k = 0; k < kPerThread; ++k) {
        tracer.span(own, "s" + std::to_string(k), k, k + 0.5, {{"k", k}});
        if (k % 100 == 0) tracer.instant(extra, "mark", k);
        if (k % 500 == 0) tracer.counter("c" + std::to_string(i), k, k);
      }
    });
  }
  for (auto& t : threads) t.join();
  const size_t expected = kThreads * (kPerThread + kPerThread / 100 + kPerThread / 500);
  CHECK(tracer.event_count() == expected);

  const json events = events_of(tracer);
  std::set<std::pair<int, int>> seen;  // (tid, k) of every span
  for (const auto& e : with_phase(events, "X")) {
    seen.insert({e.at("tid").get<int>(), e.at("args").at("k").get<int>()});
  }
  CHECK(seen.size() == static_cast<size_t>(kThreads * kPerThread));
  CHECK(with_phase(events, "i").size() == kThreads * kPerThread / 100);
  CHECK(with_phase(events, "C").size() == kThreads * kPerThread / 500);
  // The two shared tracks were created once each, in whichever order the threads got there.
  CHECK(std::set<int>{tracer.track("extra 0"), tracer.track("extra 1")} ==
        std::set<int>{kThreads, kThreads + 1});
}

TEST_CASE("a span that ends before it begins gets zero duration", "[trace]") {
  ddp::Tracer tracer(0, "p", 10.0);
  const int t = tracer.track("train thread");
  tracer.span(t, "backwards", 12.0, 11.0);
  const auto spans = with_phase(events_of(tracer), "X");
  REQUIRE(spans.size() == 1);
  CHECK(spans[0].at("dur").get<double>() == 0.0);
  CHECK(spans[0].at("ts").get<double>() == Approx(2e6));
}

TEST_CASE("events come out in time order with a parent before a child that starts with it",
          "[trace]") {
  ddp::Tracer tracer(0, "p", 0.0);
  const int t = tracer.track("train thread");
  // A child finishes, and so is recorded, before its parent.
  tracer.span(t, "later", 5.0, 6.0);
  tracer.span(t, "child", 1.0, 2.0);
  tracer.span(t, "parent", 1.0, 3.0);
  const auto spans = with_phase(events_of(tracer), "X");
  REQUIRE(spans.size() == 3);
  CHECK(spans[0].at("name") == "parent");
  CHECK(spans[1].at("name") == "child");
  CHECK(spans[2].at("name") == "later");
}

TEST_CASE("times print as whole nanoseconds and ties made by rounding keep the parent first",
          "[trace]") {
  ddp::Tracer tracer(0, "p", 1000.0);
  const int t = tracer.track("train thread");
  // Apart by 0.3 ns, so the child starts first as recorded, but both print at ts 1 s.
  tracer.span(t, "child", 1001.0000000001, 1001.5);
  tracer.span(t, "parent", 1001.0000000004, 1002.0);
  tracer.span(t, "third", 1000.1234567894, 1000.2);
  const auto spans = with_phase(events_of(tracer), "X");
  REQUIRE(spans.size() == 3);
  CHECK(spans[0].at("name") == "third");
  CHECK(spans[0].at("ts").get<double>() == 123456.789);
  CHECK(spans[0].at("dur").get<double>() == 76543.211);
  CHECK(spans[1].at("name") == "parent");
  CHECK(spans[1].at("ts").get<double>() == 1e6);
  CHECK(spans[1].at("dur").get<double>() == 1e6);
  CHECK(spans[2].at("name") == "child");
  CHECK(spans[2].at("ts").get<double>() == 1e6);
  CHECK(spans[2].at("dur").get<double>() == 5e5);
}

TEST_CASE("whole-number args print as integers, others as numbers or text", "[trace]") {
  ddp::Tracer tracer(0, "p", 0.0);
  const int t = tracer.track("train thread");
  tracer.instant(t, "mark", 0.0,
                 {{"bucket", 2},
                  {"bytes", 123456789012LL},
                  {"lr", 0.5},
                  {"big", 1e300},
                  {"flag", true},
                  {"who", std::string("rank 0")}});
  const std::string text = tracer.events_json();
  CHECK_THAT(text, Catch::Contains("\"bucket\":2,") && Catch::Contains("\"bytes\":123456789012,") &&
                       Catch::Contains("\"lr\":0.5,") && Catch::Contains("\"flag\":1,") &&
                       Catch::Contains("\"who\":\"rank 0\""));
  CHECK(json::parse(text).back().at("args").at("big").get<double>() == 1e300);
}

TEST_CASE("misuse is reported: unknown track, non-finite time, negative rank", "[trace]") {
  ddp::Tracer tracer(0, "p", 0.0);
  const int t = tracer.track("train thread");
  CHECK_THROWS_WITH(tracer.span(t + 1, "s", 0.0, 1.0),
                    Catch::Contains("unknown track id 1") && Catch::Contains("'s'"));
  CHECK_THROWS_AS(tracer.span(-1, "s", 0.0, 1.0), ddp::Error);
  CHECK_THROWS_WITH(tracer.instant(7, "i", 0.0), Catch::Contains("unknown track id 7"));
  CHECK_THROWS_WITH(tracer.span(t, "nan begin", std::nan(""), 1.0),
                    Catch::Contains("nan begin") && Catch::Contains("not finite"));
  CHECK_THROWS_WITH(tracer.span(t, "inf end", 0.0, INFINITY), Catch::Contains("not finite"));
  CHECK_THROWS_WITH(tracer.instant(t, "i", NAN), Catch::Contains("not finite"));
  CHECK_THROWS_WITH(tracer.counter("c", NAN, 1.0), Catch::Contains("not finite"));
  CHECK(tracer.event_count() == 0);
  CHECK_THROWS_WITH(ddp::Tracer(-1, "p", 0.0), Catch::Contains("rank must be >= 0"));
  CHECK_THROWS_WITH(ddp::Tracer(0, "p", NAN), Catch::Contains("not finite"));
}

TEST_CASE("non-finite values: counter samples are skipped, arguments become text", "[trace]") {
  ddp::Tracer tracer(0, "p", 0.0);
  const int t = tracer.track("train thread");
  tracer.counter("loss", 1.0, NAN);
  tracer.counter("loss", 2.0, INFINITY);
  tracer.counter("loss", 3.0, 0.5);
  tracer.span(t, "step", 0.0, 1.0, {{"loss", NAN}, {"grad", -INFINITY}, {"lr", INFINITY}});
  CHECK(tracer.event_count() == 2);
  const json events = events_of(tracer);
  const auto counters = with_phase(events, "C");
  REQUIRE(counters.size() == 1);
  CHECK(counters[0].at("args").at("value") == 0.5);
  const json args = with_phase(events, "X").at(0).at("args");
  CHECK(args.at("loss") == "nan");
  CHECK(args.at("grad") == "-inf");
  CHECK(args.at("lr") == "inf");
}

TEST_CASE("write_trace_file joins the ranks into one parseable trace file", "[trace]") {
  TempDir dir;
  const fs::path path = dir.path / "trace.json";
  std::vector<std::string> ranks;
  for (int r = 0; r < 3; ++r) {
    ddp::Tracer tracer(r, "ddp-train", 50.0);
    const int t = tracer.track("train thread");
    tracer.span(t, "step 0", 50.0 + r, 51.0 + r);
    tracer.counter("samples/s", 51.0, 10.0 * r);
    ranks.push_back(tracer.events_json());
  }
  ranks.push_back(ddp::Tracer().events_json());  // a rank that did not trace: "[]"
  ddp::write_trace_file(path.string(), ranks, {{"world_size", "3"}, {"note", "a \"quoted\" note"}});
  CHECK(ddp_test::dir_entries(dir.path) == std::vector<std::string>{"trace.json"});

  const json trace = json::parse(read_file(path));
  CHECK(trace.at("displayTimeUnit") == "ms");
  CHECK(trace.at("otherData") == json({{"world_size", "3"}, {"note", "a \"quoted\" note"}}));
  const json& events = trace.at("traceEvents");
  REQUIRE(events.is_array());
  CHECK(events.size() == 3 * (2 + 2 + 2));
  for (int r = 0; r < 3; ++r) {
    CHECK(metadata(events, "process_name", r, 0).at("args").at("name") ==
          "rank " + std::to_string(r) + " (ddp-train)");
    int spans = 0;
    for (const auto& e : events) {
      if (e.at("ph") == "X" && e.at("pid") == r + 1) {
        ++spans;
        CHECK(e.at("ts").get<double>() == Approx(1e6 * r));
      }
    }
    CHECK(spans == 1);
  }

  // Writing again replaces the file; no ranks at all is still a valid trace.
  ddp::write_trace_file(path.string(), {}, {});
  const json empty = json::parse(read_file(path));
  CHECK(empty.at("traceEvents").empty());
  CHECK(empty.at("otherData").empty());
}

TEST_CASE("write_trace_file failures throw naming the path and leave no temp file", "[trace]") {
  // The temporary file and the full disk are the file writer's
  // (tests/unit/core/test_atomic_file.cpp).
  TempDir dir;
  SECTION("missing directory") {
    const std::string path = (dir.path / "no_such_dir" / "trace.json").string();
    CHECK_THROWS_WITH(ddp::write_trace_file(path, {"[]"}, {}),
                      Catch::Contains("cannot save trace file '" + path + "'") &&
                          Catch::Contains("No such file or directory"));
  }
  SECTION("the target is a directory, so the rename fails") {
    const fs::path path = dir.path / "occupied";
    fs::create_directories(path / "child");
    CHECK_THROWS_WITH(ddp::write_trace_file(path.string(), {"[]"}, {}),
                      Catch::Contains("cannot save trace file '" + path.string() + "'"));
    CHECK(ddp_test::dir_entries(dir.path) == std::vector<std::string>{"occupied"});
    CHECK(fs::is_directory(path / "child"));
  }
  SECTION("a rank's text is not a JSON array") {
    const std::string path = (dir.path / "trace.json").string();
    CHECK_THROWS_WITH(ddp::write_trace_file(path, {"[]", "{\"a\":1}"}, {}),
                      Catch::Contains(path) && Catch::Contains("rank 1 are not a JSON array"));
    CHECK_THROWS_WITH(ddp::write_trace_file(path, {""}, {}), Catch::Contains("rank 0"));
    CHECK_FALSE(fs::exists(path));
  }
}
