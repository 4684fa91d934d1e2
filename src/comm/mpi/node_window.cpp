// The node's shared-memory windows (node_window.h).
#include "comm/mpi/node_window.h"

#include <algorithm>
#include <cstdint>
#include <new>
#include <utility>

#include "core/check.h"

namespace ddp {

NodeWindow::NodeWindow(MPI_Comm comm, Lane& lane, bool spin) : comm_(comm), lane_(lane) {
  DDP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  DDP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  for (SpinBudget& b : spin_) b = SpinBudget(spin);
}

NodeWindow::~NodeWindow() {
  for (MPI_Win* w : {&window_, &control_window_, &parameter_window_, &exact_window_}) {
    if (*w == MPI_WIN_NULL) continue;
    MPI_Win_unlock_all(*w);
    MPI_Win_free(w);
  }
}

namespace {

// A shared window of `bytes` per rank over `comm` (`size` ranks), locked for its life: every
// rank's segment as mapped here, each checked to hold `bytes` (`what` names it in the error).
std::vector<void*> allocate_per_rank(MPI_Comm comm, int size, size_t bytes, int unit,
                                     MPI_Win* window, const char* what) {
  void* base = nullptr;
  DDP_MPI_CHECK(MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytes), unit, MPI_INFO_NULL, comm,
                                        &base, window));
  DDP_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, *window));
  std::vector<void*> segments(static_cast<size_t>(size));
  for (int q = 0; q < size; ++q) {
    MPI_Aint peer_bytes = 0;
    int disp = 0;
    DDP_MPI_CHECK(MPI_Win_shared_query(*window, q, &peer_bytes, &disp, &segments[q]));
    DDP_CHECK(static_cast<size_t>(peer_bytes) == bytes, "rank " << q << "'s " << what << " holds "
                                                                << peer_bytes
                                                                << " bytes, this rank's " << bytes);
  }
  return segments;
}

template <typename T>
std::vector<T*> typed(const std::vector<void*>& segments) {
  std::vector<T*> out;
  for (void* s : segments) out.push_back(static_cast<T*>(s));
  return out;
}

}  // namespace

// One shared window holds every rank's gradient arena; each rank knows where its peers' arenas
// are mapped. The control segment follows, then a barrier so that no rank starts before every
// arena is zeroed.
float* NodeWindow::allocate_gradients(size_t numel) {
  peers_ = typed<float>(allocate_per_rank(comm_, size_, numel * sizeof(float), sizeof(float),
                                          &window_, "gradient arena"));
  allocate_control();
  arena_ = peers_[static_cast<size_t>(rank_)];
  arena_numel_ = numel;
  std::fill(arena_, arena_ + numel, 0.0f);
  SpinBudget once;
  barrier(once);
  return arena_;
}

// A window of its own, laid out as the gradient arena's: each rank's array, every rank's mapped.
double* NodeWindow::allocate_exact(size_t count) {
  exact_peers_ = typed<double>(allocate_per_rank(
      comm_, size_, count * sizeof(double), sizeof(double), &exact_window_, "exact-sum array"));
  if (!barrier_) allocate_control();
  exact_count_ = count;
  double* mine = exact_peers_[static_cast<size_t>(rank_)];
  std::fill(mine, mine + count, 0.0);
  SpinBudget once;
  barrier(once);
  return mine;
}

// The first rank's segment of a second window holds the node's one copy of the parameters; the
// others allocate nothing and map it.
float* NodeWindow::allocate_parameters(size_t numel) {
  void* base = nullptr;
  const MPI_Aint bytes = rank_ == 0 ? static_cast<MPI_Aint>(numel * sizeof(float)) : 0;
  DDP_MPI_CHECK(MPI_Win_allocate_shared(bytes, sizeof(float), MPI_INFO_NULL, comm_, &base,
                                        &parameter_window_));
  DDP_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, parameter_window_));
  MPI_Aint shared_bytes = 0;
  int disp = 0;
  void* shared = nullptr;
  DDP_MPI_CHECK(MPI_Win_shared_query(parameter_window_, 0, &shared_bytes, &disp, &shared));
  DDP_CHECK(static_cast<size_t>(shared_bytes) == numel * sizeof(float),
            "the shared parameter arena on rank 0 holds " << shared_bytes << " bytes, not "
                                                          << numel * sizeof(float));
  if (!barrier_) allocate_control();
  parameters_ = static_cast<float*>(shared);
  if (rank_ == 0) std::fill(parameters_, parameters_ + numel, 0.0f);
  SpinBudget once;
  barrier(once);
  return parameters_;
}

// The first rank's segment of the control window: the barrier's state, then the slots of the
// small allgather (two sets, used alternately, kSlotDoubles per rank each).
void NodeWindow::allocate_control() {
  void* base = nullptr;
  constexpr size_t kAlign = alignof(ShmBarrierState);
  const size_t slot_bytes = 2 * static_cast<size_t>(size_) * kSlotDoubles * sizeof(double);
  const size_t total = sizeof(ShmBarrierState) + kAlign + slot_bytes;
  const MPI_Aint bytes = rank_ == 0 ? static_cast<MPI_Aint>(total) : 0;
  DDP_MPI_CHECK(MPI_Win_allocate_shared(bytes, 1, MPI_INFO_NULL, comm_, &base, &control_window_));
  DDP_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, control_window_));
  MPI_Aint state_bytes = 0;
  int disp = 0;
  void* state = nullptr;
  DDP_MPI_CHECK(MPI_Win_shared_query(control_window_, 0, &state_bytes, &disp, &state));
  DDP_CHECK(static_cast<size_t>(state_bytes) == total,
            "the shared barrier's window on rank 0 holds " << state_bytes << " bytes");
  // Mappings start on a page, so the same offset is aligned in every rank's mapping.
  const size_t pad = (kAlign - reinterpret_cast<uintptr_t>(state) % kAlign) % kAlign;
  void* at = static_cast<char*>(state) + pad;
  auto* s = rank_ == 0 ? new (at) ShmBarrierState() : static_cast<ShmBarrierState*>(at);
  slots_ = reinterpret_cast<double*>(static_cast<char*>(at) + sizeof(ShmBarrierState));
  DDP_MPI_CHECK(MPI_Win_sync(control_window_));
  DDP_MPI_CHECK(MPI_Barrier(comm_));
  barrier_ = std::make_unique<ShmBarrier>(s, size_);
}

// The node's barrier, with the lane's deadline.
void NodeWindow::barrier(SpinBudget& spin) {
  SpinBudget& budget = lane_.may_spin_here() ? spin : no_spin_;
  switch (barrier_->arrive_and_wait(lane_.timeout(), lane_.cancel_flag(), budget)) {
    case WaitResult::Done:
      return;
    case WaitResult::TimedOut:
      lane_.set_broken();
      lane_.record_timeout();
      throw_collective_timeout(lane_.current(), lane_.timeout());
    case WaitResult::Cancelled:
      DDP_THROW(lane_.current() << " cancelled: an earlier collective was lost");
  }
}

// Rank r sums chunk r (in rank order 0..N-1, so the result is the same bits on every rank and
// every run) into its own arena; then every rank copies the other chunks from their owners.
void NodeWindow::allreduce(size_t offset, size_t count,
                           const std::function<void(float*, size_t)>& across_nodes) {
  const size_t n = static_cast<size_t>(size_);
  const size_t chunk = (count + n - 1) / n;
  auto range = [&](size_t q) {
    const size_t lo = std::min(count, q * chunk);
    return std::make_pair(lo, std::min(count, lo + chunk));
  };
  round_own_bucket(offset, count);
  barrier(spin_[0]);  // every rank's bucket is written
  const auto [lo, hi] = range(static_cast<size_t>(rank_));
  float* mine = peers_[static_cast<size_t>(rank_)] + offset;
  reduce_in_rank_order(offset + lo, hi - lo);
  if (across_nodes && hi > lo) across_nodes(mine + lo, hi - lo);
  barrier(spin_[1]);  // every chunk is reduced
  for (size_t q = 0; q < n; ++q) {
    if (q == static_cast<size_t>(rank_)) continue;
    const auto [qlo, qhi] = range(q);
    std::copy(peers_[q] + offset + qlo, peers_[q] + offset + qhi, mine + qlo);
  }
  barrier(spin_[2]);  // nobody reads this bucket any more: backward may overwrite it
}

// As allreduce: rank r sums chunk r over every rank's array (exact sums, so in any order); then
// every chunk goes to `consume` from its owner's array, not copied into this rank's. No barrier
// at the end: see node_window.h.
void NodeWindow::allreduce_exact(const HostGradientCommunicator::ExactConsumer& consume) {
  const size_t n = static_cast<size_t>(size_), count = exact_count_;
  const size_t chunk = (count + n - 1) / n;
  auto range = [&](size_t q) {
    const size_t lo = std::min(count, q * chunk);
    return std::make_pair(lo, std::min(count, lo + chunk));
  };
  double* mine = exact_peers_[static_cast<size_t>(rank_)];
  barrier(spin_[0]);  // every rank's array is written
  const auto [lo, hi] = range(static_cast<size_t>(rank_));
  for (size_t q = 0; q < n; ++q) {
    if (q == static_cast<size_t>(rank_)) continue;
    const double* from = exact_peers_[q];
    for (size_t i = lo; i < hi; ++i) mine[i] += from[i];
  }
  barrier(spin_[1]);  // every chunk is summed
  for (size_t q = 0; q < n; ++q) {
    const auto [qlo, qhi] = range(q);
    if (qhi > qlo) consume(qlo, exact_peers_[q] + qlo, qhi - qlo);
  }
}

void NodeWindow::reduce_scatter(size_t offset, size_t count, Span part,
                                const HostGradientCommunicator::PartConsumer& consume) {
  round_own_bucket(offset, count);
  barrier(spin_[0]);  // every rank's bucket is written
  reduce_in_rank_order(offset + part.offset, part.numel, consume ? &consume : nullptr);
}

// This rank's values into its slots of this call's set, one barrier, every rank's read back.
// The sets alternate: a rank can only write the same set again after the next call's barrier,
// which every rank reaches after reading.
void NodeWindow::allgather(const double* mine, size_t count, double* all) {
  double* set = slots_ + parity_ * static_cast<size_t>(size_) * kSlotDoubles;
  parity_ ^= 1;
  std::copy(mine, mine + count, set + static_cast<size_t>(rank_) * kSlotDoubles);
  barrier(gather_spin_);
  for (size_t q = 0; q < static_cast<size_t>(size_); ++q)
    std::copy(set + q * kSlotDoubles, set + q * kSlotDoubles + count, all + q * count);
}

// compression_on_node: this rank's bucket rounded to the format in place, before its peers read
// it, so the sums add values of the format, as the compressed path across nodes.
void NodeWindow::round_own_bucket(size_t offset, size_t count) {
  if (rounding_ != Compression::None)
    round_to(rounding_, peers_[static_cast<size_t>(rank_)] + offset, count);
}

// The sum over ranks of [offset, offset + count) of every rank's arena, in rank order 0..N-1
// (the same bits on every rank and every run, whoever computes it), into this rank's arena or,
// block by block, to `consume`; with rounding, rounded to the format after every addition, or
// once at the end (CompressedSum::Float32).
void NodeWindow::reduce_in_rank_order(size_t offset, size_t count,
                                      const HostGradientCommunicator::PartConsumer* consume) {
  const size_t n = static_cast<size_t>(size_);
  float* mine = peers_[static_cast<size_t>(rank_)] + offset;
  constexpr size_t kBlock = 1024;
  float acc[kBlock];
  for (size_t b = 0; b < count; b += kBlock) {
    const size_t len = std::min(kBlock, count - b);
    const float* first = peers_[0] + offset + b;
    std::copy(first, first + len, acc);
    const bool each = rounding_ != Compression::None && sum_ == CompressedSum::Wire;
    for (size_t q = 1; q < n; ++q) {
      const float* src = peers_[q] + offset + b;
      if (each) {
        add_rounded(rounding_, src, len, acc);
        continue;
      }
      for (size_t i = 0; i < len; ++i) acc[i] += src[i];
    }
    if (rounding_ != Compression::None && !each) round_to(rounding_, acc, len);
    if (consume != nullptr) {
      (*consume)(mine + b, acc, len);
    } else {
      std::copy(acc, acc + len, mine + b);
    }
  }
}

}  // namespace ddp
