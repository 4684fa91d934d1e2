// Flight records under mpiexec (src/comm/flight_recorder.h, src/train/flight_log.h): a run that
// writes them at exit leaves one per rank, and they agree — the same collective under every
// number on every rank, each step's buckets in plan order stamped with their index and step, all
// completed — which is what lets the hang analysis compare ranks number by number.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "comm/mpi/mpi_communicator.h"
#include "comm/reducer.h"
#include "ddp/trainer.h"
#include "io/flight_analysis.h"
#include "mpi_test_helpers.h"

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
