// The config schema: every key of TrainConfig declared once (name, nesting, member, rule,
// owning data.format, whether a resume must keep it, a one-line doc). The reader, the writer,
// the validator, the resume fingerprint, --list-config-keys and the docs check all walk it.
#pragma once

#include <array>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "ddp/config.h"

namespace ddp {

/// Upper bounds of numeric keys, far beyond what a run needs. Each keeps what is derived from
/// the key inside its type (int64 products and sums, nanoseconds, size_t bytes, float32
/// operands); products of several keys (epochs x an epoch's steps, a micro-batch's bytes, ...)
/// are checked in validation, against each other and the machine (src/config/resources.h).
namespace bounds {
constexpr double kSteps = 1e12;             ///< optimizer steps (max_steps, intervals, schedules)
constexpr double kEpochs = 1e9;             ///< room for "until stopped"
constexpr double kSamples = 1e12;           ///< generated samples
constexpr double kWidth = 1e9;              ///< a layer's width (the kernels' int dimensions)
constexpr double kBatch = 1e9;              ///< samples per rank per micro-batch
constexpr double kAccumulate = 1e6;         ///< micro-batches per optimizer step
constexpr double kPrefetch = 65536;         ///< batches the loader holds ahead
constexpr double kLoaderWorkers = 64;       ///< threads that assemble batches
constexpr double kGpu = 65535;              ///< a GPU ordinal
constexpr double kPowerSgdRank = 65536;     ///< PowerSGD factors' columns
constexpr double kKept = 1e6;               ///< checkpoints kept
constexpr double kFlightEntries = 1e6;      ///< collectives a flight recorder keeps
constexpr double kSkew = 1e6;               ///< a slowest rank's time over the median's
constexpr double kPeakTflops = 1e9;         ///< one rank's peak TFLOP/s (a zettaFLOP/s)
constexpr double kTimeoutS = 1e9;           ///< 1e18 ns: a deadline on the steady clock fits int64
constexpr double kBucketMiB = 1e9;          ///< 2^50 bytes: the cap in bytes fits size_t
constexpr double kByteMiB = 1.0 / 1048576;  ///< one byte: a smaller cap would be 0 bytes
constexpr double kFloat32 = FLT_MAX;        ///< numbers the kernels read as float32
constexpr double kMinScale = FLT_MIN;       ///< 2^-126: a loss scale whose inverse is normal
constexpr double kMaxScale = 0x1p126;       ///< 2^126: a loss scale whose inverse is normal
}  // namespace bounds

/// What the schema says of a key besides its name, member and type; the default is the
/// struct's. Built in a chain: Key().at_least(1).at_most(1e6).resume().doc("...").
struct Key {
  enum class Rule {
    None,
    AtLeast,
    NotBelow,
    Positive,
    NonNegative,
    Fraction,
    UnitInterval,
    NonEmpty,
    Equals,
    OffOrAbove
  };
  Rule rule = Rule::None;
  int64_t min = 0;          ///< AtLeast: the smallest integer (each entry of a list)
  double lo = 0;            ///< NotBelow: the smallest number; OffOrAbove: the bound
  const char* lo_is = "";   ///< NotBelow: what the smallest number is, for messages
  double max = HUGE_VAL;    ///< the largest value (each entry of a list); HUGE_VAL: none
  const char* only = "";    ///< Equals: the one accepted string
  uint32_t owners = 0;      ///< a bit per data.format the key applies to; 0: to every one
  const char* misuse = "";  ///< added when the key is set for another format
  bool must_match = false;  ///< a resume must keep this key's value
  const char* text = "";    ///< the one-line doc

  Key& at_least(int64_t lo) {
    min = lo;
    return set(Rule::AtLeast);
  }
  /// A number >= smallest, which messages explain as `meaning` ("one byte").
  Key& not_below(double smallest, const char* meaning = "") {
    lo = smallest;
    lo_is = meaning;
    return set(Rule::NotBelow);
  }
  /// The largest value of an integer or number key, besides its rule; integer bounds are
  /// whole numbers below 2^53, so they compare exactly.
  Key& at_most(double hi) {
    max = hi;
    return *this;
  }
  bool bounded() const { return max != HUGE_VAL; }
  Key& positive() { return set(Rule::Positive); }
  Key& non_negative() { return set(Rule::NonNegative); }
  /// In [0, 1) (each entry of a list).
  Key& fraction() { return set(Rule::Fraction); }
  /// In (0, 1].
  Key& unit_interval() { return set(Rule::UnitInterval); }
  Key& non_empty() { return set(Rule::NonEmpty); }
  /// 0 (off), or a number > `smallest`.
  Key& off_or_above(double smallest) {
    lo = smallest;
    return set(Rule::OffOrAbove);
  }
  Key& equals(const char* value) {
    only = value;
    return set(Rule::Equals);
  }
  Key& only_for(std::initializer_list<DataFormat> formats, const char* note = "") {
    for (const DataFormat f : formats) owners |= bit(f);
    misuse = note;
    return *this;
  }
  bool applies_to(DataFormat format) const { return owners == 0 || (owners & bit(format)) != 0; }
  /// The formats the key applies to, as "idx" or "idx or npy"; "" for every format.
  std::string owners_text() const {
    std::string out;
    for (const auto& [format, name] : EnumNames<DataFormat>::table) {
      if (owners & bit(format)) out += (out.empty() ? "" : " or ") + std::string(name);
    }
    return out;
  }
  Key& resume() {
    must_match = true;
    return *this;
  }
  Key& doc(const char* line) {
    text = line;
    return *this;
  }

 private:
  Key& set(Rule r) {
    rule = r;
    return *this;
  }
  static uint32_t bit(DataFormat f) { return 1u << static_cast<unsigned>(f); }
};

// ---------------------------------------------------------------------------------------------
// The table. A visitor has field(name, member, Key) and section(name, visit(V&)).

template <typename V>
void visit_split(SplitSource& s, V& v, bool train) {
  v.field("images", s.images,
          Key().only_for({DataFormat::Idx}).doc("IDX images file (.gz or raw)"));
  v.field("features", s.features,
          Key()
              .only_for({DataFormat::Npy})
              .doc(".npy [samples, ...] of uint8 (read as v/255), float16 or float32"));
  v.field("labels", s.labels,
          Key()
              .only_for({DataFormat::Idx, DataFormat::Npy})
              .doc("IDX labels file (.gz or raw), or .npy [samples] of integers"));
  v.field("path", s.path,
          Key().only_for({DataFormat::Csv}).doc("CSV file: the features, then the integer label"));
  if (train) {
    v.field("samples", s.samples,
            Key()
                .only_for({DataFormat::Synthetic})
                .at_least(1)
                .at_most(bounds::kSamples)
                .resume()
                .doc("generated samples"));
  } else {
    v.field("samples", s.samples,
            Key()
                .only_for({DataFormat::Synthetic})
                .at_least(0)
                .at_most(bounds::kSamples)
                .doc("generated samples; 0: none"));
  }
}

template <typename V>
void visit_data(DataConfig& d, V& v) {
  v.field("format", d.format, Key().resume().doc("how the splits are read"));
  v.field("dir", d.dir, Key().doc("base directory of relative data paths"));
  v.section("train", [&](V& sub) { visit_split(d.train, sub, true); });
  v.section("test", [&](V& sub) { visit_split(d.test, sub, false); });
  v.field("shuffle", d.shuffle,
          Key().resume().doc("reshuffle every epoch (training.seed + epoch)"));
  v.field("drop_last", d.drop_last, Key().resume().doc("drop an epoch's leftover samples"));
  v.field("csv_header", d.csv_header,
          Key().only_for({DataFormat::Csv}).resume().doc("the first CSV line is a header"));
  v.field("seed", d.seed,
          Key()
              .only_for({DataFormat::Synthetic}, "; the shuffle seed is training.seed")
              .resume()
              .doc("seed of the synthetic data generator"));
  v.field(
      "prefetch", d.prefetch,
      Key().at_least(1).at_most(bounds::kPrefetch).doc("batches the loader thread prepares ahead"));
  v.field("workers", d.workers,
          Key()
              .at_least(0)
              .at_most(bounds::kLoaderWorkers)
              .doc("threads that assemble batches; 0: 1 on CPUs, up to 4 per GPU"));
  v.field("share_on_node", d.share_on_node,
          Key().doc("a node's ranks map one copy of the data (/dev/shm)"));
  v.field("normalize", d.normalize,
          Key().resume().doc(
              "none; standardize (each feature by the training split's mean, std); [mean, std]"));
}

template <typename V>
void visit_model(ModelConfig& m, V& v) {
  v.field("layers", m.layers,
          Key()
              .at_least(1)
              .at_most(bounds::kWidth)
              .resume()
              .doc("layer widths, input first; at least 2 entries"));
  v.field("activation", m.activation,
          Key().equals("relu").resume().doc("nonlinearity between Linear layers"));
  v.field("init_from", m.init_from, Key().doc(".safetensors file with the initial weights"));
}

template <typename V>
void visit_optimizer(OptimizerConfig& o, V& v) {
  v.field("name", o.name, Key().resume().doc("torch.optim.SGD, Adam or AdamW"));
  v.field("lr", o.lr, Key().positive().at_most(bounds::kFloat32).resume().doc("learning rate"));
  v.field("momentum", o.momentum,
          Key().non_negative().at_most(bounds::kFloat32).resume().doc("sgd: momentum factor"));
  v.field(
      "dampening", o.dampening,
      Key().non_negative().at_most(bounds::kFloat32).resume().doc("sgd: dampening for momentum"));
  v.field("weight_decay", o.weight_decay,
          Key()
              .non_negative()
              .at_most(bounds::kFloat32)
              .resume()
              .doc("sgd, adam: L2 penalty added to the gradient; adamw: decoupled decay"));
  v.field("nesterov", o.nesterov,
          Key().resume().doc("sgd: Nesterov momentum; needs momentum > 0, dampening 0"));
  v.field("betas", o.betas,
          Key().fraction().resume().doc("adam, adamw: decay of the gradient's moments"));
  v.field("eps", o.eps,
          Key()
              .non_negative()
              .at_most(bounds::kFloat32)
              .resume()
              .doc("adam, adamw: added to the denominator"));
  v.field("amsgrad", o.amsgrad,
          Key().resume().doc("adam, adamw: divide by the largest second moment so far"));
}

template <typename V>
void visit_scheduler(SchedulerConfig& s, V& v) {
  v.field("name", s.name,
          Key().resume().doc("lr after warmup: constant, StepLR, CosineAnnealingLR, linear decay"));
  v.field("warmup_steps", s.warmup_steps,
          Key()
              .at_least(0)
              .at_most(bounds::kSteps)
              .resume()
              .doc("optimizer steps of linear warmup (LinearLR); 0: none"));
  v.field("warmup_start_factor", s.warmup_start_factor,
          Key().unit_interval().resume().doc("warmup starts at this fraction of optimizer.lr"));
  v.field("min_lr", s.min_lr,
          Key().non_negative().resume().doc("cosine, linear: the lr at scheduler.total_steps"));
  v.field("total_steps", s.total_steps,
          Key()
              .at_least(0)
              .at_most(bounds::kSteps)
              .resume()
              .doc("cosine, linear: steps of warmup and decay; 0: the run's optimizer steps"));
  v.field("step_size", s.step_size,
          Key()
              .at_least(0)
              .at_most(bounds::kSteps)
              .resume()
              .doc("step: optimizer steps between decays (StepLR)"));
  v.field("gamma", s.gamma, Key().positive().resume().doc("step: the factor of each decay"));
}

template <typename V>
void visit_training(TrainingConfig& t, V& v) {
  v.field("epochs", t.epochs,
          Key().at_least(1).at_most(bounds::kEpochs).doc("passes over the training split"));
  v.field("batch_size", t.batch_size,
          Key().at_least(1).at_most(bounds::kBatch).doc("samples per rank per micro-batch"));
  v.field("accumulate_steps", t.accumulate_steps,
          Key().at_least(1).at_most(bounds::kAccumulate).doc("micro-batches per optimizer step"));
  v.field("seed", t.seed, Key().resume().doc("seed of weight init and shuffle"));
  v.field("log_every", t.log_every,
          Key()
              .at_least(0)
              .at_most(bounds::kSteps)
              .doc("optimizer steps between progress lines; 0: epochs only"));
  v.field("max_steps", t.max_steps,
          Key()
              .at_least(0)
              .at_most(bounds::kSteps)
              .doc("stop after this many optimizer steps; 0: no limit"));
  v.field("print_shapes", t.print_shapes, Key().doc("each rank prints its replica's shapes"));
  v.field("resume", t.resume, Key().doc("\"\": fresh; auto: newest checkpoint; or a file"));
  v.field("start_over", t.start_over,
          Key().doc("a fresh run moves an earlier run's files in output.dir aside"));
  v.field("nan_policy", t.nan_policy, Key().doc("what a non-finite loss or gradient does"));
  v.field("clip_grad_norm", t.clip_grad_norm,
          Key()
              .non_negative()
              .at_most(bounds::kFloat32)
              .resume()
              .doc("clip the averaged gradient to this global L2 norm; 0: off"));
  v.field("precision", t.precision,
          Key().doc("GEMM operands: fp32, bf16, or fp16 (GPUs); float32 accumulation"));
  v.field("loss_scaling", t.loss_scaling,
          Key().doc("dynamic loss scaling (GradScaler); auto: on with fp16"));
  v.field("loss_scale_init", t.loss_scale_init,
          Key()
              .not_below(bounds::kMinScale, "2^-126")
              .at_most(bounds::kMaxScale)
              .doc("the first loss scale; it and its inverse normal float32"));
  v.field("loss_scale_growth_interval", t.loss_scale_growth_interval,
          Key()
              .at_least(1)
              .at_most(bounds::kSteps)
              .doc("steps without overflow before the loss scale doubles"));
  v.field("cuda_graphs", t.cuda_graphs,
          Key().doc("GPUs: replay each step's device work as a CUDA graph (same bits)"));
  v.field("bitwise_across_world_sizes", t.bitwise_across_world_sizes,
          Key().doc("the same weights, bitwise, on any number of ranks (CPU ranks)"));
  v.field("bitwise_chunk_size", t.bitwise_chunk_size,
          Key()
              .at_least(1)
              .at_most(bounds::kBatch)
              .doc("bitwise_across_world_sizes: samples per chunk; divides batch_size"));
}

template <typename V>
void visit_distributed(DistributedConfig& d, V& v) {
  v.field("backend", d.backend, Key().doc("gradient allreduce; auto: nccl on GPUs, else mpi"));
  v.field("bucket_cap_mb", d.bucket_cap_mb,
          Key()
              .not_below(bounds::kByteMiB, "one byte")
              .at_most(bounds::kBucketMiB)
              .doc("MiB cap of later buckets; the least is one byte"));
  v.field("first_bucket_mb", d.first_bucket_mb,
          Key()
              .not_below(bounds::kByteMiB, "one byte")
              .at_most(bounds::kBucketMiB)
              .doc("MiB cap of bucket 0; the least is one byte"));
  v.field("shared_memory", d.shared_memory,
          Key().doc("one node: allreduce in an MPI shared-memory window"));
  v.field("shard_optimizer", d.shard_optimizer,
          Key().doc("each rank keeps 1/N of the optimizer state (ZeRO-1)"));
  v.field("overlap_optimizer", d.overlap_optimizer,
          Key().doc("sharded: update each bucket as its reduce-scatter sums it, in backward"));
  v.field("compression", d.compression,
          Key().doc("gradients cross ranks summed as none, bf16 or fp16, or as powersgd factors"));
  v.field("compression_on_node", d.compression_on_node,
          Key().doc("compress on one node's shared-memory path too"));
  v.field("compression_sum", d.compression_sum,
          Key().doc("bf16/fp16: add in the 16-bit type (wire) or in float32, rounding once"));
  v.field("powersgd_rank", d.powersgd_rank,
          Key().at_least(1).at_most(bounds::kPowerSgdRank).doc("powersgd: the factors' rank"));
  v.field("powersgd_start_step", d.powersgd_start_step,
          Key().at_least(0).at_most(bounds::kSteps).doc("powersgd: steps summed whole first"));
  v.field("hierarchical", d.hierarchical,
          Key().doc("allreduce within each node, then across nodes; auto: when it helps"));
  v.field("tune", d.tune,
          Key().doc("auto: measure the links at start-up, choose buckets and compression"));
  v.field(
      "gpus", d.gpus,
      Key().at_least(0).at_most(bounds::kGpu).doc("GPU of each local rank; []: local rank % GPUs"));
  v.field("nccl_algo", d.nccl_algo, Key().doc("auto: NCCL's choice; ring sets NCCL_ALGO=Ring"));
  v.field("timeout_s", d.timeout_s,
          Key().positive().at_most(bounds::kTimeoutS).doc("seconds any collective may take"));
}

template <typename V>
void visit_config(TrainConfig& c, V& v) {
  v.field("device", c.device, Key().doc("where replicas compute; auto: cuda if a GPU is seen"));
  v.section("model", [&](V& s) { visit_model(c.model, s); });
  v.section("data", [&](V& s) { visit_data(c.data, s); });
  v.section("optimizer", [&](V& s) { visit_optimizer(c.optimizer, s); });
  v.section("scheduler", [&](V& s) { visit_scheduler(c.scheduler, s); });
  v.section("training", [&](V& s) { visit_training(c.training, s); });
  v.section("distributed", [&](V& s) { visit_distributed(c.distributed, s); });
  v.section("output", [&](V& s) {
    s.field("dir", c.output.dir, Key().non_empty().doc("where metrics and the model go"));
    s.field("save_model", c.output.save_model, Key().doc("write <dir>/model.safetensors"));
    s.field("trace", c.output.trace, Key().doc("write <dir>/trace.json (Chrome trace)"));
    s.field("trace_steps", c.output.trace_steps,
            Key().at_least(0).at_most(bounds::kSteps).doc("optimizer steps traced; 0: all"));
    s.field("flight_recorder", c.output.flight_recorder,
            Key()
                .at_least(0)
                .at_most(bounds::kFlightEntries)
                .doc("collectives each rank keeps for <dir>/flight/rank-R.json; 0: off"));
    s.field("flight_record_at_exit", c.output.flight_record_at_exit,
            Key().doc("write the flight records when training ends well too"));
    s.field("straggler_threshold", c.output.straggler_threshold,
            Key()
                .off_or_above(1)
                .at_most(bounds::kSkew)
                .doc("name the slowest rank past this x the median's compute + data; 0: off"));
    s.field("peak_tflops", c.output.peak_tflops,
            Key()
                .non_negative()
                .at_most(bounds::kPeakTflops)
                .doc("a rank's peak TFLOP/s for MFU; 0: the GPU's table or the measured GEMM"));
  });
  v.section("checkpoint", [&](V& s) {
    s.field("dir", c.checkpoint.dir, Key().doc("\"\": <output.dir>/checkpoints"));
    s.field("every_steps", c.checkpoint.every_steps,
            Key()
                .at_least(0)
                .at_most(bounds::kSteps)
                .doc("checkpoint every N optimizer steps; 0: off"));
    s.field("every_epochs", c.checkpoint.every_epochs,
            Key().at_least(0).at_most(bounds::kEpochs).doc("checkpoint every N epochs; 0: off"));
    s.field("keep_last", c.checkpoint.keep_last,
            Key().at_least(0).at_most(bounds::kKept).doc("checkpoints kept; 0: all"));
    s.field("async", c.checkpoint.async,
            Key().doc("write from a copy on a thread while training goes on"));
  });
}

// ---------------------------------------------------------------------------------------------
// Enums through their name tables.

template <typename T, typename = void>
struct IsConfigEnum : std::false_type {};
template <typename T>
struct IsConfigEnum<T, std::void_t<decltype(EnumNames<T>::table)>> : std::true_type {};

/// Fixed-length lists of numbers (optimizer.betas).
template <typename T>
struct IsNumberList : std::false_type {};
template <size_t N>
struct IsNumberList<std::array<double, N>> : std::true_type {};

/// The name of `v` in its table.
template <typename E>
const char* enum_name(E v) {
  for (const auto& entry : EnumNames<E>::table) {
    if (entry.first == v) return entry.second;
  }
  return "(unknown)";
}

/// The value named `name`; false when no value has that name.
template <typename E>
bool parse_enum(const std::string& name, E& out) {
  for (const auto& entry : EnumNames<E>::table) {
    if (name == entry.second) {
      out = entry.first;
      return true;
    }
  }
  return false;
}

/// "a or b" for two names, "one of a, b, c" for more.
template <typename E>
std::string enum_choices() {
  const auto& t = EnumNames<E>::table;
  if (t.size() == 2) return std::string(t[0].second) + " or " + t[1].second;
  std::string out = "one of ";
  for (size_t i = 0; i < t.size(); ++i) out += std::string(i ? ", " : "") + t[i].second;
  return out;
}

// ---------------------------------------------------------------------------------------------
// The schema as rows, for --list-config-keys, the resume fingerprint and the docs check.

struct KeyRow {
  std::string path;           ///< "training.batch_size"
  std::string type;           ///< "integer", "number", "bool", "string", "list of integers"
  std::string default_value;  ///< as --print-config writes it
  std::string allowed;        ///< "cpu, cuda, auto", ">= 1", "> 0", "in [1, 1000000]", ... or ""
  std::string maximum;        ///< the largest value of a bounded key, as `allowed` writes it; ""
  std::string format;         ///< the owning data.format, or ""
  bool resume = false;        ///< a resume must keep the value
  std::string doc;
};

/// Every key, in the order of the config file.
std::vector<KeyRow> config_schema();

/// The rows as an aligned text table with a header line (ddp-train --list-config-keys).
std::string config_schema_table();

}  // namespace ddp
