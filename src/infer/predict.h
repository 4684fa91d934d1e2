// ddp-train predict: a saved model's class probabilities for new data, one CSV row per sample
// (index, predicted class, the probability of every class, and the label when the data has
// one). Runs in one process on the CPU. The model's input transform (data.normalize) is applied
// as in training.
#pragma once

#include <cstdint>
#include <string>

namespace ddp {

struct PredictRequest {
  std::string model;        ///< model.safetensors
  std::string data;         ///< an IDX images file, a CSV of features (optionally + label), or
                            ///< a features .npy (as data.format npy reads it)
  std::string format;       ///< "idx", "csv", "npy" or "" (by the name: *.csv, *.npy, else idx)
  bool csv_header = false;  ///< csv: the first line is a header
  std::string out;          ///< where the predictions go
};

/// Writes the predictions (whole or not at all) and returns how many samples they cover. Throws
/// ddp::Error naming the files when the data does not fit the model: another feature count, a
/// label outside the model's classes, a row of neither the model's features nor features and a
/// label; when --out is the data or the model file; or when a stop request (core/stop_flag.h)
/// interrupts it ("predict: stopped by SIGTERM"), leaving no output.
int64_t predict_to_csv(const PredictRequest& request);

}  // namespace ddp
