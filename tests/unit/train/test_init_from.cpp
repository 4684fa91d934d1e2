// model.init_from: starting weights from a safetensors file, and each way such a file can fail
// to fit the model (missing tensor, extra tensor, wrong shape), on a one-rank job.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "comm/mpi/mpi_communicator.h"
#include "ddp/safetensors.h"
#include "ddp/trainer.h"

namespace {

struct Scratch {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ddp_init_from_" + std::to_string(getpid()));
  Scratch() { std::filesystem::create_directories(dir); }
  ~Scratch() { std::filesystem::remove_all(dir); }
};

ddp::TrainConfig config_from(const std::string& weights, const std::string& out) {
  ddp::TrainConfig cfg;
  cfg.model.layers = {3, 2};
  cfg.model.init_from = weights;
  cfg.data.train.samples = 8;
  cfg.training.batch_size = 4;
  cfg.training.log_every = 0;
  cfg.output.dir = out;
  cfg.output.save_model = false;
  return cfg;
}

// A one-rank job; each needs its own communicator (its gradient arena is handed out once).
void start(const ddp::TrainConfig& cfg) {
  auto comm = ddp::make_mpi_communicator(MPI_COMM_SELF);
  ddp::Trainer trainer(cfg, *comm, nullptr);
}

std::vector<ddp::NamedTensor> fitting_weights() {
  return {{"layers.0.weight", {2, 3}, {1, 2, 3, 4, 5, 6}}, {"layers.0.bias", {2}, {7, 8}}};
}

}  // namespace

TEST_CASE("init_from loads the weights exactly and refuses files that do not fit", "[init_from]") {
  Scratch tmp;
  auto comm = ddp::make_mpi_communicator(MPI_COMM_SELF);
  const std::string path = (tmp.dir / "w.safetensors").string();
  const std::string out = (tmp.dir / "out").string();

  ddp::save_safetensors(path, fitting_weights());
  {
    ddp::Trainer trainer(config_from(path, out), *comm, nullptr);
    const auto loaded = trainer.weights();
    REQUIRE(loaded.size() == 2);
    REQUIRE(loaded[0].data == fitting_weights()[0].data);
    REQUIRE(loaded[1].data == fitting_weights()[1].data);
  }  // the trainer holds output.dir until it ends

  auto missing = fitting_weights();
  missing.pop_back();
  ddp::save_safetensors(path, missing);
  REQUIRE_THROWS_WITH(
      start(config_from(path, out)),
      Catch::Contains("model.init_from") && Catch::Contains("no tensor named layers.0.bias"));

  auto extra = fitting_weights();
  extra.push_back({"layers.1.weight", {1}, {0}});
  ddp::save_safetensors(path, extra);
  REQUIRE_THROWS_WITH(start(config_from(path, out)),
                      Catch::Contains("has 3 tensors, the model has 2 parameters"));

  auto wrong = fitting_weights();
  wrong[0].shape = {3, 2};
  ddp::save_safetensors(path, wrong);
  REQUIRE_THROWS_WITH(start(config_from(path, out)),
                      Catch::Contains("layers.0.weight") && Catch::Contains("different shape"));
}
