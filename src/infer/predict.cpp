// Predictions of a saved model (predict.h).
#include "infer/predict.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/input_file.h"
#include "core/stop_flag.h"
#include "data/dataset.h"
#include "infer/model_file.h"

namespace ddp {

namespace {

constexpr int64_t kPredictBatch = 1024;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// --format, or by the file name: *.csv is csv, *.npy is npy, anything else idx.
std::string format_of(const PredictRequest& r) {
  if (!r.format.empty()) return r.format;
  if (ends_with(r.data, ".csv")) return "csv";
  return ends_with(r.data, ".npy") ? "npy" : "idx";
}

// A CSV row is the model's features, or its features and a label.
Dataset read_csv_for(const PredictRequest& r, const ModelFile& m) {
  Dataset ds = load_csv(r.data, r.csv_header, /*labeled=*/false);
  if (ds.features == m.features()) return ds;
  DDP_CHECK(ds.features == m.features() + 1,
            "predict: " << r.data << " has " << ds.features << " columns per row; the model "
                        << m.describe() << " takes " << m.features()
                        << " features (a row is the features, optionally followed by a label)");
  ds = load_csv(r.data, r.csv_header, /*labeled=*/true);
  check_dataset(ds, m.features(), m.classes(), "predict: " + r.data);
  return ds;
}

Dataset read_data_for(const PredictRequest& r, const ModelFile& m) {
  const std::string format = format_of(r);
  if (format == "csv") return read_csv_for(r, m);
  Dataset ds = format == "npy" ? load_npy(r.data, "") : load_idx_images(r.data);
  DDP_CHECK(ds.features == m.features(),
            "predict: " << r.data << " has " << (format == "npy" ? "samples" : "images") << " of "
                        << ds.features << (format == "npy" ? " features" : " pixels")
                        << "; the model " << m.describe() << " takes " << m.features()
                        << " features");
  return ds;
}

// The stored values are finite (predict_to_csv checks them on load), but the model's
// normalisation may still overflow.
void require_finite_batch(const float* x, int64_t first, int64_t rows, const Dataset& ds,
                          const ModelFile& m) {
  const auto f = static_cast<size_t>(ds.features);
  const size_t bad = first_non_finite(x, static_cast<size_t>(rows) * f);
  if (bad == static_cast<size_t>(rows) * f) return;
  const size_t j = bad % f;
  std::ostringstream transform;
  if (!m.transform.identity())
    transform << " (mean " << m.transform.mean[j] << ", std " << m.transform.std[j] << ")";
  DDP_THROW("predict: " << ds.source << ": sample " << first + static_cast<int64_t>(bad / f)
                        << ", feature " << j << " is " << x[bad] << " once normalised as " << m.path
                        << " says" << transform.str());
}

// The predictions file: CSV text gathered a buffer at a time and written whole or not at all
// (AtomicFile), so a failure or a stop leaves no partial file behind.
class PredictionsFile {
 public:
  explicit PredictionsFile(const std::string& path) : file_(open(path)) {}

  std::string& text() { return text_; }
  /// Writes the gathered text once it fills the buffer.
  void flush_if_full() {
    if (text_.size() < kBufferBytes) return;
    file_.write(text_.data(), text_.size());
    text_.clear();
  }
  void commit() {
    file_.write(text_.data(), text_.size());
    file_.commit();
  }

 private:
  static constexpr size_t kBufferBytes = size_t{1} << 20;

  static AtomicFile open(const std::string& path) {
    try {
      return AtomicFile(path, "predictions");
    } catch (const Error& e) {
      DDP_THROW("predict: --out " << path << ": cannot write (" << e.message() << ")");
    }
  }

  AtomicFile file_;
  std::string text_;
};

// One CSV line: index, the first maximum's class, softmax probabilities (in double), label.
void write_row(std::string& out, int64_t index, const float* logits, int64_t classes,
               const Dataset& ds) {
  const float* top = std::max_element(logits, logits + classes);
  double sum = 0.0;
  std::vector<double> p(static_cast<size_t>(classes));
  for (int64_t c = 0; c < classes; ++c) {
    p[c] = std::exp(double{logits[c]} - *top);
    sum += p[c];
  }
  char buf[32];
  out += std::to_string(index) + "," + std::to_string(top - logits);
  for (int64_t c = 0; c < classes; ++c) {
    std::snprintf(buf, sizeof buf, ",%.6g", p[c] / sum);
    out += buf;
  }
  if (!ds.y.empty()) out += "," + std::to_string(ds.y[static_cast<size_t>(index)]);
  out += "\n";
}

std::string header_line(const ModelFile& m, const Dataset& ds) {
  std::string line = "index,predicted";
  for (int64_t c = 0; c < m.classes(); ++c) line += ",p" + std::to_string(c);
  return line + (ds.y.empty() ? "\n" : ",label\n");
}

}  // namespace

int64_t predict_to_csv(const PredictRequest& r) {
  DDP_CHECK(r.format.empty() || r.format == "csv" || r.format == "idx" || r.format == "npy",
            "predict: --format must be idx, csv or npy, got '" << r.format << "'");
  // The data may be mapped while the predictions are written: replacing it would lose it.
  refuse_output_onto_input(r.out, "predict: --out", r.data, "--data");
  refuse_output_onto_input(r.out, "predict: --out", r.model, "--model");
  const ModelFile m = read_model_file(r.model);
  Dataset ds = read_data_for(r, m);
  require_finite_rows(ds.x, ds.features, 0, ds.size, ds.source);  // read whole anyway
  apply_normalization(m.transform, ds);
  std::unique_ptr<DeviceContext> ctx = make_device_context(DevicePlacement{});
  InferenceModel model(m, *ctx, kPredictBatch);
  PredictionsFile out(r.out);
  out.text() = header_line(m, ds);
  std::vector<float> batch(static_cast<size_t>(kPredictBatch * ds.features));
  for (int64_t first = 0; first < ds.size; first += kPredictBatch) {
    throw_if_stopped("predict");
    const int64_t rows = std::min(kPredictBatch, ds.size - first);
    ds.read_rows(first, rows, batch.data());
    require_finite_batch(batch.data(), first, rows, ds, m);
    const Tensor x{batch.data(), rows, ds.features, Device::CPU};
    const Tensor& logits = model.forward(x);
    for (int64_t i = 0; i < rows; ++i)
      write_row(out.text(), first + i, logits.data + i * m.classes(), m.classes(), ds);
    out.flush_if_full();
  }
  throw_if_stopped("predict");
  out.commit();
  return ds.size;
}

}  // namespace ddp
