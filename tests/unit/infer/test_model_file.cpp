// Model files: the widths read from the tensors, the transform from the metadata, every way a
// file can fail to be a chain of Linear layers, and weights or a normalisation that are not
// finite, each named.
#include <catch2/catch.hpp>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "ddp/safetensors.h"
#include "infer/model_file.h"
#include "temp_files.h"
#include "test_helpers.h"

using ddp::NamedTensor;

namespace {

NamedTensor tensor(const std::string& name, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return NamedTensor{name, shape, std::vector<float>(static_cast<size_t>(n), 0.5f)};
}

// The message of reading a model file holding `tensors`.
std::string refusal(const std::vector<NamedTensor>& tensors) {
  ddp_test::TempDir dir("ddp_model_file");
  const std::string path = dir.file("m.safetensors");
  ddp::save_safetensors(path, tensors);
  const std::string message = ddp_test::error_of([&] { ddp::read_model_file(path); });
  const size_t at = message.find(": ");
  return at == std::string::npos ? message : message.substr(at + 2);  // without the path
}

}  // namespace

TEST_CASE("model file: widths from the tensors, normalisation from the metadata", "[infer]") {
  ddp_test::TempDir dir("ddp_model_file");
  const std::string path = dir.file("m.safetensors");
  ddp::FeatureTransform t;
  t.mean = {0.25f, -1.5f, 3.0f};
  t.std = {1.0f, 0.5f, 2.0f};
  ddp::save_safetensors(path,
                        {tensor("layers.0.weight", {5, 3}), tensor("layers.0.bias", {5}),
                         tensor("layers.1.weight", {2, 5}), tensor("layers.1.bias", {2})},
                        ddp::normalization_metadata(t));
  const ddp::ModelFile m = ddp::read_model_file(path);
  CHECK(m.layers == std::vector<int64_t>{3, 5, 2});
  CHECK(m.features() == 3);
  CHECK(m.classes() == 2);
  CHECK(m.transform.mean == t.mean);
  CHECK(m.transform.std == t.std);
}

TEST_CASE("model file: tensors that are not a chain of Linear layers are refused", "[infer]") {
  CHECK(refusal({tensor("fc.weight", {2, 3})}) ==
        "no layers.0.weight: not a model ddp-train saved");
  CHECK(refusal({tensor("layers.0.weight", {6})}) ==
        "layers.0.weight has shape [6], not [out, in]");
  CHECK(refusal({tensor("layers.0.weight", {2, 3})}) == "layers.0.weight has no layers.0.bias");
  CHECK(refusal({tensor("layers.0.weight", {2, 3}), tensor("layers.0.bias", {3})}) ==
        "layers.0.bias has shape [3], layers.0.weight needs [2]");
  CHECK(refusal({tensor("layers.0.weight", {4, 3}), tensor("layers.0.bias", {4}),
                 tensor("layers.1.weight", {2, 5}), tensor("layers.1.bias", {2})}) ==
        "layers.1.weight takes 5 inputs, the layer before gives 4");
  CHECK(refusal({tensor("layers.0.weight", {4, 3}), tensor("layers.0.bias", {4}),
                 tensor("optimizer.exp_avg.layers.0.weight", {4, 3})}) ==
        "3 tensors, 2 expected for 1 Linear layer(s) (a checkpoint? evaluate and predict take "
        "model.safetensors)");
}

TEST_CASE("model file: a NaN or an infinity in the weights or the normalisation is refused",
          "[infer]") {
  std::vector<NamedTensor> tensors = {
      tensor("layers.0.weight", {5, 3}), tensor("layers.0.bias", {5}),
      tensor("layers.1.weight", {2, 5}), tensor("layers.1.bias", {2})};
  tensors[2].data[7] = std::numeric_limits<float>::quiet_NaN();
  CHECK(refusal(tensors) == "tensor 'layers.1.weight' holds nan at index 7 (row 1, column 2)");
  tensors[2].data[7] = 0.5f;
  tensors[3].data[1] = -std::numeric_limits<float>::infinity();
  CHECK(refusal(tensors) == "tensor 'layers.1.bias' holds -inf at index 1");

  tensors[3].data[1] = 0.5f;
  ddp_test::TempDir dir("ddp_model_file");
  const std::string path = dir.file("m.safetensors");
  ddp::FeatureTransform t;
  t.mean = {0.0f, 0.0f, 0.0f};
  t.std = {1.0f, 1.0f, 1.0f};
  std::map<std::string, std::string> metadata = ddp::normalization_metadata(t);
  metadata["ddp.normalize.mean"] = "[0, 1e39, 0]";  // beyond float: it would read as inf
  ddp::save_safetensors(path, tensors, metadata);
  CHECK(ddp_test::error_of([&] { ddp::read_model_file(path); }) ==
        path + ": metadata 'ddp.normalize.mean' entry 1 is 1e+39 (must be a finite float)");
  const std::string message = ddp_test::error_of([&] {
    tensors[0].data[0] = std::numeric_limits<float>::infinity();
    ddp::save_safetensors(path, tensors);
    ddp::read_model_file(path);
  });
  CHECK(message ==
        "model '" + path + "': tensor 'layers.0.weight' holds inf at index 0 (row 0, column 0)");
}
