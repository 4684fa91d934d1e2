// The tuner's candidates, their lossiness and the choice (tuning.h).
#include "config/tuning.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <tuple>

#include "config/schema.h"
#include "ddp/errors.h"

namespace ddp {

namespace {

bool sixteen_bits(Compression c) { return c == Compression::Bf16 || c == Compression::Fp16; }

std::string mib(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// The formats tried: none, the config's 16-bit format (bf16 for powersgd) with either sum,
// PowerSGD at the config's rank and above; none lossier than the config.
std::vector<TuneCandidate> formats(const DistributedConfig& d) {
  std::vector<TuneCandidate> out;
  const auto add = [&](Compression c, CompressedSum sum, int64_t rank) {
    if (lossiness(c, sum, rank) > lossiness(d)) return;
    TuneCandidate t;
    t.compression = c;
    t.sum = sum;
    t.powersgd_rank = rank;
    out.push_back(t);
  };
  add(d.compression, d.compression_sum,
      d.compression == Compression::PowerSgd ? d.powersgd_rank : 0);
  add(Compression::None, CompressedSum::Wire, 0);
  const Compression half = sixteen_bits(d.compression) ? d.compression : Compression::Bf16;
  if (d.compression != Compression::None) {
    add(half, CompressedSum::Float32, 0);
    add(half, CompressedSum::Wire, 0);
  }
  if (d.compression == Compression::PowerSgd) {
    for (const int64_t r : {2 * d.powersgd_rank, 4 * d.powersgd_rank}) {
      if (r <= static_cast<int64_t>(bounds::kPowerSgdRank))
        add(Compression::PowerSgd, CompressedSum::Wire, r);
    }
  }
  return out;
}

// The bucket caps tried, (first, later): the config's first.
std::vector<std::pair<double, double>> caps(const DistributedConfig& d, bool tune_buckets,
                                            double model_mib) {
  std::vector<std::pair<double, double>> out{{d.first_bucket_mb, d.bucket_cap_mb}};
  if (!tune_buckets) return out;
  out.emplace_back(d.bucket_cap_mb, d.bucket_cap_mb);
  const double whole = std::max(1.0, std::ceil(model_mib));
  if (whole > d.bucket_cap_mb) out.emplace_back(whole, whole);
  return out;
}

std::vector<bool> hierarchies(const DistributedConfig& d, const RankLayout& l) {
  if (d.hierarchical == Hierarchy::On) return {true};
  if (d.hierarchical == Hierarchy::Off || !l.several_nodes() || l.local_ranks < 2) return {false};
  return {true, false};
}

bool resolves(const TrainConfig& cfg, const RankLayout& layout) {
  try {
    resolve_gradient_path(cfg, Device::CPU, BackendChoice::Mpi, layout);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// A 16-bit format on one node's shared memory without compression_on_node: float32 there, the
// same path as none (which the candidates hold).
bool float32_after_all(const TuneCandidate& t, const DistributedConfig& d, const RankLayout& l) {
  return sixteen_bits(t.compression) && !l.several_nodes() && d.shared_memory &&
         !d.compression_on_node;
}

auto key(const TuneCandidate& t) {
  return std::make_tuple(t.compression, t.sum, t.hierarchical, t.powersgd_rank, t.first_bucket_mb,
                         t.bucket_cap_mb);
}

}  // namespace

WireCost fit_wire_cost(size_t small, double small_seconds, size_t large, double large_seconds) {
  WireCost c;
  if (large > small)
    c.beta = std::max(0.0, (large_seconds - small_seconds) / static_cast<double>(large - small));
  c.alpha = std::max(0.0, small_seconds - c.beta * static_cast<double>(small));
  return c;
}

std::string TuneCandidate::name() const {
  std::string s = to_string(compression);
  if (compression == Compression::PowerSgd) s += " rank " + std::to_string(powersgd_rank);
  if (sixteen_bits(compression))
    s += sum == CompressedSum::Float32 ? " (float32 sums)" : " (16-bit sums)";
  if (hierarchical) s += ", hierarchical";
  return s + ", buckets " + mib(first_bucket_mb) + " + " + mib(bucket_cap_mb) + " MiB";
}

TrainConfig TuneCandidate::applied(const TrainConfig& cfg) const {
  TrainConfig out = cfg;
  DistributedConfig& d = out.distributed;
  d.tune = Tune::Off;
  d.compression = compression;
  d.compression_sum = sixteen_bits(compression) ? sum : CompressedSum::Wire;
  d.compression_on_node = sixteen_bits(compression) && cfg.distributed.compression_on_node;
  if (compression == Compression::PowerSgd) d.powersgd_rank = powersgd_rank;
  d.hierarchical = hierarchical ? Hierarchy::On : Hierarchy::Off;
  d.first_bucket_mb = first_bucket_mb;
  d.bucket_cap_mb = bucket_cap_mb;
  return out;
}

int lossiness(Compression compression, CompressedSum sum, int64_t powersgd_rank) {
  if (compression == Compression::None) return 0;
  if (sixteen_bits(compression)) return sum == CompressedSum::Float32 ? 1 : 2;
  const int64_t most = static_cast<int64_t>(bounds::kPowerSgdRank);
  return 3 + static_cast<int>(most - std::min(powersgd_rank, most));
}

int lossiness(const DistributedConfig& d) {
  return lossiness(d.compression, d.compression_sum, d.powersgd_rank);
}

std::vector<TuneCandidate> tune_candidates(const TrainConfig& cfg, const RankLayout& layout,
                                           bool tune_buckets, double model_mib) {
  const DistributedConfig& d = cfg.distributed;
  std::vector<TuneCandidate> out;
  for (const auto& [first, cap] : caps(d, tune_buckets, model_mib)) {
    for (const bool hierarchical : hierarchies(d, layout)) {
      for (TuneCandidate t : formats(d)) {
        t.hierarchical = hierarchical;
        t.first_bucket_mb = first;
        t.bucket_cap_mb = cap;
        const bool seen = std::any_of(out.begin(), out.end(),
                                      [&](const TuneCandidate& o) { return key(o) == key(t); });
        if (!seen && !float32_after_all(t, d, layout) && resolves(t.applied(cfg), layout))
          out.push_back(t);
      }
    }
  }
  return out;
}

size_t choose_candidate(const std::vector<TunePrediction>& predictions, double tolerance,
                        double min_gain) {
  double fastest = predictions.front().seconds;
  for (const TunePrediction& p : predictions) fastest = std::min(fastest, p.seconds);
  size_t best = predictions.size();
  const auto loss = [&](size_t i) {
    const TuneCandidate& c = predictions[i].candidate;
    return lossiness(c.compression, c.sum, c.powersgd_rank);
  };
  for (size_t i = 0; i < predictions.size(); ++i) {
    if (predictions[i].seconds > std::max(fastest * (1.0 + tolerance), fastest + min_gain))
      continue;
    if (best == predictions.size() || loss(i) < loss(best) ||
        (loss(i) == loss(best) && predictions[i].seconds < predictions[best].seconds))
      best = i;
  }
  return best;
}

}  // namespace ddp
