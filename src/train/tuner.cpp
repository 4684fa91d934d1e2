// distributed.tune: auto (tuner.h): measure, predict, choose, say.
#include "train/tuner.h"

#include <unistd.h>

#include <algorithm>
#include <iomanip>
#include <map>
#include <sstream>

#include "comm/environment.h"
#include "comm/link_probe.h"
#include "comm/powersgd_communicator.h"
#include "comm/reducer.h"
#include "config/tuning.h"
#include "core/clock.h"
#include "core/random.h"
#include "nn/sequential.h"

namespace ddp {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kFloatsPerMiB = kMiB / sizeof(float);
// A lossier setting must be predicted this much faster to be chosen: more than the probe's noise
// (identical paths measure up to ~12% apart at sub-millisecond sizes on a busy core).
constexpr double kTolerance = 0.10;
// Nor is a gain below this worth it, however large a fraction (a model whose whole exchange is
// a few latencies, which a busy core's noise decides).
constexpr double kMinGainSeconds = 100e-6;

// The model's parameters, in registration order, without their memory (an unbound model).
struct ModelShape {
  std::vector<size_t> numel, rows;
  double mib = 0.0;
};

ModelShape model_shape(const TrainConfig& cfg) {
  const Sequential model(cfg.model.layers, cfg.model.activation, 1);
  ModelShape m{model.parameter_numels(), model.parameter_rows(), 0.0};
  for (const size_t n : m.numel) m.mib += static_cast<double>(n) / kFloatsPerMiB;
  return m;
}

BucketPlan plan_of(const ModelShape& m, const TuneCandidate& c, size_t align) {
  return compute_bucket_plan(m.numel, static_cast<size_t>(c.first_bucket_mb * kMiB),
                             static_cast<size_t>(c.bucket_cap_mb * kMiB), align);
}

// Collective. The model's one-core-per-rank form applies where no rank has a spare core for its
// communication (its affinity, and the machine's cores over its node's ranks): the step is
// compute then Σ over buckets, and fewer buckets pay fewer latencies. With spare cores the
// allreduce overlaps backward, which the model does not predict: the caps stay as configured.
bool one_core_per_rank(ProcessGroup& comm) {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  long cores = usable_cpus();
  if (online > 0) cores = std::min(cores, online / std::max(1, comm.local_size()));
  double spare = cores >= 2 ? 1.0 : 0.0;
  comm.allreduce(&spare, 1, ReduceOp::Max);
  return spare == 0.0;
}

// "float32", "bf16 (float32 sums), hierarchical": the wire a candidate's whole buckets take.
std::string wire_name(const BucketWire& w) {
  std::string s = "float32";
  if (w.format != Compression::None)
    s = std::string(to_string(w.format)) +
        (w.sum == CompressedSum::Float32 ? " (float32 sums)" : " (16-bit sums)");
  if (w.on_node) s += ", on shared memory too";
  return w.hierarchical ? s + ", hierarchical" : s;
}

std::string cost_text(const WireCost& c) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(0) << c.alpha * 1e6 << " us + " << std::setprecision(2)
    << c.beta * kFloatsPerMiB * 1e3 << " ms/MiB";
  return s.str();
}

std::string ms(double seconds) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2) << seconds * 1e3 << " ms";
  return s.str();
}

// One candidate as the model sees it: its resolved path and its buckets.
struct Planned {
  TuneCandidate candidate;
  GradientPath path;
  BucketPlan plan;
};

// Whether two candidates send the same: the same wire or factor rank, the same buckets (caps
// that cut a model alike are one candidate, the first of them).
bool same_step(const Planned& a, const Planned& b) {
  const auto sizes = [](const BucketPlan& plan) {
    std::vector<size_t> n;
    for (const BucketPlan::Bucket& bucket : plan.buckets) n.push_back(bucket.numel);
    return n;
  };
  return wire_name(a.path.wire) == wire_name(b.path.wire) &&
         a.path.powersgd_rank == b.path.powersgd_rank && sizes(a.plan) == sizes(b.plan);
}

// What was measured: each wire's cost, PowerSGD's factor sums and products per rank.
struct Measured {
  std::map<std::string, WireCost> wires;
  WireCost factor_sums;
  std::map<int64_t, double> products;  // seconds a step, by factor rank
};

// PowerSGD's products at factor rank `rank` over `layouts`, every rank's buckets reduced alone
// (their sums left out: probe_factor_sums times those) in rounds timed as a collective is: the
// first round starts Q, the timed ones are warm-started.
double products_seconds(ProcessGroup& comm, const std::vector<PowerSgdLayout>& layouts,
                        int64_t rank) {
  PowerSgdOptions options;
  options.rank = static_cast<int>(rank);
  Rng rng(1);
  std::vector<PowerSgdBucket> buckets;
  std::vector<std::vector<float>> gradients;
  for (const PowerSgdLayout& layout : layouts) {
    buckets.emplace_back(layout.params, layout.numel, options);
    gradients.emplace_back(layout.numel);
    for (float& g : gradients.back()) g = static_cast<float>(rng.uniform(-1e-2, 1e-2));
  }
  const SumOverRanks alone = [](float*, size_t) {};
  return time_collective(comm, 3, [&] {
    for (size_t b = 0; b < buckets.size(); ++b)
      buckets[b].reduce(gradients[b].data(), comm.size(), alone, 1);
  });
}

// The probe's sizes: the largest bucket (at least 1024 floats, at most 4 MiB) and a small one.
ProbeSizes probe_sizes(const std::vector<Planned>& planned) {
  size_t largest = 0;
  for (const Planned& p : planned)
    for (const BucketPlan::Bucket& b : p.plan.buckets) largest = std::max(largest, b.numel);
  ProbeSizes sizes;
  sizes.large = std::clamp(largest, size_t{1024}, size_t{1} << 20);
  sizes.small = std::min(sizes.small, sizes.large / 4);
  return sizes;
}

// Collective, in `planned` order on every rank: each wire once, the factor sums and each
// factor rank's products once.
Measured measure(MpiCommunicator& comm, const std::vector<Planned>& planned,
                 const ModelShape& shape) {
  Measured m;
  const ProbeSizes sizes = probe_sizes(planned);
  bool factors = false;
  for (const Planned& p : planned) {
    const int64_t rank = p.path.powersgd_rank;
    if (rank > 0 && !m.products.count(rank))
      m.products[rank] =
          products_seconds(comm, powersgd_layouts(p.plan, shape.numel, shape.rows), rank);
    factors = factors || rank > 0;
    const std::string wire = wire_name(p.path.wire);
    if (rank == 0 && !m.wires.count(wire)) m.wires[wire] = probe_wire(comm, p.path.wire, sizes);
  }
  if (factors) m.factor_sums = probe_factor_sums(comm, sizes);
  return m;
}

// The gradient exchange of one step: Σ over buckets of the wire's α + β·floats; for PowerSGD
// (its compressed steps) the products and, per bucket, the sums of the whole parameters with P
// and of Q.
double predict(const Planned& p, const Measured& m, const ModelShape& shape) {
  double seconds = 0.0;
  if (p.path.powersgd_rank == 0) {
    const WireCost& wire = m.wires.at(wire_name(p.path.wire));
    for (const BucketPlan::Bucket& b : p.plan.buckets) seconds += wire.seconds(b.numel);
    return seconds;
  }
  PowerSgdOptions options;
  options.rank = static_cast<int>(p.path.powersgd_rank);
  seconds = m.products.at(p.path.powersgd_rank);
  for (const PowerSgdLayout& l : powersgd_layouts(p.plan, shape.numel, shape.rows)) {
    const PowerSgdPlan plan(l.params, l.numel, options);
    const size_t q = plan.q_size(), first = plan.sent_floats() - q;
    if (first > 0) seconds += m.factor_sums.seconds(first);
    if (q > 0) seconds += m.factor_sums.seconds(q);
  }
  return seconds;
}

std::string measured_line(const Measured& m, const RankLayout& l, double seconds) {
  std::ostringstream s;
  s << "tune: measured in " << std::fixed << std::setprecision(2) << seconds << " s on "
    << l.ranks / l.local_ranks << " node(s) x " << l.local_ranks
    << " rank(s), a bucket's collective";
  for (const auto& [wire, cost] : m.wires) s << "; " << wire << " " << cost_text(cost);
  if (!m.products.empty()) s << "; PowerSGD's factor sums " << cost_text(m.factor_sums);
  for (const auto& [rank, t] : m.products) s << "; PowerSGD rank " << rank << " products " << ms(t);
  return s.str();
}

// What the config's compression lets the tuner weigh.
std::string allowed_line(const DistributedConfig& d) {
  if (d.compression == Compression::None)
    return "tune: lossless settings only (distributed.compression: none; bf16 or powersgd there "
           "lets the tuner weigh those too)";
  if (d.compression == Compression::PowerSgd)
    return "tune: settings up to PowerSGD rank " + std::to_string(d.powersgd_rank) +
           " (distributed.compression: powersgd, powersgd_rank); its time is that of the steps "
           "after powersgd_start_step";
  return std::string("tune: settings up to ") + to_string(d.compression) + " summed in " +
         (d.compression_sum == CompressedSum::Float32 ? "float32" : "16 bits") +
         " (distributed.compression; powersgd there lets the tuner weigh PowerSGD too)";
}

// The candidates, each resolved and cut into buckets; those that send the same are one.
std::vector<Planned> plan_candidates(const TrainConfig& cfg, const RankLayout& layout,
                                     const ModelShape& shape, bool buckets, size_t align) {
  std::vector<Planned> planned;
  for (const TuneCandidate& c : tune_candidates(cfg, layout, buckets, shape.mib)) {
    Planned p{c, resolve_gradient_path(c.applied(cfg), Device::CPU, BackendChoice::Mpi, layout),
              plan_of(shape, c, align)};
    const auto same = [&](const Planned& o) { return same_step(o, p); };
    if (std::none_of(planned.begin(), planned.end(), same)) planned.push_back(std::move(p));
  }
  return planned;
}

// The config's own setting as a candidate (its hierarchy as auto resolves it).
TuneCandidate own_setting(const TrainConfig& cfg, const RankLayout& layout) {
  TrainConfig plain = cfg;
  plain.distributed.tune = Tune::Off;
  const DistributedConfig& d = cfg.distributed;
  TuneCandidate own;
  own.compression = d.compression;
  own.sum = d.compression == Compression::Bf16 || d.compression == Compression::Fp16
                ? d.compression_sum
                : CompressedSum::Wire;
  own.powersgd_rank = d.compression == Compression::PowerSgd ? d.powersgd_rank : 0;
  own.hierarchical =
      resolve_gradient_path(plain, Device::CPU, BackendChoice::Mpi, layout).wire.hierarchical;
  own.first_bucket_mb = d.first_bucket_mb;
  own.bucket_cap_mb = d.bucket_cap_mb;
  return own;
}

// One line a candidate: its prediction, the choice and the config's own marked.
std::vector<std::string> prediction_lines(const std::vector<TunePrediction>& predictions,
                                          const TunePrediction& chosen, const std::string& own) {
  std::vector<std::string> lines;
  for (const TunePrediction& p : predictions) {
    const std::string name = p.candidate.name();
    lines.push_back("tune:   " + name + ": " + ms(p.seconds) +
                    " of gradient exchange a step predicted" + (&p == &chosen ? " (chosen)" : "") +
                    (name == own ? " (the config's own)" : ""));
  }
  return lines;
}

}  // namespace

TuneOutcome tune_gradient_path(const TrainConfig& cfg, MpiCommunicator& comm,
                               const RankLayout& layout, size_t align) {
  TuneOutcome out;
  out.cfg = cfg;
  out.cfg.distributed.tune = Tune::Off;
  if (comm.size() == 1) {
    out.lines.push_back("tune: one rank: no gradient crosses ranks, the config's settings kept");
    return out;
  }
  const double start = seconds_now();
  const ModelShape shape = model_shape(cfg);
  const bool buckets = one_core_per_rank(comm);
  const std::vector<Planned> planned = plan_candidates(cfg, layout, shape, buckets, align);
  const Measured m = measure(comm, planned, shape);
  std::vector<TunePrediction> predictions;
  for (const Planned& p : planned) predictions.push_back({p.candidate, predict(p, m, shape)});
  const TunePrediction& chosen =
      predictions[choose_candidate(predictions, kTolerance, kMinGainSeconds)];
  out.cfg = chosen.candidate.applied(cfg);
  out.lines = {measured_line(m, layout, seconds_now() - start), allowed_line(cfg.distributed)};
  for (std::string& line : prediction_lines(predictions, chosen, own_setting(cfg, layout).name()))
    out.lines.push_back(std::move(line));
  out.lines.push_back("tune: chose " + chosen.candidate.name() +
                      (buckets ? ""
                               : " (bucket caps as configured: a rank has a spare core, "
                                 "where the allreduce overlaps backward, which the model "
                                 "does not predict)") +
                      "; written to config.yaml with distributed.tune: off");
  return out;
}

}  // namespace ddp
