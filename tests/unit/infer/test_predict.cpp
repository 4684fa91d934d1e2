// predict's own refusal of values that are not finite: finite features that the model's stored
// normalisation turns into infinities (a NaN stored in the data file, or in the weights, is
// refused on load: tests/cli/test_evaluate_predict.sh).
#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "data/normalize.h"
#include "ddp/safetensors.h"
#include "infer/predict.h"
#include "temp_files.h"
#include "test_helpers.h"

TEST_CASE("predict: a normalisation that overflows is refused naming sample and feature",
          "[infer]") {
  ddp_test::TempDir dir("ddp_predict");
  ddp::FeatureTransform t;
  t.mean = {0.0f, 0.0f, 0.0f};
  t.std = {1.0f, 1e-37f, 1.0f};  // 100 / 1e-37 is beyond float's range
  ddp::PredictRequest r;
  r.model = dir.file("m.safetensors");
  r.data = dir.file("x.csv");
  r.out = dir.file("p.csv");
  ddp::save_safetensors(
      r.model, {{"layers.0.weight", {2, 3}, {1, 2, 3, 4, 5, 6}}, {"layers.0.bias", {2}, {0, 0}}},
      ddp::normalization_metadata(t));
  std::ofstream(r.data) << "1,1e-40,1\n2,100,3\n";
  CHECK(ddp_test::error_of([&] { ddp::predict_to_csv(r); }) ==
        "predict: " + r.data + ": sample 1, feature 1 is inf once normalised as " + r.model +
            " says (mean 0, std 1e-37)");
  std::ofstream(r.data) << "1,1e-40,1\n2,1e-36,3\n";  // 10 once normalised: fine
  CHECK(ddp::predict_to_csv(r) == 2);
}
