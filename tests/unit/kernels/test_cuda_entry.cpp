// The CUDA entry points as a build without a usable device sees them: a build without CUDA
// answers "not built" and refuses everything that needs a device with a message saying why; a
// CUDA build on a machine without a GPU reports the reason there is no device.
#include <catch2/catch.hpp>
#include <string>

#include "core/check.h"
#include "core/tensor.h"
#include "kernels/cuda/cuda.h"

using Catch::Matchers::Contains;

TEST_CASE("cuda entry points explain why there is no device", "[cuda-entry]") {
  std::string why;
  const int devices = ddp::cuda_device_count(&why);
  if (!ddp::cuda_built()) {
    CHECK(devices == 0);
    CHECK(why == "built without CUDA");
    CHECK_THROWS_WITH(ddp::make_cuda_backend(0), Contains("this build has no CUDA support"));
    CHECK_THROWS_WITH(ddp::Buffer(16, ddp::Device::CUDA),
                      Contains("device memory: this build has no CUDA support"));
    CHECK_THROWS_WITH(ddp::DeviceArray<int>(4), Contains("this build has no CUDA support"));
    CHECK(ddp::cuda_allocation_count() == 0);
  } else if (devices == 0) {
    // A CUDA build without a GPU (or driver): the reason names the failing query.
    CHECK_THAT(why, Contains("cuda"));
    CHECK_THROWS_AS(ddp::make_cuda_backend(0), ddp::Error);
  } else {
    CHECK(why.empty());
  }
}

TEST_CASE("copy_tensor copies host tensors in any build and checks shapes", "[cuda-entry]") {
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {};
  ddp::Tensor src{a, 2, 3, ddp::Device::CPU}, dst{b, 2, 3, ddp::Device::CPU};
  ddp::copy_tensor(src, dst);
  for (int i = 0; i < 6; ++i) CHECK(b[i] == a[i]);
  ddp::Tensor wrong{b, 3, 2, ddp::Device::CPU};
  CHECK_THROWS_WITH(ddp::copy_tensor(src, wrong), Contains("copy_tensor: shapes differ"));
}
