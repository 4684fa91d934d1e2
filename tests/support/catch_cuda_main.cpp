// Catch2 main for the CUDA kernel tests, real or emulated: without a usable device it says why
// and exits 77, which ctest reports as skipped (never as passed).
#include <cstdio>
#include <string>

#include "catch_session.h"
#include "kernels/cuda/cuda.h"

int main(int argc, char** argv) {
  std::string why;
  const int devices = ddp::cuda_device_count(&why);
  if (devices == 0) {
    std::printf("skipped: no CUDA device to test on (%s)\n", why.c_str());
    return 77;
  }
  const ddp::CudaDeviceInfo info = ddp::cuda_device_info(0);
  std::printf("CUDA device 0: %s, compute %d.%d, %d SMs\n", info.name.c_str(), info.compute_major,
              info.compute_minor, info.sm_count);
  return ddp_test::run_catch_session(argc, argv);
}
