// The collectives (allreduce, broadcast, reduce-scatter, allgather): their argument checks, the
// check that every rank called the same one, and the chunked run (stage, barrier, combine) at
// call time or queued on the caller's stream, with the failure DDP_NCCL_EMU_FAIL injects.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_emu_internal.h"
#include "nccl_emu_internal.h"

namespace {

std::atomic<int64_t> g_collectives{0};
std::atomic<int64_t> g_running{0};

const char* kind_name(int32_t kind) {
  switch (kind) {
    case kAllReduce:
      return "allreduce";
    case kBroadcast:
      return "broadcast";
    case kReduceScatter:
      return "reducescatter";
    default:
      return "allgather";
  }
}

bool reduces(int32_t kind) { return kind == kAllReduce || kind == kReduceScatter; }

std::string describe(const Descriptor& d) {
  std::string s = cat("#", d.seq, " ", kind_name(d.kind), " count=", d.count, " ",
                      type_name(static_cast<ncclDataType_t>(d.datatype)));
  if (reduces(d.kind)) s += cat(" op=", d.op);
  if (d.kind == kBroadcast) s += cat(" root=", d.root);
  return s;
}

// Every rank called the same collective as this one (checked on a collective's first chunk).
ncclResult_t check_same_call(ncclComm* c, const Descriptor& d, size_t parity) {
  for (int r = 0; r < c->nranks; ++r) {
    const Descriptor& o = c->ranks[r].desc[parity];
    if (o.seq != d.seq || o.count != d.count || o.kind != d.kind || o.datatype != d.datatype ||
        o.op != d.op || o.root != d.root) {
      set_async(c, ncclInvalidUsage);
      return fail(ncclInvalidUsage, cat("rank ", c->rank, " called ", describe(d), " but rank ", r,
                                        " called ", describe(o)));
    }
  }
  return ncclSuccess;
}

// Where chunk [off, off + m) of a collective's staged data goes on this rank, once every rank
// has staged its own: reduced (allreduce; reduce-scatter, only the part in this rank's block of
// d.count), the root's (broadcast) or every rank's (allgather, rank r's to block r).
void combine(ncclComm* c, const Descriptor& d, size_t set, size_t off, size_t m, const void* send,
             unsigned char* out) {
  const ncclDataType_t t = static_cast<ncclDataType_t>(d.datatype);
  const size_t elem = type_size(t);
  const auto op = static_cast<ncclRedOp_t>(d.op);
  if (d.kind == kAllReduce) {
    reduce_any(t, op, c, set, out + off * elem, m);
  } else if (d.kind == kBroadcast) {
    if (!(c->rank == d.root && send == out))
      std::memcpy(out + off * elem, c->slot(set, d.root), m * elem);
  } else if (d.kind == kReduceScatter) {
    const size_t lo = static_cast<size_t>(c->rank) * d.count, hi = lo + d.count;
    const size_t from = std::max(lo, off), to = std::min(hi, off + m);
    if (from >= to) return;
    std::vector<unsigned char> sum(m * elem);
    reduce_any(t, op, c, set, sum.data(), m);
    std::memcpy(out + (from - lo) * elem, sum.data() + (from - off) * elem, (to - from) * elem);
  } else {
    for (int r = 0; r < c->nranks; ++r) {
      unsigned char* to = out + (static_cast<size_t>(r) * d.count + off) * elem;
      if (r == c->rank && to == static_cast<const unsigned char*>(send) + off * elem) continue;
      std::memcpy(to, c->slot(set, r), m * elem);
    }
  }
}

// Runs one collective chunk by chunk: stage, barrier, combine. Arguments are already checked.
// A reduce-scatter stages all nranks x count elements of its send buffer (each chunk reduced
// like an allreduce, kept where it falls in this rank's block); an allgather its count.
ncclResult_t run(ncclComm* c, const Descriptor& d, const void* send, void* recv) {
  const char* what = kind_name(d.kind);
  const size_t elem = type_size(static_cast<ncclDataType_t>(d.datatype));
  const size_t per_chunk = c->chunk_bytes / elem;
  const size_t parity = d.seq % 2;
  const size_t total =
      d.kind == kReduceScatter ? static_cast<size_t>(c->nranks) * d.count : d.count;
  c->ranks[c->rank].desc[parity] = d;
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);
  for (size_t off = 0; off < total; off += per_chunk) {
    const size_t m = std::min(per_chunk, total - off);
    const size_t set = c->chunk_seq++ % 2;
    if (d.kind != kBroadcast || c->rank == d.root) {
      std::memcpy(c->slot(set, c->rank), in + off * elem, m * elem);
    }
    ncclResult_t rc = barrier(c, what);
    if (rc != ncclSuccess) return rc;
    if (off == 0 && (rc = check_same_call(c, d, parity)) != ncclSuccess) return rc;
    combine(c, d, set, off, m, send, out);
  }
  return ncclSuccess;
}

// A collective as called, for running it at call time or later from its stream's queue.
struct Call {
  const char* fn;
  CollectiveKind kind;
  size_t count;
  ncclDataType_t datatype;
  ncclRedOp_t op;
  int root;
  const void* send;
  void* recv;
  bool inject;     // the failure DDP_NCCL_EMU_FAIL asks for
  int64_t number;  // of the allreduce calls on this communicator
};

// Runs a checked collective now. A queued one whose communicator failed meanwhile does nothing
// (the first error's message stays the one ncclGetLastError reports).
ncclResult_t perform(ncclComm* c, const Call& call) {
  std::lock_guard<std::mutex> lk(c->run_mu);
  const auto e = static_cast<ncclResult_t>(c->async_error.load());
  if (e != ncclSuccess) return e;
  if (call.inject) {
    // As an asynchronous failure in NCCL: the call itself succeeds, the error shows later.
    set_async(c, ncclSystemError);
    fail(ncclSystemError, cat(call.fn, ": rank ", c->rank, ": injected failure of allreduce #",
                              call.number, " (DDP_NCCL_EMU_FAIL)"));
    return ncclSuccess;
  }
  if (call.count == 0) return ncclSuccess;
  const Descriptor d{++c->coll_seq,
                     call.count,
                     call.kind,
                     call.datatype,
                     reduces(call.kind) ? static_cast<int32_t>(call.op) : -1,
                     call.root};
  g_running.fetch_add(1);
  const ncclResult_t rc = run(c, d, call.send, call.recv);
  g_running.fetch_sub(1);
  return rc;
}

// Queues the collective on the stream (the CUDA emulation's deferred mode) and returns
// ncclSuccess, or runs it now and returns its result. On a capturing stream it becomes a node
// of the graph (NCCL supports capture since 2.9): it runs at every launch of the graph, with
// the buffers of the call, on whichever rank's graph the launch replays.
ncclResult_t issue(ncclComm* c, const Call& call, cudaStream_t stream) {
  const uint64_t serial = c->serial;
  bool capturing = false;
  const cudaError_t capture = ddp_emu::host_work_capture(stream, &capturing);
  if (capture != cudaSuccess) {
    return fail(ncclUnhandledCudaError,
                cat(call.fn, ": rank ", c->rank, ": the stream refused it (",
                    ddp_emu::error_name(capture), ")"));
  }
  if (capturing) {
    ddp_emu::enqueue_host_work(stream, [c, serial, call] {
      if (enter_live(c, serial) == nullptr) return;  // destroyed before this launch of the graph
      (void)perform(c, call);
      leave_live(c);
    });
    return ncclSuccess;
  }
  c->queued.fetch_add(1);
  auto queued = [c, serial, call] {
    // Destroyed or aborted before its stream got here: aborted with it, as in NCCL.
    if (enter_live(c, serial) == nullptr) return;
    (void)perform(c, call);
    c->queued.fetch_sub(1);
    leave_live(c);
  };
  if (ddp_emu::enqueue_host_work(stream, queued)) return ncclSuccess;
  c->queued.fetch_sub(1);
  return perform(c, call);
}

// The checks every collective makes before touching shared state, as NCCL's argument checks.
// root is -1 for an allreduce (every rank sends).
ncclResult_t check_collective(const char* fn, ncclComm* c, const void* send, void* recv,
                              size_t send_count, size_t recv_count, ncclDataType_t t, int root,
                              cudaStream_t stream) {
  if (!c) return fail(ncclInvalidArgument, cat(fn, ": comm is NULL"));
  if (!is_live(c)) {
    return fail(ncclInvalidArgument, cat(fn, ": comm is not a live communicator (destroyed?)"));
  }
  if (root != -1 && (root < 0 || root >= c->nranks)) {
    return fail(ncclInvalidArgument, cat(fn, ": root=", root, " is not in [0, ", c->nranks, ")"));
  }
  const bool send_used = root == -1 || root == c->rank;
  if (t < 0 || t >= ncclNumTypes) {
    return fail(ncclInvalidArgument, cat(fn, ": invalid datatype ", static_cast<int>(t)));
  }
  if (c->state.load() == kJoining) {
    std::lock_guard<std::mutex> lk(c->mu);
    poll_join_locked(c);
  }
  if (c->state.load() == kJoining && c->async_error.load() == ncclSuccess) {
    return fail(ncclInvalidUsage, cat(fn, ": rank ", c->rank,
                                      ": communicator init is still in progress; wait until "
                                      "ncclCommGetAsyncError reports ncclSuccess"));
  }
  if (c->state.load() == kFinalized) {
    return fail(ncclInvalidUsage, cat(fn, ": rank ", c->rank, ": communicator is finalized"));
  }
  // Neither check runs the stream's queued work nor touches the CUDA error state.
  if (!ddp_emu::stream_exists(stream)) {
    return fail(ncclUnhandledCudaError, cat(fn, ": invalid stream"));
  }
  if (send_count == 0 || recv_count == 0) return ncclSuccess;
  const size_t elem = type_size(t);
  if (std::max(send_count, recv_count) > SIZE_MAX / elem) {
    return fail(ncclInvalidArgument, cat(fn, ": count overflows"));
  }
  const size_t send_bytes = send_count * elem, recv_bytes = recv_count * elem;
  if (send_used && (!send || !ddp_emu::is_device_memory(send, send_bytes))) {
    return fail(ncclInvalidArgument, cat(fn, ": rank ", c->rank, ": sendbuff ", send, " is not ",
                                         send_bytes, " bytes of device memory"));
  }
  if (!recv || !ddp_emu::is_device_memory(recv, recv_bytes)) {
    return fail(ncclInvalidArgument, cat(fn, ": rank ", c->rank, ": recvbuff ", recv, " is not ",
                                         recv_bytes, " bytes of device memory"));
  }
  return ncclSuccess;
}

// The operator and the type of a reduction, as NCCL checks them (and the types the emulation
// reduces).
ncclResult_t check_reduction(const char* fn, ncclRedOp_t op, ncclDataType_t datatype) {
  if (op < 0 || op >= ncclNumOps) {
    return fail(ncclInvalidArgument,
                cat(fn, ": invalid reduction operator ", static_cast<int>(op)));
  }
  if (datatype >= 0 && datatype < ncclNumTypes && !reducible(datatype)) {
    return fail(ncclInvalidArgument, cat(fn, ": ", type_name(datatype),
                                         " reductions are not supported by the emulation"));
  }
  return ncclSuccess;
}

ncclResult_t async_error_of(ncclComm* c, const char* fn) {
  const auto e = static_cast<ncclResult_t>(c->async_error.load());
  if (e == ncclSuccess) return e;
  return fail(e, cat(fn, ": rank ", c->rank, ": communicator has an asynchronous error (",
                     result_string(e), ")"));
}

}  // namespace

extern "C" {

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  DDP_EMU_COUNT_CALL();
  const char* fn = "ncclAllReduce";
  ncclResult_t rc = check_reduction(fn, op, datatype);
  if (rc != ncclSuccess) return rc;
  rc = check_collective(fn, comm, sendbuff, recvbuff, count, count, datatype, -1, stream);
  if (rc != ncclSuccess) return rc;
  g_collectives.fetch_add(1);
  ++comm->allreduce_calls;
  rc = async_error_of(comm, fn);
  if (rc != ncclSuccess) return rc;
  const bool inject = comm->rank == comm->fail_rank && comm->allreduce_calls == comm->fail_at;
  if (count == 0 && !inject) return ncclSuccess;
  return issue(comm,
               Call{fn, kAllReduce, count, datatype, op, -1, sendbuff, recvbuff, inject,
                    comm->allreduce_calls},
               stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  DDP_EMU_COUNT_CALL();
  const char* fn = "ncclBroadcast";
  if (root < 0) return fail(ncclInvalidArgument, cat(fn, ": root=", root, " is negative"));
  ncclResult_t rc =
      check_collective(fn, comm, sendbuff, recvbuff, count, count, datatype, root, stream);
  if (rc != ncclSuccess) return rc;
  g_collectives.fetch_add(1);
  rc = async_error_of(comm, fn);
  if (rc != ncclSuccess) return rc;
  if (count == 0) return ncclSuccess;
  return issue(comm,
               Call{fn, kBroadcast, count, datatype, ncclSum, root, sendbuff, recvbuff, false, 0},
               stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  DDP_EMU_COUNT_CALL();
  const char* fn = "ncclReduceScatter";
  ncclResult_t rc = check_reduction(fn, op, datatype);
  if (rc != ncclSuccess) return rc;
  const size_t ranks = comm != nullptr && is_live(comm) ? static_cast<size_t>(comm->nranks) : 1;
  if (recvcount > SIZE_MAX / ranks) return fail(ncclInvalidArgument, cat(fn, ": count overflows"));
  rc = check_collective(fn, comm, sendbuff, recvbuff, ranks * recvcount, recvcount, datatype, -1,
                        stream);
  if (rc != ncclSuccess) return rc;
  g_collectives.fetch_add(1);
  rc = async_error_of(comm, fn);
  if (rc != ncclSuccess || recvcount == 0) return rc;
  return issue(comm,
               Call{fn, kReduceScatter, recvcount, datatype, op, -1, sendbuff, recvbuff, false, 0},
               stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  DDP_EMU_COUNT_CALL();
  const char* fn = "ncclAllGather";
  const size_t ranks = comm != nullptr && is_live(comm) ? static_cast<size_t>(comm->nranks) : 1;
  if (sendcount > SIZE_MAX / ranks) return fail(ncclInvalidArgument, cat(fn, ": count overflows"));
  ncclResult_t rc = check_collective(fn, comm, sendbuff, recvbuff, sendcount, ranks * sendcount,
                                     datatype, -1, stream);
  if (rc != ncclSuccess) return rc;
  g_collectives.fetch_add(1);
  rc = async_error_of(comm, fn);
  if (rc != ncclSuccess || sendcount == 0) return rc;
  return issue(comm,
               Call{fn, kAllGather, sendcount, datatype, ncclSum, -1, sendbuff, recvbuff, false, 0},
               stream);
}

}  // extern "C"

namespace ddp_nccl_emu {

int64_t collective_count() { return g_collectives.load(); }

int64_t running_collectives() { return g_running.load(); }

}  // namespace ddp_nccl_emu
