// Where this process sits in the job: rank, world size, local rank and node, all from MPI
// itself (MPI_Comm_split_type SHARED), so they are right under mpirun, srun and mpirun inside
// sbatch alike. Environment variables of the launcher are never trusted.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ddp/config.h"

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

/// The CPUs this process may run on: its affinity (a launcher may bind a rank to one core); 2
/// where the system cannot say.
int usable_cpus();

/// Collective over `comm`: this process's place in it. Also sets the rank ddp::Error reports.
Environment discover_environment(MPI_Comm comm);

/// Collective over `comm`: on every rank, one line per node "host: ranks 0-1 (2 local)".
std::vector<std::string> describe_layout(MPI_Comm comm, const Environment& env);

/// Which launcher started the job, read from its environment variables for the startup report
/// only (they are never used for rank or size: under mpirun inside sbatch the SLURM_* task
/// variables are stale). `getenv` is std::getenv in the program; `world` is MPI's size, and a
/// launcher variable that disagrees with it is pointed out.
std::string describe_launcher(const std::function<const char*(const char*)>& getenv, int world);

/// Where one rank computes and how its gradients travel.
struct DevicePlacement {
  Device device = Device::CPU;
  int gpu = -1;                                ///< CUDA ordinal when device is CUDA
  BackendChoice backend = BackendChoice::Mpi;  ///< distributed.backend resolved: Mpi or Nccl
  std::string describe() const;                ///< "cpu" or "cuda:1 (nccl)"
};

/// Pure: this rank's device and gradient backend from the config keys `device`, `backend` and
/// `gpus` (GPU per local rank; empty: local_rank % visible), the rank's place on its node and the
/// GPUs visible to it. Throws ddp::Error naming the key and the host when the request cannot be
/// met: device cuda with no visible GPU (why_none says why), a gpus entry beyond the visible GPUs,
/// a list shorter than the ranks on the node, NCCL with two ranks of a node on one GPU (NCCL
/// cannot; the mpi backend can).
DevicePlacement choose_device(DeviceChoice device, BackendChoice backend,
                              const std::vector<int64_t>& gpus, const Environment& env,
                              int visible_gpus, const std::string& why_none);

}  // namespace ddp
