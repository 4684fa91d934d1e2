// IDX and CSV to .npy (convert.h).
#include "data/convert.h"

#include <filesystem>
#include <system_error>
#include <utility>

#include "core/check.h"
#include "core/input_file.h"
#include "core/stop_flag.h"
#include "data/dataset.h"

namespace ddp {

namespace {

Dataset read_source(const ConvertRequest& r) {
  if (r.format == "idx") {
    DDP_CHECK(!r.images.empty() && !r.labels.empty(),
              "convert: --format idx needs --images and --labels");
    return load_idx(r.images, r.labels);
  }
  DDP_CHECK(r.format == "csv", "convert: --format must be idx or csv, got '" << r.format << "'");
  DDP_CHECK(!r.data.empty(), "convert: --format csv needs --data (features, then the label)");
  return load_csv(r.data, r.csv_header);
}

// Neither file written may be one of the inputs: the write would replace what is being read.
void refuse_outputs_onto_inputs(const ConvertRequest& r, const std::string& features,
                                const std::string& labels) {
  const std::pair<const char*, const std::string*> inputs[] = {
      {"--images", &r.images}, {"--labels", &r.labels}, {"--data", &r.data}};
  for (const auto& [option, input] : inputs) {
    if (input->empty()) continue;
    refuse_output_onto_input(features, "convert: --out's", *input, option);
    refuse_output_onto_input(labels, "convert: --out's", *input, option);
  }
}

}  // namespace

ConvertResult convert_to_npy(const ConvertRequest& r) {
  namespace fs = std::filesystem;
  const std::string features_path = (fs::path(r.out) / "features.npy").string();
  const std::string labels_path = (fs::path(r.out) / "labels.npy").string();
  refuse_outputs_onto_inputs(r, features_path, labels_path);
  const Dataset ds = read_source(r);
  throw_if_stopped("convert");
  std::error_code ec;
  fs::create_directories(r.out, ec);
  DDP_CHECK(!ec && fs::is_directory(r.out),
            "convert: --out " << r.out << ": cannot create the directory ("
                              << (ec ? ec.message() : "a file of that name exists") << ")");
  ConvertResult out;
  out.samples = ds.size;
  out.features = ds.features;
  out.type = ds.x.type();
  out.features_path = features_path;
  out.labels_path = labels_path;
  save_npy(ds, out.features_path, out.labels_path);
  out.features_bytes = fs::file_size(out.features_path, ec);
  return out;
}

}  // namespace ddp
