// Errors: the calling thread's last error and the process's asynchronous one (a queued operation
// that failed), as cudaGetLastError and the synchronising calls return them, and their names.
#include <cstdio>
#include <mutex>
#include <string>

#include "cuda_emu_internal.h"

namespace ddp_emu {
namespace {

thread_local cudaError_t g_last_error = cudaSuccess;

// The asynchronous error of the process, not yet returned, and the last deferred fault message.
std::mutex g_async_mu;
cudaError_t g_async_error = cudaSuccess;
std::string g_async_message;

cudaError_t peek_async_error() {
  std::lock_guard<std::mutex> lk(g_async_mu);
  return g_async_error;
}

}  // namespace

namespace detail {

cudaError_t record(cudaError_t e) {
  if (e != cudaSuccess) g_last_error = e;
  return e;
}

void async_fault(cudaError_t e, const std::string& message) {
  {
    std::lock_guard<std::mutex> lk(g_async_mu);
    if (g_async_error == cudaSuccess) g_async_error = e;
    g_async_message = message;
  }
  // Nothing may be listening when it surfaces (a destructor ignoring the error): say it now.
  std::fprintf(stderr, "cuda emulation: a queued operation failed (%s): %s\n", cudaGetErrorName(e),
               message.c_str());
}

// Returns the pending asynchronous error once, as the caller's result and last error.
cudaError_t take_async_error() {
  cudaError_t e;
  {
    std::lock_guard<std::mutex> lk(g_async_mu);
    e = g_async_error;
    g_async_error = cudaSuccess;
  }
  return record(e);
}

}  // namespace detail

std::string last_deferred_fault() {
  std::lock_guard<std::mutex> lk(g_async_mu);
  return g_async_message;
}

}  // namespace ddp_emu

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorLaunchOutOfResources:
      return "cudaErrorLaunchOutOfResources";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorLaunchOutOfResources:
      return "too many resources requested for launch";
  }
  return "unrecognized error code";
}

// A pending asynchronous error of the process comes after this thread's own last error.
cudaError_t cudaGetLastError() {
  const cudaError_t e = ddp_emu::g_last_error;
  ddp_emu::g_last_error = cudaSuccess;
  if (e != cudaSuccess) return e;
  const cudaError_t async = ddp_emu::take_async_error();
  ddp_emu::g_last_error = cudaSuccess;
  return async;
}

cudaError_t cudaPeekAtLastError() {
  return ddp_emu::g_last_error != cudaSuccess ? ddp_emu::g_last_error : ddp_emu::peek_async_error();
}
