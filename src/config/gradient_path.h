// The gradient path of a job: every decision about how gradients go from backward to the
// update — allreduce or reduce-scatter with a parameter allgather, the update fused into the
// reduce-scatters, the norm and non-finite totals first or riding on the allgather, a
// hierarchy across nodes, 16-bit buckets on the wire, dynamic loss scaling — resolved once from the
// config, the rank's device and backend and where the ranks are, with its lines for the startup log
// and every refusal. The config's loader refuses what it can know before placement
// (gradient_path_refusal); the trainer resolves the rest (resolve_gradient_path). Nothing
// downstream decides any of it again.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ddp/config.h"

namespace ddp {

/// Where the ranks of a job are: all of them, those of this rank's node, and whether every node
/// has the same number (collective to learn: rank_layout, comm/agreement.h).
struct RankLayout {
  int ranks = 1;
  int local_ranks = 1;                   ///< on this rank's node
  int fewest_local = 1, most_local = 1;  ///< the ranks of the smallest and the largest node
  bool several_nodes() const { return ranks > local_ranks; }
  bool equal_nodes() const { return fewest_local == most_local; }
};

/// How the buckets travel, fixed before the gradient arena exists.
struct BucketWire {
  /// distributed.compression: buckets cast to 16 bits and summed in that type across ranks
  /// (None or a 16-bit type, never PowerSgd).
  Compression format = Compression::None;
  /// On one node's shared memory too (distributed.compression_on_node).
  bool on_node = false;
  /// Summed on each node's shared memory, then across nodes chunk by chunk.
  bool hierarchical = false;
  /// May the arenas be memory the ranks of a node map together (distributed.shared_memory).
  bool shared_memory = true;
  /// distributed.compression_sum: how the 16-bit values are added across ranks.
  CompressedSum sum = CompressedSum::Wire;
};

struct GradientPath {
  /// distributed.shard_optimizer: each bucket reduce-scattered, each rank updates its parts,
  /// a parameter allgather brings the others'.
  bool sharded = false;
  /// Sharded, distributed.overlap_optimizer where it applies: the update runs on each part as
  /// its reduce-scatter sums it, during backward.
  bool fused_update = false;
  /// Sharded: the ranks' norm and non-finite totals travel before the update (clipping and
  /// skip_step decide from them; NCCL's allgather carries no riders), not on the allgather.
  bool totals_first = false;
  /// Each step counts the non-finite values of the averaged gradient (on a GPU a host sync,
  /// so only where such steps are skipped).
  bool scans_gradients = true;
  /// training.loss_scaling resolved: the loss gradient is scaled and the averaged gradient
  /// unscaled, checked and skipped on overflow (so the path scans it, totals first).
  bool loss_scaling = false;
  /// Buckets padded to equal parts per rank (NCCL's reduce-scatter and allgather).
  bool equal_parts = false;
  /// distributed.compression powersgd: each bucket's matrices sent as factors of this rank
  /// (comm/powersgd.h), after powersgd_start_step optimizer steps summed whole; 0: off.
  int powersgd_rank = 0;
  int64_t powersgd_start_step = 0;
  /// training.bitwise_across_world_sizes: samples per chunk of the global batch, each chunk's
  /// gradient computed alone and the chunks summed exactly (train/chunked_gradients.h), not
  /// by the Reducer's buckets; 0: off.
  int64_t exact_chunk = 0;
  BucketWire wire;
  /// The startup log's lines about the path ("" lines never).
  std::vector<std::string> description;

  /// "allreduce" or "reduce-scatter": what one bucket's collective is, for messages and traces.
  const char* collective() const { return sharded ? "reduce-scatter" : "allreduce"; }
};

/// A config key and why its value cannot be: "distributed.hierarchical", "on does not apply...".
struct PathRefusal {
  std::string key;
  std::string message;
};

/// What the config alone refuses (device: cuda named; an unresolved backend counts as NCCL on
/// a GPU), or nothing.
std::optional<PathRefusal> gradient_path_refusal(const TrainConfig& cfg);

/// The path of a rank on `device` with the resolved `backend` (Mpi or Nccl), every rank of the
/// job the same. Throws ddp::Error "key: message" for what cannot be.
GradientPath resolve_gradient_path(const TrainConfig& cfg, Device device, BackendChoice backend,
                                   const RankLayout& layout);

}  // namespace ddp
