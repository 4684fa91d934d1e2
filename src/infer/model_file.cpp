// Model files and the model that computes from one (model_file.h).
#include "infer/model_file.h"

#include <map>

#include "core/check.h"

namespace ddp {

namespace {

using TensorIndex = std::map<std::string, const NamedTensor*>;

// The tensors by name: a file may hold up to kMaxSafetensorsTensors of them, so no search
// through all of them per layer.
TensorIndex index_tensors(const std::vector<NamedTensor>& tensors) {
  TensorIndex index;
  for (const NamedTensor& t : tensors) index.emplace(t.name, &t);
  return index;
}

const NamedTensor* find_tensor(const TensorIndex& index, const std::string& name) {
  const auto it = index.find(name);
  return it == index.end() ? nullptr : it->second;
}

// The widths the weights chain into, each bias checked against its weight.
std::vector<int64_t> layer_widths(const std::vector<NamedTensor>& tensors,
                                  const std::string& path) {
  const TensorIndex index = index_tensors(tensors);
  std::vector<int64_t> widths;
  size_t i = 0;
  for (;; ++i) {
    const std::string w = "layers." + std::to_string(i) + ".weight";
    const std::string b = "layers." + std::to_string(i) + ".bias";
    const NamedTensor* weight = find_tensor(index, w);
    if (weight == nullptr) break;
    DDP_CHECK(weight->shape.size() == 2, path << ": " << w << " has shape "
                                              << shape_string(weight->shape) << ", not [out, in]");
    const int64_t out = weight->shape[0], in = weight->shape[1];
    DDP_CHECK(widths.empty() || widths.back() == in, path << ": " << w << " takes " << in
                                                          << " inputs, the layer before gives "
                                                          << widths.back());
    const NamedTensor* bias = find_tensor(index, b);
    DDP_CHECK(bias != nullptr, path << ": " << w << " has no " << b);
    DDP_CHECK(bias->shape == std::vector<int64_t>{out}, path << ": " << b << " has shape "
                                                             << shape_string(bias->shape) << ", "
                                                             << w << " needs [" << out << "]");
    if (widths.empty()) widths.push_back(in);
    widths.push_back(out);
  }
  DDP_CHECK(i > 0, path << ": no layers.0.weight: not a model ddp-train saved");
  DDP_CHECK(tensors.size() == 2 * i,
            path << ": " << tensors.size() << " tensors, " << 2 * i << " expected for " << i
                 << " Linear layer(s) (a checkpoint? evaluate and predict take model.safetensors)");
  return widths;
}

}  // namespace

std::string ModelFile::describe() const { return path + " (layers " + shape_string(layers) + ")"; }

ModelFile read_model_file(const std::string& path) {
  ModelFile m;
  m.path = path;
  std::map<std::string, std::string> metadata;
  m.tensors = load_safetensors(path, &metadata);
  m.layers = layer_widths(m.tensors, path);
  require_finite(m.tensors, "model '" + path + "'");
  m.transform = normalization_from_metadata(metadata, path, m.features());
  return m;
}

InferenceModel::InferenceModel(const ModelFile& file, DeviceContext& ctx, int64_t max_batch)
    : ctx_(ctx), model_(file.layers, "relu", max_batch, ctx.device()) {
  const size_t align = ctx.arena_alignment();
  std::vector<size_t> offsets;
  size_t total = 0;
  for (size_t numel : model_.parameter_numels()) {
    offsets.push_back(total);
    total += (numel + align - 1) / align * align;
  }
  values_ = Buffer(total, ctx.device());
  grads_ = Buffer(total, ctx.device());
  model_.bind(values_.data(), grads_.data(), offsets);
  const std::vector<std::string> names = model_.parameter_names();
  const TensorIndex index = index_tensors(file.tensors);
  for (size_t p = 0; p < names.size(); ++p) {
    const NamedTensor* t = find_tensor(index, names[p]);
    DDP_CHECK(t != nullptr, file.path << ": no tensor " << names[p]);
    ctx.copy_from_host(values_.data() + offsets[p], t->data.data(), t->data.size());
  }
}

}  // namespace ddp
