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
  std::fprintf(stderr, "cuda emulation: a queued operation failed (%s): %s\n", error_name(e),
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

namespace ddp_emu {
namespace detail {

const char* error_name(cudaError_t error) {
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
    case cudaErrorIllegalState:
      return "cudaErrorIllegalState";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorLaunchOutOfResources:
      return "cudaErrorLaunchOutOfResources";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureMerge:
      return "cudaErrorStreamCaptureMerge";
    case cudaErrorStreamCaptureUnmatched:
      return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined:
      return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation:
      return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureImplicit:
      return "cudaErrorStreamCaptureImplicit";
    case cudaErrorCapturedEvent:
      return "cudaErrorCapturedEvent";
    case cudaErrorStreamCaptureWrongThread:
      return "cudaErrorStreamCaptureWrongThread";
  }
  return "cudaErrorUnknown";
}

}  // namespace detail
}  // namespace ddp_emu

const char* cudaGetErrorName(cudaError_t error) {
  DDP_EMU_COUNT_CALL();
  return ddp_emu::error_name(error);
}

const char* cudaGetErrorString(cudaError_t error) {
  DDP_EMU_COUNT_CALL();
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
    case cudaErrorIllegalState:
      return "the operation cannot be performed in the present state";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorLaunchOutOfResources:
      return "too many resources requested for launch";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureMerge:
      return "operation would result in a merge of separate capture sequences";
    case cudaErrorStreamCaptureUnmatched:
      return "capture was not ended in the same stream as it began";
    case cudaErrorStreamCaptureUnjoined:
      return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureIsolation:
      return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent:
      return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread:
      return "attempt to terminate a thread-local capture sequence from another thread";
  }
  return "unrecognized error code";
}

// A pending asynchronous error of the process comes after this thread's own last error.
cudaError_t cudaGetLastError() {
  DDP_EMU_COUNT_CALL();
  const cudaError_t e = ddp_emu::g_last_error;
  ddp_emu::g_last_error = cudaSuccess;
  if (e != cudaSuccess) return e;
  const cudaError_t async = ddp_emu::take_async_error();
  ddp_emu::g_last_error = cudaSuccess;
  return async;
}

cudaError_t cudaPeekAtLastError() {
  DDP_EMU_COUNT_CALL();
  return ddp_emu::g_last_error != cudaSuccess ? ddp_emu::g_last_error : ddp_emu::peek_async_error();
}
