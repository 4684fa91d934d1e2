// describe_launcher: the startup report of which launcher started the job, from its
// environment variables, which are reported but never trusted over MPI's own numbers.
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "core/check.h"
#include "comm/environment.h"

namespace {

std::string launcher(const std::map<std::string, std::string>& vars, int world) {
  return ddp::describe_launcher(
      [&](const char* name) -> const char* {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
      },
      world);
}

}  // namespace

TEST_CASE("describe_launcher names srun, mpirun, mpirun inside a job, or none", "[env]") {
  CHECK(launcher({{"SLURM_JOB_ID", "12"},
                  {"SLURM_PROCID", "3"},
                  {"SLURM_JOB_NUM_NODES", "2"},
                  {"SLURM_STEP_NUM_TASKS", "4"}},
                 4) == "srun (Slurm job 12, 2 node(s)); ranks and nodes from MPI");
  CHECK(launcher({{"OMPI_COMM_WORLD_SIZE", "2"}}, 2) == "mpirun; ranks and nodes from MPI");
  // mpirun inside sbatch: the SLURM_* task variables describe the batch step, not the ranks.
  CHECK(launcher({{"OMPI_COMM_WORLD_SIZE", "4"},
                  {"SLURM_JOB_ID", "7"},
                  {"SLURM_PROCID", "0"},
                  {"SLURM_NTASKS", "1"}},
                 4) == "mpirun inside Slurm job 7; ranks and nodes from MPI");
  CHECK(launcher({{"PMIX_RANK", "0"}}, 1) == "a PMIx launcher; ranks and nodes from MPI");
  CHECK(launcher({}, 1) == "no launcher (a single process); ranks and nodes from MPI");
}

TEST_CASE("describe_launcher points out launcher variables that disagree with MPI", "[env]") {
  CHECK(launcher({{"SLURM_JOB_ID", "12"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}}, 4) ==
        "srun (Slurm job 12); ranks and nodes from MPI (the launcher's variables say 8 tasks, "
        "MPI says 4)");
}

namespace {

ddp::Environment on_node(int rank, int local_rank, int local_size) {
  ddp::Environment env;
  env.rank = rank;
  env.world = 8;
  env.local_rank = local_rank;
  env.local_size = local_size;
  env.host = "node7";
  return env;
}

std::string placement_error(ddp::DeviceChoice device, ddp::BackendChoice backend,
                            const std::vector<int64_t>& gpus, const ddp::Environment& env,
                            int visible) {
  try {
    ddp::choose_device(device, backend, gpus, env, visible, "no CUDA driver");
  } catch (const ddp::Error& e) {
    return e.message();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("choose_device: cpu, auto and cuda with the default GPU per local rank", "[env]") {
  const auto cpu = ddp::choose_device(ddp::DeviceChoice::Cpu, ddp::BackendChoice::Auto, {},
                                      on_node(3, 1, 2), 4, "");
  CHECK(cpu.device == ddp::Device::CPU);
  CHECK(cpu.backend == ddp::BackendChoice::Mpi);
  CHECK(cpu.describe() == "cpu");
  const auto fallback = ddp::choose_device(ddp::DeviceChoice::Auto, ddp::BackendChoice::Auto, {},
                                           on_node(3, 1, 2), 0, "no driver");
  CHECK(fallback.device == ddp::Device::CPU);
  CHECK(fallback.backend == ddp::BackendChoice::Mpi);
  for (int local = 0; local < 4; ++local) {
    const auto p = ddp::choose_device(ddp::DeviceChoice::Auto, ddp::BackendChoice::Auto, {},
                                      on_node(4 + local, local, 4), 4, "");
    CHECK(p.device == ddp::Device::CUDA);
    CHECK(p.gpu == local);
    CHECK(p.backend == ddp::BackendChoice::Nccl);
  }
  CHECK(ddp::choose_device(ddp::DeviceChoice::Cuda, ddp::BackendChoice::Nccl, {}, on_node(1, 1, 2),
                           2, "")
            .describe() == "cuda:1 (nccl)");
  // The host-staged MPI path may put several ranks on one GPU (testing on one card).
  const auto shared = ddp::choose_device(ddp::DeviceChoice::Cuda, ddp::BackendChoice::Mpi, {},
                                         on_node(3, 3, 4), 2, "");
  CHECK(shared.gpu == 1);
  CHECK(shared.backend == ddp::BackendChoice::Mpi);
}

TEST_CASE("choose_device: distributed.gpus picks the GPU of each local rank", "[env]") {
  CHECK(ddp::choose_device(ddp::DeviceChoice::Cuda, ddp::BackendChoice::Auto, {3, 1},
                           on_node(0, 0, 2), 4, "")
            .gpu == 3);
  CHECK(ddp::choose_device(ddp::DeviceChoice::Cuda, ddp::BackendChoice::Auto, {3, 1},
                           on_node(1, 1, 2), 4, "")
            .gpu == 1);
  CHECK(ddp::choose_device(ddp::DeviceChoice::Cuda, ddp::BackendChoice::Mpi, {0, 0},
                           on_node(1, 1, 2), 1, "")
            .gpu == 0);
}

TEST_CASE("choose_device: requests that cannot be met name the key and the host", "[env]") {
  CHECK(
      placement_error(ddp::DeviceChoice::Cuda, ddp::BackendChoice::Auto, {}, on_node(5, 1, 2), 0) ==
      "device: cuda, but rank 5 on node7 sees no GPU: no CUDA driver (device: auto falls back "
      "to the CPU)");
  CHECK(
      placement_error(ddp::DeviceChoice::Cpu, ddp::BackendChoice::Nccl, {}, on_node(5, 1, 2), 2) ==
      "distributed.backend: nccl needs GPUs, and rank 5 on node7 runs on the CPU (no CUDA "
      "driver)");
  CHECK(
      placement_error(ddp::DeviceChoice::Cuda, ddp::BackendChoice::Nccl, {}, on_node(2, 2, 4), 2) ==
      "4 ranks on node7 share 2 GPU(s) (local ranks 0 and 2 on GPU 0): NCCL needs one GPU per "
      "rank; start fewer ranks per node, or use distributed.backend: mpi to share GPUs for "
      "testing");
  CHECK(placement_error(ddp::DeviceChoice::Cuda, ddp::BackendChoice::Auto, {0, 0}, on_node(0, 0, 2),
                        2)
            .find("local ranks 0 and 1 on GPU 0") != std::string::npos);
  CHECK(placement_error(ddp::DeviceChoice::Cuda, ddp::BackendChoice::Auto, {0}, on_node(0, 0, 2),
                        2) ==
        "distributed.gpus lists 1 GPU(s), but 2 ranks run on node7 (one entry per rank)");
  CHECK(placement_error(ddp::DeviceChoice::Cuda, ddp::BackendChoice::Auto, {0, 2}, on_node(1, 1, 2),
                        2) == "distributed.gpus[1] is 2, but node7 shows 2 GPU(s) to rank 1");
}
