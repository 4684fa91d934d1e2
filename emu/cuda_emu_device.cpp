// The emulated devices: how many (DDP_EMU_DEVICES), which one is current, their properties and
// attributes, and the multiprocessor count and compute capability tests may choose.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "cuda_emu_internal.h"

namespace ddp_emu {
namespace {

std::atomic<int> g_sm_count{4};
std::atomic<int> g_cc_major{8};
std::atomic<int> g_cc_minor{0};

}  // namespace

void set_sm_count(int n) {
  if (n < 1) throw std::invalid_argument("ddp_emu::set_sm_count: n must be >= 1");
  g_sm_count = n;
}

int sm_count() { return g_sm_count; }

void set_compute_capability(int major, int minor) {
  if (major < 1 || minor < 0)
    throw std::invalid_argument("ddp_emu::set_compute_capability: major >= 1 and minor >= 0");
  g_cc_major = major;
  g_cc_minor = minor;
}

}  // namespace ddp_emu

using ddp_emu::record;

namespace {
// DDP_EMU_DEVICES=N makes the emulation report N devices (default 1), so the code that gives
// each local rank its own GPU can run; they all share the host's memory.
int emulated_devices() {
  const char* v = std::getenv("DDP_EMU_DEVICES");
  const int n = v != nullptr ? std::atoi(v) : 1;
  return n >= 1 ? n : 1;
}
bool valid_device(int device) { return device >= 0 && device < emulated_devices(); }
thread_local int current_device = 0;
}  // namespace

cudaError_t cudaGetDeviceCount(int* count) {
  DDP_EMU_COUNT_CALL();
  if (!count) return record(cudaErrorInvalidValue);
  *count = emulated_devices();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  DDP_EMU_COUNT_CALL();
  if (!valid_device(device)) return record(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  DDP_EMU_COUNT_CALL();
  if (!device) return record(cudaErrorInvalidValue);
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  DDP_EMU_COUNT_CALL();
  if (!prop) return record(cudaErrorInvalidValue);
  if (!valid_device(device)) return record(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "%s", "DDP CUDA emulator (CPU)");
  prop->totalGlobalMem = ddp_emu::kTotalGlobalMem;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->regsPerBlock = 65536;
  prop->warpSize = warpSize;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->totalConstMem = 64 * 1024;
  prop->major = ddp_emu::g_cc_major;
  prop->minor = ddp_emu::g_cc_minor;
  prop->multiProcessorCount = ddp_emu::sm_count();
  prop->memoryBusWidth = 256;
  prop->l2CacheSize = 4 << 20;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->sharedMemPerMultiprocessor = 164 * 1024;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  DDP_EMU_COUNT_CALL();
  if (!value) return record(cudaErrorInvalidValue);
  if (!valid_device(device)) return record(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = warpSize;
      return cudaSuccess;
    case cudaDevAttrClockRate:
      *value = 1500000;  // kHz
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = ddp_emu::sm_count();
      return cudaSuccess;
    case cudaDevAttrMemoryClockRate:
      *value = 1000000;  // kHz
      return cudaSuccess;
    case cudaDevAttrGlobalMemoryBusWidth:
      *value = 256;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = ddp_emu::g_cc_major;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = ddp_emu::g_cc_minor;
      return cudaSuccess;
  }
  return record(cudaErrorInvalidValue);
}
