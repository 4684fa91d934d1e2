// IDX and CSV to .npy (convert.h).
#include "data/convert.h"

#include <filesystem>
#include <system_error>

#include "core/check.h"
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

}  // namespace

ConvertResult convert_to_npy(const ConvertRequest& r) {
  const Dataset ds = read_source(r);
  throw_if_stopped("convert");
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(r.out, ec);
  DDP_CHECK(!ec && fs::is_directory(r.out),
            "convert: --out " << r.out << ": cannot create the directory ("
                              << (ec ? ec.message() : "a file of that name exists") << ")");
  ConvertResult out;
  out.samples = ds.size;
  out.features = ds.features;
  out.type = ds.x.type();
  out.features_path = (fs::path(r.out) / "features.npy").string();
  out.labels_path = (fs::path(r.out) / "labels.npy").string();
  save_npy(ds, out.features_path, out.labels_path);
  out.features_bytes = fs::file_size(out.features_path, ec);
  return out;
}

}  // namespace ddp
