// Evaluating a saved model (evaluate.h).
#include "infer/evaluate.h"

#include <algorithm>
#include <iomanip>
#include <ostream>

#include "comm/agreement.h"
#include "core/check.h"
#include "core/stop_flag.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "infer/model_file.h"
#include "train/training_data.h"

namespace ddp {

namespace {

// The model must be the one the config describes, and trained on data transformed as the
// config says.
void check_model_fits(const TrainConfig& cfg, const ModelFile& m) {
  DDP_CHECK(m.layers == cfg.model.layers, "evaluate: " << m.describe()
                                                       << " does not fit the config's model.layers "
                                                       << shape_string(cfg.model.layers));
  const bool config_normalizes = cfg.data.normalize.mode != Normalization::Mode::None;
  DDP_CHECK(config_normalizes != m.transform.identity(),
            "evaluate: " << m.path << (m.transform.identity() ? " has no" : " has an")
                         << " input normalisation, but data.normalize is "
                         << (config_normalizes ? "set" : "none")
                         << ": evaluate with the config the model was trained with");
}

// Adds each row's (label, argmax of its logits) to the confusion matrix; argmax is the first
// maximum, as the loss kernels count a correct row.
void count_predictions(const std::vector<float>& logits, const int32_t* labels, int64_t rows,
                       int64_t classes, std::vector<int64_t>& confusion) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * classes;
    const int64_t predicted = std::max_element(row, row + classes) - row;
    ++confusion[static_cast<size_t>(labels[r] * classes + predicted)];
  }
}

}  // namespace

Evaluation evaluate_model(const TrainConfig& cfg, ProcessGroup& comm,
                          const std::string& model_path) {
  Evaluation e;
  std::unique_ptr<DeviceContext> ctx;
  std::unique_ptr<InferenceModel> model;
  Dataset test;
  run_agreed(comm, [&] {
    DDP_CHECK(cfg.data.test.configured(),
              "evaluate: " << cfg.source << " has no test split (data.test) to evaluate on");
    const ModelFile file = read_model_file(model_path);
    check_model_fits(cfg, file);
    test = load_split(cfg.data, cfg.data.test, true, file.features(), file.classes());
    require_finite_rows(test.x, test.features, 0, test.size, test.source);
    apply_normalization(file.transform, test);
    ctx = make_device_context(place_rank(cfg, comm));
    model = std::make_unique<InferenceModel>(file, *ctx, kEvalBatch);
    e.classes = file.classes();
    e.model = file.describe();
  });
  e.data = test.source;
  e.confusion.assign(static_cast<size_t>(e.classes * e.classes), 0);
  const std::vector<int64_t> shard = shard_indices(test.size, comm.size(), comm.rank());
  std::vector<int32_t> labels;
  for (int64_t i : shard) labels.push_back(test.y[static_cast<size_t>(i)]);
  Loader loader(test, kEvalBatch, false, cfg.data.prefetch,
                loader_workers(cfg, ctx->device(), comm.local_size()));
  loader.start_epoch(shard);
  auto feed = ctx->make_batch_feed(kEvalBatch, test.features);
  Backend& be = ctx->backend();
  std::vector<float> host_logits(static_cast<size_t>(kEvalBatch * e.classes));
  int64_t done = 0;
  for (bool more = feed->start([&loader] { return loader.next(); }); more; more = feed->advance()) {
    throw_if_stopped("evaluate");  // on this rank: main ends the others (MPI_Abort)
    const DeviceBatch batch = feed->take();
    const Tensor& logits = model->forward(batch.x);
    e.tally.add(be.softmax_xent(logits, batch.labels, 0.0f, nullptr), batch.rows);
    ctx->copy_to_host(host_logits.data(), logits.data, static_cast<size_t>(logits.numel()));
    count_predictions(host_logits, labels.data() + done, batch.rows, e.classes, e.confusion);
    done += batch.rows;
  }
  e.tally = e.tally.reduced(comm);
  std::vector<double> counts(e.confusion.begin(), e.confusion.end());
  comm.allreduce(counts.data(), counts.size(), ReduceOp::Sum);
  for (size_t i = 0; i < counts.size(); ++i) e.confusion[i] = static_cast<int64_t>(counts[i]);
  return e;
}

void print_evaluation(const Evaluation& e, std::ostream& out) {
  out << "evaluate: " << e.model << " on " << e.data << "\n";
  out << "test loss " << std::fixed << std::setprecision(4) << e.tally.loss() << " acc "
      << percent(e.tally.accuracy()) << " (" << static_cast<int64_t>(e.tally.count)
      << " samples)\n";
  out << "confusion matrix (rows: true class, columns: predicted class; recall per row):\n";
  const int64_t c = e.classes;
  out << std::setw(8) << "";
  for (int64_t p = 0; p < c; ++p) out << std::setw(7) << p;
  out << std::setw(9) << "recall"
      << "\n";
  for (int64_t t = 0; t < c; ++t) {
    out << std::setw(8) << t;
    int64_t row_total = 0;
    for (int64_t p = 0; p < c; ++p) {
      const int64_t n = e.confusion[static_cast<size_t>(t * c + p)];
      row_total += n;
      out << std::setw(7) << n;
    }
    const int64_t hit = e.confusion[static_cast<size_t>(t * c + t)];
    out << std::setw(9) << (row_total > 0 ? percent(static_cast<double>(hit) / row_total) : "-")
        << "\n";
  }
}

}  // namespace ddp
