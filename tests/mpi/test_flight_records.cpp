// Flight records under mpiexec (src/comm/flight_recorder.h, src/train/flight_log.h): a run that
// writes them at exit leaves one per rank, and they agree — the same collective under every
// number on every rank, each step's buckets in plan order stamped with their index and step, all
// completed — which is what lets the hang analysis compare ranks number by number. And a rank
// that skips a bucket: its peers time out in the last bucket, and the verdict the lowest rank
// prints names it, with the number where the ranks' collectives first differ.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "comm/mpi/mpi_communicator.h"
#include "comm/reducer.h"
#include "core/check.h"
#include "ddp/trainer.h"
#include "io/flight_analysis.h"
#include "mpi_test_helpers.h"
#include "train/flight_log.h"

namespace {

// Every entry's (seq, what, bytes, wire, bucket, step), one line each: what must agree.
std::vector<std::string> agreed_fields(const nlohmann::json& record) {
  std::vector<std::string> lines;
  for (const auto& e : record["entries"])
    lines.push_back(e["seq"].dump() + " " + e["what"].get<std::string>() + " " +
                    e["bytes"].dump() + " " + e["wire"].get<std::string>() + " " +
                    e["bucket"].dump() + " " + e["step"].dump());
  return lines;
}

}  // namespace

TEST_CASE("flight records: every rank numbers the same collectives alike, buckets in plan order",
          "[flight]") {
  const std::string dir = ddp_test::shared_scratch_dir("ddp_flight_", "agree");
  ddp::TrainConfig cfg = ddp_test::small_training_config(dir);
  cfg.data.train.samples = 96;
  cfg.data.test.samples = 24;
  cfg.training.epochs = 2;
  cfg.training.batch_size = 8;
  cfg.training.log_every = 3;  // control collectives between the buckets
  cfg.output.flight_record_at_exit = true;
  cfg.output.flight_recorder = 100000;  // room for the whole run
  ddp::TrainSummary summary;
  ddp_test::train(cfg, MPI_COMM_WORLD, &summary);
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  long errors = 0;
  const ddp::FlightRecords records = ddp::read_flight_records(dir);
  errors += static_cast<int>(records.records.size()) != comm->size();
  errors += records.world_size != comm->size();
  const nlohmann::json& mine = records.records.at(static_cast<size_t>(comm->rank()));
  errors += mine["reason"] != "exit";
  errors += mine["issued"] != mine["completed"];  // nothing left open at the end
  errors += mine["entries"].size() != mine["issued"].get<size_t>();
  for (const nlohmann::json& other : records.records)
    errors += agreed_fields(other) != agreed_fields(mine);
  // The bucket collectives: per step, buckets 0..B-1 in order, of the plan's bytes; and the
  // steps 1..summary.steps each once.
  const auto plan = ddp::compute_bucket_plan({12 * 24, 24, 24 * 16, 16, 16 * 5, 5},
                                             100, 200);  // the parameters of small_training_config
  int64_t step = 0;
  size_t next = 0;
  for (const auto& e : mine["entries"]) {
    errors += e["state"] != "completed";
    const int64_t b = e["bucket"].get<int64_t>();
    if (b < 0) continue;
    if (static_cast<size_t>(b) == 0) {
      errors += next != 0 || e["step"].get<int64_t>() != step + 1;
      step = e["step"].get<int64_t>();
    }
    errors += static_cast<size_t>(b) != next;
    errors += e["bytes"].get<size_t>() != plan.buckets[next].numel * sizeof(float);
    next = (next + 1) % plan.buckets.size();
  }
  errors += step != summary.steps;
  INFO("rank " << comm->rank() << ": " << mine.dump().substr(0, 600));
  ddp_test::require_on_all_ranks(*comm, errors, "ranks whose flight records disagree");
  if (comm->rank() == 0) std::filesystem::remove_all(dir);
}

// The last rank queues buckets 0, 2 and 3 of a step, the others 0 to 3, all of one size: the
// first three pairs complete (the ranks' buckets mismatched from the second on), the others
// then time out in bucket 3, which the last rank never queues. Its peers' lanes are broken and
// their communicators leaked on purpose (a job would now end); the last rank leaks its own too,
// as the windows it would free collectively are its peers'. Only MPI_COMM_WORLD is used after.
TEST_CASE("flight records: a rank that skips a bucket is named by the hang analysis",
          "[flight][errors]") {
  const std::string dir = ddp_test::shared_scratch_dir("ddp_flight_", "skip");
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) {
    WARN("skipped: needs 2 ranks");
    return;
  }
  const int victim = size - 1;
  constexpr size_t kBucket = 100, kBuckets = 4;
  constexpr double kTimeout = 5.0;
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  auto recorder = std::make_shared<ddp::FlightRecorder>(64);
  comm->set_flight_recorder(recorder);
  comm->set_timeout(kTimeout);
  ddp::FlightLog log(recorder, {dir, "skip-job", rank, size, kTimeout});
  float* arena = comm->gradient_arena(kBucket * kBuckets, ddp::BucketWire{});
  recorder->set_step(1);
  std::vector<std::shared_ptr<ddp::Work>> works;
  for (size_t b = 0; b < kBuckets; ++b) {
    if (rank == victim && b == 1) continue;
    recorder->set_bucket(static_cast<int64_t>(b));
    works.push_back(comm->allreduce_async(arena + b * kBucket, kBucket, false));
    recorder->set_bucket(-1);
  }
  std::string error;
  try {
    for (const auto& w : works) w->synchronize();
  } catch (const ddp::Error& e) {
    error = e.what();
  }
  if (error.empty()) {
    log.write("exit", "");  // the last rank, done with its three
  } else {
    log.on_failure(error);  // the others: the lowest prints and keeps the verdict
  }
  works.clear();
  if (rank == victim) (void)comm.release();
  comm.reset();
  MPI_Barrier(MPI_COMM_WORLD);
  int reporter = -1;
  const std::string verdict = ddp::read_flight_verdict(dir, "skip-job", &reporter);
  const ddp::HangVerdict again = ddp::analyze_hang(ddp::read_flight_records(dir, "skip-job"));
  INFO("rank " << rank << ": " << error << "\nverdict by rank " << reporter << ":\n" << verdict);
  long errors = 0;
  errors += (rank == victim) != error.empty();  // only the others timed out
  errors += reporter != 0;
  errors += verdict != again.message;
  // The others' last bucket, after the setup's collectives.
  errors += again.stuck_seq != recorder->last_issued() + (rank == victim ? 1 : 0);
  errors += again.culprits != std::vector<int>{victim};
  errors += again.never_entered != std::vector<int>{victim};
  errors += verdict.find("culprit: rank " + std::to_string(victim)) == std::string::npos;
  // Where the collectives first differ: bucket 2 on the last rank, bucket 1 on the others.
  errors += verdict.find("bucket 2, step 1 (400 bytes) where rank 0's is allreduce of 100 "
                         "floats, bucket 1, step 1 (400 bytes)") == std::string::npos;
  CHECK(errors == 0);
  ddp_test::require_on_all_ranks(*ddp::make_mpi_communicator(MPI_COMM_WORLD), errors,
                                 "ranks whose hang verdict does not name the skipping rank");
  if (rank == 0) std::filesystem::remove_all(dir);
}

// The flight records and the trace tell the same story: every bucket collective the trace shows
// (its span on the communication track, args step) is in the rank's record under that step and
// bucket, of the plan's bytes, and their times agree — the durations and the gaps between the
// starts, to the microsecond (one clock behind both; the record's in unix seconds).
TEST_CASE("flight records: the buckets and their times agree with the trace", "[flight]") {
  const std::string dir = ddp_test::shared_scratch_dir("ddp_flight_", "trace");
  ddp::TrainConfig cfg = ddp_test::small_training_config(dir);
  cfg.data.train.samples = 64 * ddp_test::world_size();  // 8 steps
  cfg.training.epochs = 1;
  cfg.training.batch_size = 8;
  cfg.output.trace = true;
  cfg.output.trace_steps = 0;  // every step
  cfg.output.flight_record_at_exit = true;
  cfg.output.flight_recorder = 100000;
  ddp_test::train(cfg, MPI_COMM_WORLD);
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  comm->barrier();
  const ddp::FlightRecords records = ddp::read_flight_records(dir);
  const nlohmann::json& mine = records.records.at(static_cast<size_t>(comm->rank()));
  std::ifstream in(dir + "/trace.json");
  const nlohmann::json trace = nlohmann::json::parse(in);
  long errors = 0, spans = 0;
  double first_span = 0, first_entry = 0;
  for (const nlohmann::json& ev : trace["traceEvents"]) {
    const std::string name = ev.value("name", "");
    if (ev["pid"] != comm->rank() + 1 || name.rfind("allreduce bucket ", 0) != 0) continue;
    const int64_t bucket = std::stoll(name.substr(17));
    const int64_t step = static_cast<int64_t>(ev["args"]["step"].get<double>());
    const nlohmann::json* entry = nullptr;
    for (const nlohmann::json& e : mine["entries"])
      if (e["bucket"] == bucket && e["step"] == step) entry = &e;
    INFO("rank " << comm->rank() << ": span " << ev.dump() << ", entry "
                 << (entry ? entry->dump() : "none"));
    const bool found = entry != nullptr && (*entry)["state"] == "completed" &&
                       (*entry)["bytes"] == ev["args"]["floats"].get<double>() * sizeof(float);
    CHECK(found);
    errors += !found;
    if (!found) continue;
    const double started = (*entry)["started"], ended = (*entry)["ended"];
    const double span_begin = ev["ts"].get<double>() * 1e-6;
    const double span_end = span_begin + ev["dur"].get<double>() * 1e-6;
    if (spans++ == 0) {
      first_span = span_begin;
      first_entry = started;
    }
    const bool same_times = std::fabs((ended - started) - (span_end - span_begin)) < 2e-6 &&
                            std::fabs((started - first_entry) - (span_begin - first_span)) < 2e-6;
    CHECK(same_times);
    errors += !same_times;
  }
  errors += spans < 8 * 2;  // 8 steps of several buckets each
  INFO("rank " << comm->rank() << ": " << spans << " bucket spans");
  ddp_test::require_on_all_ranks(*comm, errors, "ranks whose flight record and trace disagree");
  comm->barrier();
  if (comm->rank() == 0) std::filesystem::remove_all(dir);
}
