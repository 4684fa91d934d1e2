// What distributed.tune: auto chooses among, and how: the candidate settings of the gradient
// path (bucket caps, hierarchy, 16-bit wire and its sums, PowerSGD's rank), how lossy each is,
// the cost model of one collective, and the choice among predicted step times. Pure: the
// measurements come from comm/link_probe.h, the driver is train/tuner.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/gradient_path.h"
#include "ddp/config.h"

namespace ddp {

/// One collective of n floats takes alpha + beta * n seconds (the α-β model of docs/scaling.md,
/// fitted to one wire as the buckets would travel on it).
struct WireCost {
  double alpha = 0.0;  ///< seconds
  double beta = 0.0;   ///< seconds per float
  double seconds(size_t floats) const { return alpha + beta * static_cast<double>(floats); }
};

/// The line through two timed sizes (small < large), neither term below zero.
WireCost fit_wire_cost(size_t small, double small_seconds, size_t large, double large_seconds);

/// One setting the tuner may choose: the distributed keys it sets.
struct TuneCandidate {
  Compression compression = Compression::None;
  CompressedSum sum = CompressedSum::Wire;
  bool hierarchical = false;
  int64_t powersgd_rank = 0;  ///< with compression powersgd
  double first_bucket_mb = 1.0;
  double bucket_cap_mb = 25.0;

  /// "bf16 (float32 sums), hierarchical, buckets 1 + 25 MiB".
  std::string name() const;
  /// `cfg` with these keys set and distributed.tune off: what the run trains with, and what
  /// its config.yaml records so that a rerun takes the same path without measuring again.
  TrainConfig applied(const TrainConfig& cfg) const;
};

/// How far a setting's gradients are from float32 sums, as an order: 0 none; 1 16-bit on the
/// wire summed in float32; 2 16-bit summed in 16 bits; PowerSGD above every 16-bit format, the
/// lower its rank the lossier.
int lossiness(Compression compression, CompressedSum sum, int64_t powersgd_rank);
int lossiness(const DistributedConfig& d);

/// What the tuner may try for `cfg` on `layout`, each a path that resolves on CPU ranks with
/// MPI, none of them lossier than the config's own compression, none the same path as another
/// (no 16-bit format on one node's shared memory without compression_on_node: float32 there),
/// the config's own first:
/// - compression none; the config's 16-bit format (bf16 where the config asks for powersgd)
///   with wire and float32 sums; PowerSGD at the config's rank and at 2x and 4x it;
/// - hierarchical on and off where the config says auto and the job spans nodes of several
///   ranks;
/// - with `tune_buckets`, the bucket caps as configured, one cap for every bucket, and the
///   whole model (`model_mib`) in one bucket.
std::vector<TuneCandidate> tune_candidates(const TrainConfig& cfg, const RankLayout& layout,
                                           bool tune_buckets, double model_mib);

/// The step time the model predicts for a candidate.
struct TunePrediction {
  TuneCandidate candidate;
  double seconds = 0.0;
};

/// The index of the choice: the least lossy among those within `tolerance` (relative) or
/// `min_gain` (seconds) of the fastest prediction, the fastest of those on a tie; a faster
/// setting that gains less than both is not worth more loss. `predictions` must not be empty.
size_t choose_candidate(const std::vector<TunePrediction>& predictions, double tolerance,
                        double min_gain);

}  // namespace ddp
