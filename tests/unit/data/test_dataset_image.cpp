// A Dataset written as one flat image and read back in place: what the ranks of a node share.
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <vector>

#include "data/dataset_image.h"

namespace {

ddp::Dataset bytes_dataset() {
  ddp::Dataset ds;
  ds.size = 3;
  ds.features = 5;
  ds.source = "images.idx (labels labels.idx)";
  std::vector<uint8_t> x(15);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint8_t>(i * 17);
  ds.x = ddp::FeatureStore::scaled_bytes(x);
  ds.y = {4, 0, 2};
  return ds;
}

}  // namespace

TEST_CASE("a data set image gives the data set back, its features read in place", "[data]") {
  ddp::Dataset floats;
  floats.size = 2;
  floats.features = 3;
  floats.source = "a.csv";
  floats.x = ddp::FeatureStore(std::vector<float>{1.5f, -2, 3, 4, 5e-8f, 6});
  ddp::Dataset unlabeled = bytes_dataset();
  unlabeled.y.clear();
  for (const ddp::Dataset& ds : {bytes_dataset(), floats, unlabeled}) {
    INFO(ds.source << ", " << ds.y.size() << " labels");
    auto image = std::make_shared<std::vector<unsigned char>>(ddp::image_bytes(ds));
    ddp::write_image(ds, image->data());
    const ddp::Dataset back = ddp::view_image(image->data(), image->size(), image);
    CHECK(back.size == ds.size);
    CHECK(back.features == ds.features);
    CHECK(back.source == ds.source);
    CHECK(back.y == ds.y);
    CHECK(back.x.type() == ds.x.type());
    CHECK(back.x.floats() == ds.x.floats());
    const auto* at = static_cast<const unsigned char*>(back.x.data());
    CHECK(at >= image->data());  // in the image, not a copy
    CHECK(at + back.x.bytes() == image->data() + image->size());
    CHECK((at - image->data()) % 64 == 0);
  }
}

TEST_CASE("view_image refuses what write_image did not make", "[data]") {
  const ddp::Dataset ds = bytes_dataset();
  std::vector<unsigned char> image(ddp::image_bytes(ds));
  ddp::write_image(ds, image.data());
  CHECK_THROWS_WITH(ddp::view_image(image.data(), image.size() - 1, nullptr),
                    Catch::Contains("its header says " + std::to_string(image.size())));
  CHECK_THROWS_WITH(ddp::view_image(image.data(), 8, nullptr), Catch::Contains("shorter than"));
  image[0] ^= 1;
  CHECK_THROWS_WITH(ddp::view_image(image.data(), image.size(), nullptr),
                    Catch::Contains("not a data set image"));
}
