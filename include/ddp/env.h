// Where this process sits in the job: rank, world size, local rank and node, all from MPI
// itself (MPI_Comm_split_type SHARED), so they are right under mpirun, srun and mpirun inside
// sbatch alike. Environment variables of the launcher are never trusted.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

namespace ddp {

struct Environment {
  int rank = 0;
  int world = 1;
  int local_rank = 0;  ///< rank among the processes sharing this node's memory
  int local_size = 1;
  std::string host;
};

/// Initialises MPI with thread support for the communication thread (throws ddp::Error if the
/// library cannot provide it) and finalises it on destruction.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
};

/// Collective over `comm`: this process's place in it. Also sets the rank ddp::Error reports.
Environment discover_environment(MPI_Comm comm);

/// Collective over `comm`: on every rank, one line per node "host: ranks 0-1 (2 local)".
std::vector<std::string> describe_layout(MPI_Comm comm, const Environment& env);

/// Which launcher started the job, read from its environment variables for the startup report
/// only (they are never used for rank or size: under mpirun inside sbatch the SLURM_* task
/// variables are stale). `getenv` is std::getenv in the program; `world` is MPI's size, and a
/// launcher variable that disagrees with it is pointed out.
std::string describe_launcher(const std::function<const char*(const char*)>& getenv, int world);

}  // namespace ddp
