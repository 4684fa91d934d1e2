// A trained model as ddp-train saves it (model.safetensors): Linear layers layers.{i}.weight
// [out, in] and layers.{i}.bias [out], ReLU between them, and the input transform training
// applied (data.normalize, in the metadata). InferenceModel puts one on a device to compute
// logits for evaluation and prediction.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/normalize.h"
#include "ddp/safetensors.h"
#include "nn/sequential.h"
#include "train/device_context.h"

namespace ddp {

struct ModelFile {
  std::string path;
  std::vector<int64_t> layers;       ///< widths, input first, as model.layers writes them
  std::vector<NamedTensor> tensors;  ///< layers.0.weight, layers.0.bias, layers.1.weight, ...
  FeatureTransform transform;        ///< the identity when training did not normalise

  int64_t features() const { return layers.front(); }
  int64_t classes() const { return layers.back(); }
  /// "[784, 256, 256, 10] (layers.0.weight [256, 784], ...)" for messages: the widths.
  std::string describe() const;
};

/// Reads and checks a model file: its tensors must form a chain of Linear layers (each weight's
/// input width the previous one's output width, each bias its weight's output width, nothing
/// else). Throws ddp::Error naming the file and the tensor.
ModelFile read_model_file(const std::string& path);

/// A model file's layers on a device, for batches of up to max_batch rows.
class InferenceModel {
 public:
  InferenceModel(const ModelFile& file, DeviceContext& ctx, int64_t max_batch);
  /// Logits [rows, classes] for x [rows, features] on the device; valid until the next call.
  const Tensor& forward(const Tensor& x) { return model_.forward(ctx_.backend(), x); }

 private:
  DeviceContext& ctx_;
  Sequential model_;
  Buffer values_, grads_;
};

}  // namespace ddp
