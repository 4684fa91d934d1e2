// MPI session, rank discovery and device placement (environment.h).
#include "comm/environment.h"

#include <sched.h>
#include <unistd.h>

#include <map>
#include <sstream>

#include "core/check.h"

namespace ddp {

int usable_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
#endif
  return 2;
}

MpiSession::MpiSession(int* argc, char*** argv) {
  int provided = 0;
  DDP_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided));
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    DDP_THROW("the MPI library provides thread level "
              << provided << " but MPI_THREAD_SERIALIZED is needed for the communication thread");
  }
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

Environment discover_environment(MPI_Comm comm) {
  Environment env;
  DDP_MPI_CHECK(MPI_Comm_rank(comm, &env.rank));
  DDP_MPI_CHECK(MPI_Comm_size(comm, &env.world));
  set_error_rank(env.rank);
  MPI_Comm local = MPI_COMM_NULL;
  DDP_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, env.rank, MPI_INFO_NULL, &local));
  DDP_MPI_CHECK(MPI_Comm_rank(local, &env.local_rank));
  DDP_MPI_CHECK(MPI_Comm_size(local, &env.local_size));
  MPI_Comm_free(&local);
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  DDP_MPI_CHECK(MPI_Get_processor_name(name, &len));
  env.host.assign(name, static_cast<size_t>(len));
  return env;
}

std::vector<std::string> describe_layout(MPI_Comm comm, const Environment& env) {
  char mine[MPI_MAX_PROCESSOR_NAME] = {};
  env.host.copy(mine, sizeof(mine) - 1);
  std::vector<char> all(static_cast<size_t>(env.world) * MPI_MAX_PROCESSOR_NAME);
  DDP_MPI_CHECK(MPI_Allgather(mine, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(),
                              MPI_MAX_PROCESSOR_NAME, MPI_CHAR, comm));
  std::map<std::string, std::vector<int>> by_host;
  std::vector<std::string> order;
  for (int r = 0; r < env.world; ++r) {
    std::string host(&all[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME]);
    if (!by_host.count(host)) order.push_back(host);
    by_host[host].push_back(r);
  }
  std::vector<std::string> lines;
  for (const auto& host : order) {
    std::ostringstream oss;
    oss << host << ": ranks";
    for (int r : by_host[host]) oss << ' ' << r;
    lines.push_back(oss.str());
  }
  return lines;
}

std::string describe_launcher(const std::function<const char*(const char*)>& getenv, int world) {
  auto var = [&](const char* name) -> std::string {
    const char* v = getenv(name);
    return v != nullptr ? std::string(v) : std::string();
  };
  const std::string job = var("SLURM_JOB_ID");
  const std::string ompi_size = var("OMPI_COMM_WORLD_SIZE");
  const std::string slurm_tasks =
      var("SLURM_STEP_NUM_TASKS").empty() ? var("SLURM_NTASKS") : var("SLURM_STEP_NUM_TASKS");
  std::ostringstream oss;
  std::string claimed;
  if (!ompi_size.empty()) {
    oss << "mpirun";
    if (!job.empty()) oss << " inside Slurm job " << job;
    claimed = ompi_size;
  } else if (!job.empty() && !var("SLURM_PROCID").empty()) {
    oss << "srun (Slurm job " << job;
    if (!var("SLURM_JOB_NUM_NODES").empty())
      oss << ", " << var("SLURM_JOB_NUM_NODES") << " node(s)";
    oss << ")";
    claimed = slurm_tasks;
  } else if (!var("PMIX_RANK").empty()) {
    oss << "a PMIx launcher";
  } else {
    oss << "no launcher (a single process)";
  }
  oss << "; ranks and nodes from MPI";
  if (!claimed.empty() && claimed != std::to_string(world))
    oss << " (the launcher's variables say " << claimed << " tasks, MPI says " << world << ")";
  return oss.str();
}

std::string DevicePlacement::describe() const {
  if (device == Device::CPU) return "cpu";
  return "cuda:" + std::to_string(gpu) + " (" + to_string(backend) + ")";
}

DevicePlacement choose_device(DeviceChoice device, BackendChoice backend,
                              const std::vector<int64_t>& gpus, const Environment& env,
                              int visible_gpus, const std::string& why_none) {
  DevicePlacement p;
  const bool want_cuda =
      device == DeviceChoice::Cuda || (device == DeviceChoice::Auto && visible_gpus > 0);
  if (!want_cuda) {
    DDP_CHECK(backend != BackendChoice::Nccl,
              "distributed.backend: nccl needs GPUs, and rank "
                  << env.rank << " on " << env.host << " runs on the CPU ("
                  << (why_none.empty() ? "device: cpu" : why_none) << ")");
    p.backend = BackendChoice::Mpi;
    return p;
  }
  DDP_CHECK(visible_gpus > 0, "device: cuda, but rank " << env.rank << " on " << env.host
                                                        << " sees no GPU: " << why_none
                                                        << " (device: auto falls back to the CPU)");
  p.device = Device::CUDA;
  p.backend = backend == BackendChoice::Auto ? BackendChoice::Nccl : backend;
  // The GPU of every local rank, so that sharing can be detected the same way on every rank.
  std::vector<int64_t> of_local(static_cast<size_t>(env.local_size));
  for (int l = 0; l < env.local_size; ++l) {
    const auto i = static_cast<size_t>(l);
    if (gpus.empty()) {
      of_local[i] = l % visible_gpus;
      continue;
    }
    DDP_CHECK(i < gpus.size(), "distributed.gpus lists " << gpus.size() << " GPU(s), but "
                                                         << env.local_size << " ranks run on "
                                                         << env.host << " (one entry per rank)");
    DDP_CHECK(gpus[i] < visible_gpus, "distributed.gpus[" << i << "] is " << gpus[i] << ", but "
                                                          << env.host << " shows " << visible_gpus
                                                          << " GPU(s) to rank " << env.rank);
    of_local[i] = gpus[i];
  }
  p.gpu = static_cast<int>(of_local[static_cast<size_t>(env.local_rank)]);
  if (p.backend == BackendChoice::Nccl) {
    for (size_t a = 0; a < of_local.size(); ++a) {
      for (size_t b = a + 1; b < of_local.size(); ++b) {
        DDP_CHECK(of_local[a] != of_local[b],
                  env.local_size << " ranks on " << env.host << " share " << visible_gpus
                                 << " GPU(s) (local ranks " << a << " and " << b << " on GPU "
                                 << of_local[a]
                                 << "): NCCL needs one GPU per rank; start fewer ranks per node, "
                                    "or use distributed.backend: mpi to share GPUs for testing");
      }
    }
  }
  return p;
}

}  // namespace ddp
