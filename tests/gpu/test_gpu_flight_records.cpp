// The flight records of GPU ranks (comm/flight_recorder.h): the NCCL buckets, which run on a
// device stream the host's communication lane never sees, are numbered among the control
// collectives in the order the training thread issued them, in eager steps as in steps
// replayed as CUDA graphs, the same on every rank; and a NCCL bucket that fails leaves the
// bucket as the collective that did not complete.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <set>
#include <string>

#include "comm/device_communicators.h"
#include "comm/lost_peer.h"
#include "comm/mpi/mpi_communicator.h"
#include "ddp/trainer.h"
#include "gpu_training_setup.h"
#include "io/flight_analysis.h"
#include "mpi_test_helpers.h"

#if defined(DDP_CUDA_EMULATION)
#include <memory>

#include "comm/flight_recorder.h"
#include "core/clock.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_api.h"
#include "nccl_emu.h"
#include "tests/deferred_streams.h"
#endif

namespace {

using ddp_gpu_test::gpu_per_rank;
using ddp_gpu_test::small_config;

// The small NCCL config writing its flight records to a folder every rank shares.
ddp::TrainConfig recorded_config(const std::string& name) {
  ddp::TrainConfig cfg = small_config(name, ddp::DeviceChoice::Cuda);
  cfg.distributed.backend = ddp::BackendChoice::Nccl;
  cfg.output.dir = ddp_test::shared_scratch_dir("ddp_gpu_test_", name);
  cfg.output.flight_recorder = 100000;  // every collective of the run
  return cfg;
}

// Whether an entry is one of the gradient buckets' NCCL allreduces.
bool nccl_bucket(const nlohmann::json& e) {
  return e["bucket"].get<int64_t>() >= 0 && e["what"].get<std::string>().rfind("NCCL ", 0) == 0;
}

// What is wrong with one rank's record of a run that ended well, after `steps` steps: every
// collective completed, and each step has each of the buckets of step 1 exactly once.
std::string bucket_problems(const nlohmann::json& record, int64_t steps) {
  const nlohmann::json& entries = record["entries"];
  if (record["issued"] != record["completed"] || record["issued"] != entries.size())
    return "not every collective completed, or not every one was kept";
  std::map<int64_t, std::multiset<int64_t>> buckets_of_step;
  for (const nlohmann::json& e : entries) {
    if (e["state"] != "completed") return "entry " + e.dump() + " did not complete";
    if (nccl_bucket(e))
      buckets_of_step[e["step"].get<int64_t>()].insert(e["bucket"].get<int64_t>());
  }
  const std::multiset<int64_t> first = buckets_of_step[1];
  if (first.size() < 2) return "step 1 has " + std::to_string(first.size()) + " NCCL buckets";
  for (int64_t step = 1; step <= steps; ++step) {
    if (buckets_of_step[step] != first)
      return "step " + std::to_string(step) + " has " +
             std::to_string(buckets_of_step[step].size()) + " NCCL buckets, step 1 " +
             std::to_string(first.size());
  }
  if (buckets_of_step.size() != static_cast<size_t>(steps))
    return "buckets outside steps 1.." + std::to_string(steps);
  return "";
}

// What is wrong with the times of a NCCL bucket the host waited for (an eager step's): the
// device's start and end (its events), after it was queued.
std::string time_problems(const nlohmann::json& record) {
  for (const nlohmann::json& e : record["entries"]) {
    if (!nccl_bucket(e)) continue;
    if (e["started"].is_null() || e["ended"].is_null()) return "entry " + e.dump() + " untimed";
    const double queued = e["enqueued"], started = e["started"], ended = e["ended"];
    if (!(queued <= started && started <= ended)) return "entry " + e.dump() + " out of order";
  }
  return "";
}

// Whether the ranks' records agree: the same collective (what, bucket, step) under each number.
bool ranks_agree(const ddp::FlightRecords& records) {
  for (const nlohmann::json& r : records.records) {
    const nlohmann::json& a = records.records.front()["entries"];
    const nlohmann::json& b = r["entries"];
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      for (const char* key : {"seq", "what", "bucket", "step"})
        if (a[i][key] != b[i][key]) return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("GPU training: the NCCL buckets are in the flight records, eager and as graphs",
          "[gpu][nccl][flight]") {
  if (!gpu_per_rank()) {
    WARN("skipped: NCCL needs one GPU per rank on this node");
    return;
  }
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  for (const bool graphs : {false, true}) {
    ddp::TrainConfig cfg = recorded_config(graphs ? "flight_graphs" : "flight_eager");
    cfg.training.cuda_graphs = graphs;
    cfg.output.flight_record_at_exit = true;
    ddp::TrainSummary summary;
    ddp_test::train(cfg, MPI_COMM_WORLD, &summary);
    comm->barrier();  // every rank's record is written
    const ddp::FlightRecords records = ddp::read_flight_records(cfg.output.dir);
    INFO((graphs ? "graphs" : "eager") << ", " << summary.steps << " steps, "
                                       << summary.graph_steps << " as graphs");
    REQUIRE(records.records.size() == static_cast<size_t>(comm->size()));
    long errors = 0;
    for (const nlohmann::json& record : records.records) {
      const std::string problem =
          bucket_problems(record, summary.steps) + (graphs ? "" : time_problems(record));
      INFO("rank " << record["rank"] << ": " << problem);
      CHECK(problem.empty());
      errors += !problem.empty();
    }
    CHECK(ranks_agree(records));
    errors += !ranks_agree(records);
    // Replayed steps ran no collective call on the host, yet their buckets are numbered.
    if (graphs) errors += summary.graph_steps < summary.steps / 2;
    ddp_test::require_on_all_ranks(*comm, errors, "ranks whose flight records lack buckets");
  }
}

#if defined(DDP_CUDA_EMULATION)
// The emulated NCCL fails rank 1's third allreduce (DDP_NCCL_EMU_FAIL, emu/nccl_emu.h); rank 0
// waits for it until the emulation's timeout. Both records must leave that bucket (step 1, the
// third bucket) as the first collective that did not complete, and the analysis must find it.
// Rank 0 lost its peer, which is what makes ddp-train exit 76 (a restart can help).
TEST_CASE("GPU training: a failed NCCL bucket is the one the flight records leave open",
          "[gpu][nccl][flight][errors]") {
  if (ddp_test::world_size() < 2 || !gpu_per_rank()) {
    WARN("skipped: needs 2 ranks with a GPU each");
    return;
  }
  // The emulation lets a stream run on past a failed collective (NCCL holds it until the
  // abort): had rank 1's device thread run the failed bucket before its host waited for it,
  // the wait would find the bucket's end event passed and blame the next bucket. Once in CI, on
  // a loaded machine, a step waited longer than the default 2 s device lag; at 30 s the failing
  // step stays on the host's watch, and the device thread still breaks a host-driven deadlock.
  const double lag_before = ddp_emu::device_lag();
  ddp_emu::set_device_lag(30.0);
  setenv("DDP_NCCL_EMU_FAIL", "1:3", 1);
  setenv("DDP_NCCL_EMU_TIMEOUT_S", "2", 1);
  const ddp::TrainConfig cfg = recorded_config("flight_fail");
  std::string message;
  try {
    ddp_test::train(cfg, MPI_COMM_WORLD);
  } catch (const std::exception& e) {
    message = e.what();
  }
  unsetenv("DDP_NCCL_EMU_FAIL");
  unsetenv("DDP_NCCL_EMU_TIMEOUT_S");
  ddp_emu::set_device_lag(lag_before);
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  comm->barrier();
  const ddp::FlightRecords records = ddp::read_flight_records(cfg.output.dir);
  const ddp::HangVerdict verdict = ddp::analyze_hang(records);
  INFO(message << "\n" << verdict.message);
  long errors = message.empty();
  errors += records.records.size() != static_cast<size_t>(comm->size());
  for (const nlohmann::json& record : records.records) {
    const uint64_t open = record["completed"].get<uint64_t>() + 1;
    const nlohmann::json* entry = nullptr;
    for (const nlohmann::json& e : record["entries"])
      if (e["seq"] == open) entry = &e;
    INFO("rank " << record["rank"] << ": first open collective " << open << ": "
                 << (entry ? entry->dump() : "none"));
    const bool third_bucket = entry != nullptr && nccl_bucket(*entry) && (*entry)["step"] == 1 &&
                              (*entry)["bucket"] == 2 && (*entry)["state"] != "completed";
    CHECK(third_bucket);
    errors += !third_bucket;
  }
  CHECK(verdict.stuck_seq > 0);
  errors += verdict.stuck_seq == 0;
  // Rank 0 lost its peer (NCCL's remote error): it would exit kExitPeerLost, which a launcher
  // restarts; rank 1's own failure is an error like any other.
  if (comm->rank() == 0) CHECK(ddp::collective_timed_out());
  errors += comm->rank() == 0 && !ddp::collective_timed_out();
  ddp_test::require_on_all_ranks(*comm, errors, "ranks whose records miss the failed bucket");
}

// NCCL never gives up on a peer: the host's wait does (the watchdog). Rank 0 queues an allreduce
// that rank 1 never posts, and its device (the emulation's device thread, at a lag of 0) runs
// it and waits there for the peer, as a GPU does; the emulation's own timeout (60 s) stands for
// NCCL's none. The host polls the end event, not ready, until distributed.timeout_s (1 s here),
// then aborts: the error names the collective and the timeout, the flight record leaves it
// timed out, and the abort frees the device. This test runs after the failed-bucket test above,
// whose peer-lost check it would otherwise satisfy in advance.
TEST_CASE("GPU: a NCCL collective its peer never joins is given up after the timeout, recorded",
          "[gpu][nccl][flight][errors]") {
  if (ddp_test::world_size() < 2 || !gpu_per_rank()) {
    WARN("skipped: needs 2 ranks with a GPU each");
    return;
  }
  auto mpi = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  ddp_emu_test::DeferredStreams deferred(/*lag=*/0.0);
  ddp::FlightRecorder recorder(16);
  auto backend = ddp::make_cuda_backend(mpi->local_rank() % ddp::cuda_device_count());
  auto comm = ddp_gpu_test::nccl_with_1s_timeout(*mpi, *backend);
  auto& numbered = dynamic_cast<ddp::CapturableCommunicator&>(*comm);
  numbered.set_flight_recorder(&recorder);
  float* arena = comm->gradient_arena(64, ddp::BucketWire{});
  long errors = 0;
  if (mpi->rank() == 0) {
    std::shared_ptr<ddp::Work> work = comm->allreduce_async(arena, 64, false);
    const bool on_device =
        ddp_test::within(30, [] { return ddp_nccl_emu::running_collectives() == 1; });
    const double start = ddp::seconds_now();
    std::string message;
    try {
      work->synchronize();
    } catch (const std::exception& e) {
      message = e.what();
    }
    const double seconds = ddp::seconds_now() - start;
    const nlohmann::json entry = recorder.snapshot()["entries"].back();
    const bool freed =
        ddp_test::within(10, [] { return ddp_nccl_emu::running_collectives() == 0; });
    INFO("the device ran it: " << on_device << "; the wait gave up after " << seconds
                               << " s: " << message << "\nits record: " << entry.dump()
                               << "\nthe abort freed the device: " << freed);
    errors += !on_device || !freed;
    errors += seconds < 0.9 || seconds > 10;  // its timeout, not the emulation's 60 s
    errors +=
        message.find("did not complete within 1 s (distributed.timeout_s)") == std::string::npos;
    errors += entry["state"] != "timed_out" || !recorder.saw_timeout();
    errors += !ddp::collective_timed_out();
    CHECK(errors == 0);
    (void)cudaGetLastError();  // the aborted collective's result, on the device thread's stream
  }
  ddp_test::require_on_all_ranks(*mpi, errors, "ranks whose NCCL wait did not give up in time");
  numbered.set_flight_recorder(nullptr);
  comm.reset();
}
#endif
