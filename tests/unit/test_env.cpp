// describe_launcher: the startup report of which launcher started the job, from its
// environment variables, which are reported but never trusted over MPI's own numbers.
#include <catch2/catch.hpp>
#include <map>
#include <string>

#include "ddp/env.h"

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
