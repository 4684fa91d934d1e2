// ddp-train: one MPI rank of a data-parallel training job, or of the evaluation of a saved model.
//   mpirun -n 2 ddp-train --config configs/fashion_mnist.yaml [--set key.path=value ...]
//   mpirun -n 2 ddp-train evaluate --config C --model runs/x/model.safetensors
//   ddp-train predict --model runs/x/model.safetensors --data FILE --out predictions.csv
//   ddp-train convert --format idx --images I --labels L --out DIR   (or --format csv --data F)
//   ddp-train analyze runs/x [--run ID]   (why a job hung, from its ranks' flight records)
// Errors every rank agreed on end the job cleanly with one message; an error on some ranks
// only ends it with MPI_Abort so no rank is left waiting in a collective. SIGTERM/SIGINT/SIGUSR1
// end training at the next step with a checkpoint and exit code 75 (resume with --resume auto),
// and evaluate, predict and convert within a second with no output and 128 + the signal. Every
// rank exits with the agreed code even when the launcher signals it during MPI_Finalize.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>

#include "comm/agreement.h"
#include "comm/environment.h"
#include "comm/lost_peer.h"
#include "comm/mpi/mpi_communicator.h"
#include "config/schema.h"
#include "core/check.h"
#include "core/stop_flag.h"
#include "data/convert.h"
#include "ddp/config.h"
#include "ddp/trainer.h"
#include "infer/evaluate.h"
#include "infer/predict.h"
#include "io/flight_analysis.h"
#include "train/stop_request.h"

namespace {

enum class Command { Train, Evaluate, Predict, Convert, Analyze };

struct Options {
  Command command = Command::Train;
  std::string config;
  std::vector<std::string> overrides;
  std::string resume;
  bool start_over = false;
  bool print_config = false;
  std::string model;            // evaluate, predict
  ddp::PredictRequest predict;  // predict
  ddp::ConvertRequest convert;  // convert
  std::string run_dir;          // analyze: the output.dir whose flight/ records are read
  std::string run_id;           // analyze: whose records ("": the newest job's)
};

// The exit code of a failed command: 1; for a one-shot command a signal stopped (its loops
// throw once a stop is requested), 128 + the signal, as if the signal had ended it; after a
// collective timed out (a peer was lost), kExitPeerLost, which a launcher may retry.
int failure_code(const Options& opt) {
  const int signal = ddp::stop_requested();
  if (opt.command != Command::Train && signal != 0) return ddp::exit_code_of_stop(signal);
  return ddp::collective_timed_out() ? ddp::kExitPeerLost : 1;
}

// Whether an error only this rank saw must end the job with MPI_Abort: peers may be waiting in
// a collective (a one-process subcommand has none, and ends as cleanly as an agreed error).
bool must_abort(const Options& opt, int world) {
  return world > 1 || opt.command == Command::Train;
}

// The message, then MPI_Abort with the failure's code (it does not return).
[[noreturn]] void abort_job(const std::exception& e, const Options& opt) {
  std::cerr << "ddp-train: error: " << e.what() << std::endl;
  MPI_Abort(MPI_COMM_WORLD, failure_code(opt));
  std::abort();
}

// Runs `work` with the communicator alive: an error only this rank saw aborts the job here,
// before the communicator's destructor frees its shared-memory windows, a collective that the
// other ranks, waiting in a step's allreduce, would never join. Agreed errors pass.
template <typename Work>
void abort_on_local_error(const Options& opt, int world, Work work) {
  try {
    work();
  } catch (const ddp::CollectiveError&) {
    throw;
  } catch (const std::exception& e) {
    if (!must_abort(opt, world)) throw;
    abort_job(e, opt);
  }
}

// Collective: the saved model on the config's test split; rank 0 prints the report.
int evaluate(const Options& opt) {
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  ddp::TrainConfig cfg;
  ddp::run_agreed(*comm, [&] { cfg = ddp::load_config(opt.config, opt.overrides); });
  ddp::Evaluation e;
  abort_on_local_error(opt, comm->size(), [&] { e = ddp::evaluate_model(cfg, *comm, opt.model); });
  if (comm->rank() == 0) ddp::print_evaluation(e, std::cout);
  return 0;
}

// predict, convert and analyze run in one process: launched on more, every rank refuses alike.
void require_one_process(const char* command, int world) {
  if (world == 1) return;
  throw ddp::CollectiveError(std::string(command) + " runs in one process (it was launched on " +
                             std::to_string(world) + " ranks)");
}

// `work` in the one process: its errors end it cleanly (no MPI_Abort).
template <typename Work>
void in_one_process(const char* command, int world, Work work) {
  require_one_process(command, world);
  try {
    work();
  } catch (const ddp::Error& e) {
    throw ddp::CollectiveError(e.message());
  }
}

int predict(const Options& opt, int world) {
  int64_t rows = 0;
  in_one_process("predict", world, [&] { rows = ddp::predict_to_csv(opt.predict); });
  std::cout << "predict: " << rows << " predictions of " << opt.predict.model << " for "
            << opt.predict.data << " in " << opt.predict.out << "\n";
  return 0;
}

int convert(const Options& opt, int world) {
  ddp::ConvertResult r;
  in_one_process("convert", world, [&] { r = ddp::convert_to_npy(opt.convert); });
  std::cout << "convert: " << r.samples << " samples of " << r.features << " features ("
            << ddp::to_string(r.type) << ") in " << r.features_path << " ("
            << r.features_bytes / 1024 << " KiB) and " << r.labels_path << "\n"
            << "  train on them with: data: {format: npy, train: {features: " << r.features_path
            << ", labels: " << r.labels_path << "}}\n";
  return 0;
}

// The flight records' notes, then the verdict: exit 0 whenever the records could be read.
int analyze(const Options& opt, int world) {
  ddp::FlightRecords records;
  in_one_process("analyze", world,
                 [&] { records = ddp::read_flight_records(opt.run_dir, opt.run_id); });
  for (const auto& note : records.notes) std::cout << "note: " << note << "\n";
  std::cout << "run " << records.run << ", " << records.records.size() << " of "
            << records.world_size << " ranks left a flight record\n";
  int by = 0;
  const std::string then = ddp::read_flight_verdict(opt.run_dir, records.run, &by);
  if (!then.empty()) {
    std::cout << "when it hung, rank " << by << " said:\n"
              << then << "from the records now:\n";
  }
  std::cout << ddp::analyze_hang(records).message;
  return 0;
}

int train(const Options& opt) {
  ddp::Environment env = ddp::discover_environment(MPI_COMM_WORLD);
  // Collectives on MPI_COMM_WORLD from this thread happen before the communicator's thread
  // exists: after that, only that thread calls MPI.
  const auto layout = ddp::describe_layout(MPI_COMM_WORLD, env);
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  ddp::TrainConfig cfg;
  std::vector<std::string> overrides = opt.overrides;
  if (!opt.resume.empty()) overrides.push_back("training.resume=" + opt.resume);
  if (opt.start_over) overrides.push_back("training.start_over=true");
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
  ddp::TrainSummary summary;
  abort_on_local_error(opt, env.world, [&] {
    ddp::Trainer trainer(cfg, *comm, env.rank == 0 ? &std::cout : nullptr);
    summary = trainer.run();
  });
  // Every rank stopped at the same step and the checkpoint is durable: a requeued job resumes.
  return summary.interrupted ? ddp::kExitInterrupted : 0;
}

// train() with its errors turned into the exit code every rank agrees on; an error on some
// ranks only aborts the job here (MPI_Abort does not return).
int run_rank(const Options& opt, int rank, int world) {
  try {
    if (opt.command == Command::Evaluate) return evaluate(opt);
    if (opt.command == Command::Predict) return predict(opt, world);
    if (opt.command == Command::Convert) return convert(opt, world);
    if (opt.command == Command::Analyze) return analyze(opt, world);
    return train(opt);
  } catch (const ddp::CollectiveError& e) {
    // Every rank has this error: one message, clean exit with a failure code everywhere.
    if (rank == 0) std::cerr << "ddp-train: error: " << e.what() << std::endl;
    return failure_code(opt);
  } catch (const std::exception& e) {
    if (must_abort(opt, world)) abort_job(e, opt);
    std::cerr << "ddp-train: error: " << e.what() << std::endl;
    return failure_code(opt);
  }
}

// Training's options: the config, overrides, resume and start over, the config listings.
void add_training_options(CLI::App& app, Options& opt) {
  app.add_option("-c,--config", opt.config, "YAML config file (see docs/config.md)");
  app.add_option("-s,--set", opt.overrides, "override a config key: key.path=value (repeatable)")
      ->take_all()
      ->allow_extra_args(false);
  app.add_option("-r,--resume", opt.resume,
                 "continue from a checkpoint: auto (the newest in checkpoint.dir that can "
                 "continue this run, or a fresh start if none) or a checkpoint file; same as "
                 "--set training.resume=...");
  app.add_flag("--start-over", opt.start_over,
               "a fresh run where an earlier one left checkpoints: move that run's files aside "
               "(into <dir>/earlier-run-<time>/) instead of refusing; same as --set "
               "training.start_over=true");
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
}

CLI::App* add_evaluate(CLI::App& app, Options& opt) {
  CLI::App* eval = app.add_subcommand(
      "evaluate",
      "loss, accuracy and confusion matrix of a saved model on the config's test "
      "split (data-parallel over the ranks it is launched with)");
  eval->add_option("-c,--config", opt.config, "the YAML config the model was trained with")
      ->required();
  eval->add_option("-m,--model", opt.model, "model.safetensors written by training")->required();
  eval->add_option("-s,--set", opt.overrides, "override a config key: key.path=value")
      ->take_all()
      ->allow_extra_args(false);
  return eval;
}

CLI::App* add_predict(CLI::App& app, Options& opt) {
  CLI::App* pred = app.add_subcommand(
      "predict",
      "a saved model's predicted class and class probabilities for each sample of a "
      "data file, as CSV (one process, CPU)");
  pred->add_option("-m,--model", opt.predict.model, "model.safetensors written by training")
      ->required();
  pred->add_option("-d,--data", opt.predict.data,
                   "an IDX images file (.gz or raw), a CSV file (features, optionally a label) "
                   "or a features .npy")
      ->required();
  pred->add_option("-f,--format", opt.predict.format,
                   "idx, csv or npy (default: csv for *.csv, npy for *.npy, else idx)")
      ->check(CLI::IsMember({"idx", "csv", "npy"}));
  pred->add_flag("--csv-header", opt.predict.csv_header, "csv: the first line is a header");
  pred->add_option("-o,--out", opt.predict.out, "the CSV file to write")->required();
  return pred;
}

CLI::App* add_convert(CLI::App& app, Options& opt) {
  CLI::App* conv = app.add_subcommand(
      "convert",
      "an IDX pair or a labeled CSV as the features.npy and labels.npy that data.format npy "
      "memory-maps (one process)");
  conv->add_option("-f,--format", opt.convert.format, "idx or csv")
      ->required()
      ->check(CLI::IsMember({"idx", "csv"}));
  conv->add_option("--images", opt.convert.images, "idx: the images file (.gz or raw)");
  conv->add_option("--labels", opt.convert.labels, "idx: the labels file (.gz or raw)");
  conv->add_option("-d,--data", opt.convert.data, "csv: the features, then the integer label");
  conv->add_flag("--csv-header", opt.convert.csv_header, "csv: the first line is a header");
  conv->add_option("-o,--out", opt.convert.out, "directory for features.npy and labels.npy")
      ->required();
  return conv;
}

CLI::App* add_analyze(CLI::App& app, Options& opt) {
  CLI::App* an = app.add_subcommand(
      "analyze",
      "why a job hung: reads the flight records its ranks wrote to <RUN_DIR>/flight/ (on a "
      "timeout, an error, SIGUSR2 or exit) and names the collective that did not complete and "
      "the ranks that never entered it (one process)");
  an->add_option("RUN_DIR", opt.run_dir, "the job's output.dir")->required();
  an->add_option("--run", opt.run_id,
                 "the job whose records to read (default: the newest job's in the folder)");
  return an;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ddp-train: data-parallel MLP training, one process per MPI rank.\n"
      "Launch with mpirun/srun (or launch/ddp-run -n N CONFIG)."};
  Options opt;
  add_training_options(app, opt);
  app.require_subcommand(0, 1);
  CLI::App* eval = add_evaluate(app, opt);
  CLI::App* pred = add_predict(app, opt);
  CLI::App* conv = add_convert(app, opt);
  CLI::App* an = add_analyze(app, opt);
  CLI11_PARSE(app, argc, argv);
  if (*eval) opt.command = Command::Evaluate;
  if (*pred) opt.command = Command::Predict;
  if (*conv) opt.command = Command::Convert;
  if (*an) opt.command = Command::Analyze;
  if (opt.command == Command::Train && opt.config.empty()) {
    std::cerr << "--config is required\nRun with --help for more information.\n";
    return 2;
  }

  std::unique_ptr<ddp::MpiSession> mpi;
  try {
    mpi = std::make_unique<ddp::MpiSession>(&argc, &argv);
  } catch (const std::exception& e) {
    std::cerr << "ddp-train: " << e.what() << std::endl;
    return 1;
  }
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  // After MPI_Init, which may install handlers of its own: SIGTERM/SIGINT/SIGUSR1 then ask training
  // to checkpoint and stop (exit code ddp::kExitInterrupted) instead of killing the rank; the
  // one-shot commands stop in their loops, leaving no partial output, and exit 128 + signal.
  ddp::install_stop_handlers();
  ddp::set_stop_interrupts(opt.command != Command::Train);
  // A closed stdout (`| head -1`) must not kill a run before it writes its files.
  ddp::ignore_broken_pipes();
  const int code = run_rank(opt, rank, world);
  // Every rank agreed on this outcome. Once the first rank exits non-zero, mpirun ends the
  // others with SIGTERM, possibly while they are still in MPI_Finalize: they exit with this
  // code all the same.
  std::cout.flush();
  std::cerr.flush();
  ddp::set_final_exit_code(code);
  return code;  // MPI_Finalize in ~MpiSession
}
