// A CPU emulation of a subset of NCCL 2.28 for tests only: with DDP_CUDA_EMULATION defined,
// src/comm/nccl/nccl_api.h includes this header instead of <nccl.h>, so the NCCL communicator runs
// in CI with several MPI processes (or threads) on one machine, without a GPU or a real NCCL.
//
// How it works (and what that means for code using it):
// - Names, types, values and signatures are NCCL's (nccl.h 2.28.9) for the subset declared here.
//   "Device" buffers are cudaMalloc memory of the CUDA emulation (cuda_emu.h), that is host memory.
// - ncclGetUniqueId makes a unique name (pid, random bits, time). The ranks of a communicator
//   rendezvous through a POSIX shared-memory segment of that name: the first to arrive creates it
//   (O_CREAT | O_EXCL), the others open it, and the last to arrive unlinks the name, so nothing is
//   left in /dev/shm even if processes crash later. Every rank of one communicator must run in its
//   own thread or process, except that ranks initialised inside ncclGroupStart/ncclGroupEnd join
//   at the call and wait for their peers in ncclGroupEnd (one thread may create them all).
// - When a collective runs, each rank copies its input into its slot of a staging area in the
// segment (a fixed chunk per rank,
//   DDP_NCCL_EMU_CHUNK_BYTES, default 1 MiB, 64 B to 1 GiB rounded down to a multiple of 64, taken
//   from the rank that creates the segment; larger counts go chunk by chunk), meets its peers at a
//   process-shared barrier, then computes the result itself by combining the slots in rank order
//   0..n-1. Every rank therefore gets bit-identical, deterministic results. ncclAvg is the sum in
//   rank order divided by nranks (integer division truncates, like C). Integer sums and products
//   wrap. ncclMax/ncclMin on NaN keep the earlier operand when a comparison is false.
//   Reductions support the 8-, 32- and 64-bit integer types, ncclFloat16 (= ncclHalf),
//   ncclBfloat16, ncclFloat32 and ncclFloat64; the 8-bit float types are rejected
//   (ncclInvalidArgument). ncclBroadcast takes every type. A 16-bit float operation is done in
//   float on the two decoded values and rounded back to the type, to nearest with ties to even,
//   after every operation (so a sum rounds n-1 times, in rank order): fp16 rounds to infinity
//   from 65520 up, gradual underflow through the subnormals, a NaN stays a NaN (the type's
//   quiet NaN, sign kept). ncclAvg there is that rounded sum divided by nranks in float, rounded
//   once more. (NCCL on a device adds in its own order, and averages floating types by
//   multiplying each input by 1/nranks first: same type and rounding, not the same bits.)
//   A collective with count 0 returns at once without meeting the peers (as in NCCL).
//   ncclReduceScatter reduces nranks x recvcount elements like an allreduce, chunk by chunk, and
//   keeps rank r's block [r·recvcount, (r+1)·recvcount); ncclAllGather puts rank r's sendcount
//   elements at block r of every rank's recvbuff. Both may run in place (sendbuff at this rank's
//   block of the other buffer), as in NCCL.
// - When: in the CUDA emulation's immediate stream mode (cuda_emu.h), and on the legacy default
//   stream in any mode, at call time, and the call returns its result. In deferred mode on a
//   created stream, the collectives make every check below at call time, then
//   queue the collective on the stream and return ncclSuccess; it runs when that stream runs (a
//   host synchronisation on it or on work that waits for it), in stream order. The peers run
//   theirs the same way, so every rank must issue its collectives in the same order and
//   eventually synchronise on them. The failures of a queued collective (mismatched calls, a
//   timeout, an injected failure) become the communicator's asynchronous error; a queued
//   collective whose communicator already has one does nothing. Collectives of one
//   communicator run one at a time even when their streams are run by different threads. As on
//   a device, a call that runs every stream (cudaDeviceSynchronize, cudaFree) in a process with
//   several ranks also runs the other ranks' queued collectives, and waits for their peers.
// - Buffers are checked like NCCL checks device pointers: both ends of every buffer must lie in
//   cudaMalloc memory (else ncclInvalidArgument), and the stream must be valid (else
//   ncclUnhandledCudaError). These checks neither run queued work nor change
//   cudaGetLastError().
// - Ranks that disagree on a collective (kind, count, type, operator or root) get
//   ncclInvalidUsage on every rank instead of undefined behaviour; the communicator's asynchronous
//   error becomes ncclInvalidUsage.
// - No wait is endless: when peers do not arrive within DDP_NCCL_EMU_TIMEOUT_S seconds (default
//   300, fractions allowed) at init or at a collective, the call returns ncclRemoteError, the
//   communicator's asynchronous error becomes ncclRemoteError, and the communicator is marked
//   broken for every rank, so peers still waiting fail at once too (like NCCL's asynchronous
//   errors after a peer hangs). A blocking ncclCommInitRank that times out frees the
//   communicator and sets *comm to NULL.
// - Once a communicator has an asynchronous error, its collectives return that error without
//   meeting the peers. Argument and usage errors are returned without changing the asynchronous
//   error. ncclGetLastError returns the message of the last error in this process.
// - Non-blocking init (config.blocking = 0): ncclCommInitRankConfig joins and returns
//   ncclInProgress; ncclCommGetAsyncError reports ncclInProgress until every rank has joined,
//   then ncclSuccess (or ncclRemoteError after the timeout). A collective on a communicator still
//   in progress returns ncclInvalidUsage. ncclCommFinalize returns ncclInProgress on a
//   non-blocking communicator and ncclSuccess on a blocking one; ncclCommGetAsyncError then
//   reports ncclSuccess, or for a non-blocking communicator ncclInProgress while collectives
//   queued on a stream have not run (it never runs them: synchronise the streams first).
//   Collectives after ncclCommFinalize return ncclInvalidUsage; queued ones still run.
// - ncclCommDestroy and ncclCommAbort only release this rank's mapping and never wait for peers,
//   except that a queued collective of this communicator running in another thread of this
//   process is waited for (after an abort it fails at once). Collectives still queued then do
//   nothing when their stream runs. ncclCommAbort also marks the communicator broken, so a peer
//   waiting in a collective returns ncclRemoteError at once (a peer waiting for a destroyed rank
//   times out instead). Destroying or aborting before every rank joined unlinks the name and
//   fails the peers' init.
// - ncclGroupStart/ncclGroupEnd nest; collectives inside a group are not held back to
//   ncclGroupEnd (they run or are queued at the call, as above).
//
// Fault injection (environment, read at init): DDP_NCCL_EMU_FAIL="RANK:N" makes the N-th
// (1-based, counted at call time) ncclAllReduce on each communicator where this process is rank
// RANK fail: the call returns ncclSuccess without taking part (as NCCL returns for an
// asynchronous failure) and the communicator's asynchronous error becomes ncclSystemError (for a
// queued allreduce, when its stream runs it). Its peers then time out as above, so
// tests set DDP_NCCL_EMU_TIMEOUT_S small. A malformed value of any DDP_NCCL_EMU_* variable makes
// init fail with ncclInvalidArgument.
#pragma once

#include <limits.h>
#include <stddef.h>

#include <cstdint>

#include "cuda_emu.h"

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 22809
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))

extern "C" {

typedef struct ncclComm* ncclComm_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL

typedef struct ncclConfig_v22800 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                         \
  {                                                                                     \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,            \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,            \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,            \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,            \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                                    \
  }

typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();

}  // extern "C"

// ---------------------------------------------------------------------------------------------
// Test controls
// ---------------------------------------------------------------------------------------------

namespace ddp_nccl_emu {

/// ncclAllReduce, ncclBroadcast, ncclReduceScatter and ncclAllGather calls of this process that
/// passed argument checks, whatever
/// their outcome (injected failures and count 0 included).
int64_t collective_count();
/// Collectives of this process running now (staging, waiting for their peers or combining),
/// whether at call time or from a stream's queue.
int64_t running_collectives();
/// Communicators of this process created and not yet destroyed or aborted.
int64_t live_communicators();
/// The prefix of every shared-memory name the emulation creates ("ddp_nccl_emu_"), followed by
/// the pid of the process that called ncclGetUniqueId, so tests can look for leftovers in
/// /dev/shm.
const char* shm_prefix();

}  // namespace ddp_nccl_emu
