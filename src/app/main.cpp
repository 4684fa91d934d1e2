// ddp-train: one MPI rank of a data-parallel training job.
//   mpirun -n 2 ddp-train --config configs/fashion_mnist.yaml [--set key.path=value ...]
// Errors every rank agreed on end the job cleanly with one message; an error on some ranks
// only ends it with MPI_Abort so no rank is left waiting in a collective. SIGTERM/SIGINT/SIGUSR1
// end it at the next step with a checkpoint and exit code 75 (resume with --resume auto). Every
// rank exits with the agreed code even when the launcher signals it during MPI_Finalize.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>

#include "config/schema.h"
#include "core/check.h"
#include "ddp/config.h"
#include "ddp/trainer.h"
#include "dist/agreement.h"
#include "dist/environment.h"
#include "dist/mpi/mpi_communicator.h"
#include "train/stop_request.h"

namespace {

struct Options {
  std::string config;
  std::vector<std::string> overrides;
  std::string resume;
  bool print_config = false;
};

int train(const Options& opt) {
  ddp::Environment env = ddp::discover_environment(MPI_COMM_WORLD);
  // Collectives on MPI_COMM_WORLD from this thread happen before the communicator's thread
  // exists: after that, only that thread calls MPI.
  const auto layout = ddp::describe_layout(MPI_COMM_WORLD, env);
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  ddp::TrainConfig cfg;
  std::vector<std::string> overrides = opt.overrides;
  if (!opt.resume.empty()) overrides.push_back("training.resume=" + opt.resume);
  ddp::run_agreed(*comm, [&] { cfg = ddp::load_config(opt.config, overrides); });
  if (opt.print_config) {
    if (env.rank == 0) std::cout << ddp::to_yaml(cfg);
    return 0;
  }
  if (env.rank == 0) {
    std::cout << "ddp-train: " << env.world << " rank(s) on " << layout.size()
              << " node(s), device " << ddp::to_string(cfg.device) << ", config " << opt.config
              << "\n";
    std::cout << "  launcher: "
              << ddp::describe_launcher([](const char* name) { return std::getenv(name); },
                                        env.world)
              << "\n";
    for (const auto& line : layout) std::cout << "  " << line << "\n";
  }
  ddp::Trainer trainer(cfg, *comm, *comm, env.rank == 0 ? &std::cout : nullptr);
  const ddp::TrainSummary summary = trainer.run();
  // Every rank stopped at the same step and the checkpoint is durable: a requeued job resumes.
  return summary.interrupted ? ddp::kExitInterrupted : 0;
}

// train() with its errors turned into the exit code every rank agrees on; an error on some
// ranks only aborts the job here (MPI_Abort does not return).
int run_rank(const Options& opt, int rank) {
  try {
    return train(opt);
  } catch (const ddp::CollectiveError& e) {
    // Every rank has this error: one message, clean exit with a failure code everywhere.
    if (rank == 0) std::cerr << "ddp-train: error: " << e.what() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ddp-train: error: " << e.what() << std::endl;
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ddp-train: data-parallel MLP training, one process per MPI rank.\n"
      "Launch with mpirun/srun (or launch/ddp-run -n N CONFIG)."};
  Options opt;
  app.add_option("-c,--config", opt.config, "YAML config file (see docs/config.md)")->required();
  app.add_option("-s,--set", opt.overrides, "override a config key: key.path=value (repeatable)")
      ->take_all()
      ->allow_extra_args(false);
  app.add_option("-r,--resume", opt.resume,
                 "continue from a checkpoint: auto (the newest in checkpoint.dir, or a fresh "
                 "start if none) or a checkpoint file; same as --set training.resume=...");
  app.add_flag("--print-config", opt.print_config,
               "print the effective config (defaults filled in) and exit");
  // Runs while the command line is parsed, before --config is required and before MPI starts.
  app.add_flag_callback(
      "--list-config-keys",
      [] {
        std::cout << ddp::config_schema_table();
        throw CLI::Success();
      },
      "print every config key (type, default, allowed values, whether a resume must keep it, "
      "what it does) and exit; needs no --config");
  CLI11_PARSE(app, argc, argv);

  std::unique_ptr<ddp::MpiSession> mpi;
  try {
    mpi = std::make_unique<ddp::MpiSession>(&argc, &argv);
  } catch (const std::exception& e) {
    std::cerr << "ddp-train: " << e.what() << std::endl;
    return 1;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // After MPI_Init, which may install handlers of its own: SIGTERM/SIGINT/SIGUSR1 then ask training
  // to checkpoint and stop (exit code ddp::kExitInterrupted) instead of killing the rank.
  ddp::install_stop_handlers();
  const int code = run_rank(opt, rank);
  // Every rank agreed on this outcome. Once the first rank exits non-zero, mpirun ends the
  // others with SIGTERM, possibly while they are still in MPI_Finalize: they exit with this
  // code all the same.
  std::cout.flush();
  std::cerr.flush();
  ddp::set_final_exit_code(code);
  return code;  // MPI_Finalize in ~MpiSession
}
