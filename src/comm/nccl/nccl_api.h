// The one door to NCCL for our sources: the real library, or the test-only emulation
// (emu/nccl_emu.h) when DDP_CUDA_EMULATION is defined. Also the check macro.
#pragma once

#if defined(DDP_CUDA_EMULATION)
#include "nccl_emu.h"
#else
#include <nccl.h>
#endif

#include "core/check.h"

/// DDP_NCCL_CHECK(ncclBroadcast(...)): throws ddp::Error naming the call and NCCL's error.
#define DDP_NCCL_CHECK(call)                                                                 \
  do {                                                                                       \
    ncclResult_t ddp_nccl_rc_ = (call);                                                      \
    if (ddp_nccl_rc_ != ncclSuccess && ddp_nccl_rc_ != ncclInProgress)                       \
      DDP_THROW(#call << " failed: " << ncclGetErrorString(ddp_nccl_rc_));                   \
  } while (0)
