// The shared memory of the ranks of one node (MPI shared-memory windows), as the MPI
// communicator uses it: every rank's gradient arena mapped by every rank, so a bucket's
// allreduce is a reduce-scatter and an allgather done with loads and stores; the node's one copy
// of the parameters (the sharded optimizer); and, on the first rank, a control segment with the
// futex barrier between those phases (shm_barrier.h) and the slots of a small allgather.
// Every collective here runs on the communicator's lane and waits with its deadline.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "comm/compression.h"
#include "comm/gradient_communicator.h"
#include "comm/mpi/lane.h"
#include "comm/mpi/shm_barrier.h"
#include "core/tensor.h"

namespace ddp {

class NodeWindow {
 public:
  /// Doubles per rank that allgather() passes through the control segment: the riders, and the
  /// chunks' facts of training.bitwise_across_world_sizes (2 per chunk of a step and 1 per
  /// parameter tensor; more go through MPI).
  static constexpr size_t kSlotDoubles = 256;
  static_assert(kSlotDoubles >= ScalarRiders::kMaxDoubles, "the riders ride in one slot");

  /// Over `comm` (the ranks that share memory; not owned), waiting on `lane`'s deadline;
  /// spin = false: the allreduce's barriers never spin (see SpinBudget). Allocates nothing
  /// until asked.
  NodeWindow(MPI_Comm comm, Lane& lane, bool spin);
  /// Frees the windows: collective, so only while no collective was lost.
  ~NodeWindow();
  NodeWindow(const NodeWindow&) = delete;
  NodeWindow& operator=(const NodeWindow&) = delete;

  /// Collective, once (the communicator's gradient_arena() checks): a zeroed gradient arena of
  /// `numel` floats per rank, every rank's mapped here.
  float* allocate_gradients(size_t numel);
  /// Collective, once (parameter_arena() checks): the node's one zeroed copy of `numel`
  /// parameters, on the first rank.
  float* allocate_parameters(size_t numel);

  /// Collective, once: a zeroed array of `count` doubles per rank for exact sums
  /// (training.bitwise_across_world_sizes), every rank's mapped here.
  double* allocate_exact(size_t count);
  /// Whether `data` is this rank's exact-sum array.
  bool holds_exact(const double* data) const {
    return exact_window_ != MPI_WIN_NULL && data == exact_peers_[static_cast<size_t>(rank_)];
  }

  /// Whether [data, data + count) lies in this rank's gradient arena.
  bool holds_gradients(const float* data, size_t count) const {
    return window_ != MPI_WIN_NULL && data >= arena_ && data + count <= arena_ + arena_numel_;
  }
  /// Whether `arena` is the shared parameter arena.
  bool holds_parameters(const float* arena) const {
    return parameter_window_ != MPI_WIN_NULL && arena == parameters_;
  }
  /// Where `data` starts in this rank's gradient arena (holds_gradients).
  size_t offset_of(const float* data) const { return static_cast<size_t>(data - arena_); }
  /// Whether allgather() can run (a control segment exists).
  bool has_barrier() const { return barrier_ != nullptr; }

  /// distributed.compression_on_node: each bucket rounded to `format` before its peers read it,
  /// and the sums rounded after every addition, or added in float32 and rounded once
  /// (`sum`: distributed.compression_sum). None: plain float32 sums.
  void set_rounding(Compression format, CompressedSum sum) {
    rounding_ = format;
    sum_ = sum;
  }

  /// Sum of [offset, offset + count) over every rank's arena, into every rank's arena, the same
  /// bits on every rank. `across_nodes`, if set, is applied to this rank's reduced chunk before
  /// the peers copy it (the hierarchical allreduce with the other nodes).
  void allreduce(size_t offset, size_t count,
                 const std::function<void(float* chunk, size_t count)>& across_nodes);
  /// The sum of `part` of the bucket [offset, offset + count), into this rank's arena or to
  /// `consume`. No barrier after it: peers may still read this rank's bucket until the next
  /// allgather.
  void reduce_scatter(size_t offset, size_t count, Span part,
                      const HostGradientCommunicator::PartConsumer& consume);
  /// The sum of every rank's exact-sum array, each part handed to `consume` (this rank's part
  /// summed into its array, the others read from their owners'). Its values must have exact
  /// partial sums (comm/exact_sum.h): the order of the additions does not matter. Peers may
  /// still read this rank's array when it returns: a rank writes its array again only after a
  /// collective of all the node's ranks that follows this one (HostGradientCommunicator::
  /// allreduce_exact_async's contract), which saves a barrier a step.
  void allreduce_exact(const HostGradientCommunicator::ExactConsumer& consume);
  /// Every rank's `count` (≤ kSlotDoubles) values, in rank order, into `all`; its one barrier
  /// also says every rank has written its part of the shared parameters.
  void allgather(const double* mine, size_t count, double* all);

 private:
  void allocate_control();
  void barrier(SpinBudget& spin);
  void round_own_bucket(size_t offset, size_t count);
  void reduce_in_rank_order(size_t offset, size_t count,
                            const HostGradientCommunicator::PartConsumer* consume = nullptr);

  MPI_Comm comm_;
  Lane& lane_;
  int rank_ = 0, size_ = 1;
  MPI_Win window_ = MPI_WIN_NULL;
  MPI_Win control_window_ = MPI_WIN_NULL;
  MPI_Win parameter_window_ = MPI_WIN_NULL;
  MPI_Win exact_window_ = MPI_WIN_NULL;
  std::vector<double*> exact_peers_;  // every rank's exact-sum array, mapped here
  size_t exact_count_ = 0;
  std::unique_ptr<ShmBarrier> barrier_;
  SpinBudget spin_[3];         // one per barrier of the allreduce: their waits differ
  SpinBudget gather_spin_;     // the barrier of the small allgather
  SpinBudget no_spin_{false};  // where Lane::may_spin_here() says no
  double* slots_ = nullptr;    // the small allgather's two sets of slots (control segment)
  size_t parity_ = 0;          // the set the next small allgather uses
  std::vector<float*> peers_;  // every rank's arena, mapped here
  float* arena_ = nullptr;
  size_t arena_numel_ = 0;
  float* parameters_ = nullptr;
  Compression rounding_ = Compression::None;
  CompressedSum sum_ = CompressedSum::Wire;
};

}  // namespace ddp
