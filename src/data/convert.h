// ddp-train convert: an IDX pair or a labeled CSV written as the .npy pair data.format npy
// reads (features.npy and labels.npy in one directory), in the source's stored type, so that
// training from the converted files gives bitwise the weights training from the source gives.
#pragma once

#include <cstdint>
#include <string>

#include "data/features.h"

namespace ddp {

struct ConvertRequest {
  std::string format;       ///< "idx" or "csv"
  std::string images;       ///< idx: images file (.gz or raw)
  std::string labels;       ///< idx: labels file (.gz or raw)
  std::string data;         ///< csv: features, then the integer label, per row
  bool csv_header = false;  ///< csv: the first line is a header
  std::string out;          ///< directory for features.npy and labels.npy (created if missing)
};

struct ConvertResult {
  int64_t samples = 0, features = 0;
  FeatureType type = FeatureType::F32;
  std::string features_path, labels_path;  ///< the files written
  uint64_t features_bytes = 0;             ///< size of features.npy
};

/// Reads the source with the training readers (every error names the file, line or field) and
/// writes the pair (save_npy). Throws ddp::Error for another format, a missing input option, an
/// output directory that cannot be created, an output file that is one of the inputs, or a stop
/// request (core/stop_flag.h) before the pair is written ("convert: stopped by SIGTERM").
ConvertResult convert_to_npy(const ConvertRequest& request);

}  // namespace ddp
