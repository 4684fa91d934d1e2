// Training configuration: plain structs with defaults. YAML is only the loader; every
// validation error names the file and the key path (e.g. "run.yaml: training.batch_size: ...").
// Every key is declared once in src/config/schema.h and documented in docs/config.md.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

// Keys with a fixed set of values are enums, parsed once by the loader. Each has ONE name table
// (EnumNames below): the reader, the writer, error messages and to_string all use it.

/// `device`: where the replicas compute (Device in src/core is the resolved one).
enum class DeviceChoice { Cpu, Cuda, Auto };
/// `distributed.backend`; a rank's resolved backend is Mpi or Nccl.
enum class BackendChoice { Auto, Mpi, Nccl };
/// `training.nan_policy`.
enum class NanPolicy { Abort, SkipStep };
/// `data.format`.
enum class DataFormat { Idx, Synthetic, Csv, Npy };
/// `distributed.nccl_algo`.
enum class NcclAlgo { Ring, Auto };
/// `distributed.compression`: the type gradient buckets are summed in across ranks, or
/// PowerSGD's low-rank factors (never a bucket's wire type: comm/powersgd.h).
enum class Compression { None, Bf16, Fp16, PowerSgd };
/// `distributed.compression_sum`: how 16-bit buckets are added across ranks.
enum class CompressedSum { Wire, Float32 };
/// `distributed.hierarchical`: allreduce within each node first, then across nodes.
enum class Hierarchy { Auto, On, Off };
/// `distributed.tune`: the gradient path chosen by measurement at start-up.
enum class Tune { Off, Auto };
/// `training.precision`: the operand type of every Linear's GEMMs (float32 accumulation).
enum class Precision { Fp32, Bf16, Fp16 };
/// `training.loss_scaling`: dynamic loss scaling (torch.cuda.amp.GradScaler); auto: with fp16.
enum class LossScaling { Auto, On, Off };
/// `optimizer.name`.
enum class OptimizerName { Sgd, Adam, AdamW };
/// `scheduler.name`.
enum class SchedulerName { Constant, Step, Cosine, Linear };

/// The names of an enum's values, in the order messages list them.
template <typename E>
struct EnumNames;
template <>
struct EnumNames<DeviceChoice> {
  static constexpr std::array<std::pair<DeviceChoice, const char*>, 3> table{
      {{DeviceChoice::Cpu, "cpu"}, {DeviceChoice::Cuda, "cuda"}, {DeviceChoice::Auto, "auto"}}};
};
template <>
struct EnumNames<BackendChoice> {
  static constexpr std::array<std::pair<BackendChoice, const char*>, 3> table{
      {{BackendChoice::Auto, "auto"}, {BackendChoice::Mpi, "mpi"}, {BackendChoice::Nccl, "nccl"}}};
};
template <>
struct EnumNames<NanPolicy> {
  static constexpr std::array<std::pair<NanPolicy, const char*>, 2> table{
      {{NanPolicy::Abort, "abort"}, {NanPolicy::SkipStep, "skip_step"}}};
};
template <>
struct EnumNames<DataFormat> {
  static constexpr std::array<std::pair<DataFormat, const char*>, 4> table{
      {{DataFormat::Idx, "idx"},
       {DataFormat::Synthetic, "synthetic"},
       {DataFormat::Csv, "csv"},
       {DataFormat::Npy, "npy"}}};
};
template <>
struct EnumNames<NcclAlgo> {
  static constexpr std::array<std::pair<NcclAlgo, const char*>, 2> table{
      {{NcclAlgo::Ring, "ring"}, {NcclAlgo::Auto, "auto"}}};
};
template <>
struct EnumNames<Hierarchy> {
  static constexpr std::array<std::pair<Hierarchy, const char*>, 3> table{
      {{Hierarchy::Auto, "auto"}, {Hierarchy::On, "on"}, {Hierarchy::Off, "off"}}};
};
template <>
struct EnumNames<Tune> {
  static constexpr std::array<std::pair<Tune, const char*>, 2> table{
      {{Tune::Off, "off"}, {Tune::Auto, "auto"}}};
};
template <>
struct EnumNames<CompressedSum> {
  static constexpr std::array<std::pair<CompressedSum, const char*>, 2> table{
      {{CompressedSum::Wire, "wire"}, {CompressedSum::Float32, "float32"}}};
};
template <>
struct EnumNames<Compression> {
  static constexpr std::array<std::pair<Compression, const char*>, 4> table{
      {{Compression::None, "none"},
       {Compression::Bf16, "bf16"},
       {Compression::Fp16, "fp16"},
       {Compression::PowerSgd, "powersgd"}}};
};

template <>
struct EnumNames<Precision> {
  static constexpr std::array<std::pair<Precision, const char*>, 3> table{
      {{Precision::Fp32, "fp32"}, {Precision::Bf16, "bf16"}, {Precision::Fp16, "fp16"}}};
};

template <>
struct EnumNames<LossScaling> {
  static constexpr std::array<std::pair<LossScaling, const char*>, 3> table{
      {{LossScaling::Auto, "auto"}, {LossScaling::On, "on"}, {LossScaling::Off, "off"}}};
};

template <>
struct EnumNames<OptimizerName> {
  static constexpr std::array<std::pair<OptimizerName, const char*>, 3> table{
      {{OptimizerName::Sgd, "sgd"},
       {OptimizerName::Adam, "adam"},
       {OptimizerName::AdamW, "adamw"}}};
};

template <>
struct EnumNames<SchedulerName> {
  static constexpr std::array<std::pair<SchedulerName, const char*>, 4> table{
      {{SchedulerName::Constant, "constant"},
       {SchedulerName::Step, "step"},
       {SchedulerName::Cosine, "cosine"},
       {SchedulerName::Linear, "linear"}}};
};

/// The value's name from its table ("skip_step" for NanPolicy::SkipStep).
const char* to_string(DeviceChoice v);
const char* to_string(BackendChoice v);
const char* to_string(NanPolicy v);
const char* to_string(DataFormat v);
const char* to_string(NcclAlgo v);
const char* to_string(Compression v);
const char* to_string(CompressedSum v);
const char* to_string(Hierarchy v);
const char* to_string(Tune v);
const char* to_string(Precision v);
const char* to_string(LossScaling v);
const char* to_string(OptimizerName v);
const char* to_string(SchedulerName v);

struct ModelConfig {
  std::vector<int64_t> layers;      ///< widths, input first: [784, 256, 256, 10]; >= 2 entries
  std::string activation = "relu";  ///< between Linear layers; "relu" (only choice for now)
  std::string init_from;            ///< optional .safetensors with initial weights
};

/// One split's source. Which fields apply depends on data.format.
struct SplitSource {
  std::string images;    ///< idx: images file (.gz or raw)
  std::string features;  ///< npy: features .npy, [samples, ...] uint8, float16 or float32
  std::string labels;    ///< idx: labels file (.gz or raw); npy: labels .npy, [samples] integers
  std::string path;      ///< csv: the file (features..., label per row)
  int64_t samples = 0;   ///< synthetic: number of samples
  /// True when a source was configured (test split is optional: no test → no evaluation).
  bool configured() const {
    return !images.empty() || !features.empty() || !labels.empty() || !path.empty() || samples > 0;
  }
};

/// `data.normalize`: the transform every feature gets before the model sees it (training,
/// evaluation and prediction alike): x' = (x - mean) / std.
struct Normalization {
  enum class Mode {
    None,         ///< features as read
    Standardize,  ///< each feature's mean and std over the training split
    Fixed         ///< one mean and std for every feature (torchvision's Normalize)
  };
  Mode mode = Mode::None;
  double mean = 0.0, std = 1.0;  ///< Fixed only
  bool operator==(const Normalization& o) const {
    return mode == o.mode && (mode != Mode::Fixed || (mean == o.mean && std == o.std));
  }
  bool operator!=(const Normalization& o) const { return !(*this == o); }
};

struct DataConfig {
  DataFormat format = DataFormat::Synthetic;
  std::string dir;  ///< base directory for relative data paths
  SplitSource train;
  SplitSource test;
  bool shuffle = true;      ///< reshuffle every epoch (seed + epoch)
  bool drop_last = false;   ///< drop the tail instead of padding / partial batch
  bool csv_header = false;  ///< csv: first line is a header
  uint64_t seed = 0;        ///< synthetic: generator seed
  int64_t prefetch = 4;     ///< batches assembled ahead by the loader threads
  /// Threads that assemble batches; 0: 1 on a CPU rank (its core computes), on a GPU rank the
  /// node's cores per rank, at most 4.
  int64_t workers = 0;
  /// The ranks of a node map one copy of each split (in /dev/shm), read by the node's first rank.
  bool share_on_node = true;
  Normalization normalize;  ///< none | standardize | [mean, std]
};

/// torch.optim.SGD, Adam or AdamW; the keys of the others keep their defaults.
struct OptimizerConfig {
  OptimizerName name = OptimizerName::Sgd;
  double lr = 0.01;
  // sgd
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  ///< sgd, adam: L2 added to the gradient; adamw: decoupled decay
  bool nesterov = false;
  // adam, adamw
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  bool amsgrad = false;
};

/// The learning rate of each optimizer step, as torch.optim.lr_scheduler gives it: an optional
/// linear warmup (LinearLR), then constant, StepLR, CosineAnnealingLR or a linear decay.
struct SchedulerConfig {
  SchedulerName name = SchedulerName::Constant;
  int64_t warmup_steps = 0;                ///< steps of linear warmup; 0 = none
  double warmup_start_factor = 1.0 / 3.0;  ///< warmup starts at this fraction of optimizer.lr
  double min_lr = 0.0;                     ///< cosine, linear: the lr the decay ends at
  int64_t total_steps = 0;                 ///< cosine, linear: warmup + decay; 0 = the run's
  int64_t step_size = 0;                   ///< step: steps between decays
  double gamma = 0.1;                      ///< step: the factor of each decay
};

struct TrainingConfig {
  int64_t epochs = 1;
  int64_t batch_size = 64;       ///< per rank, per micro-batch
  int64_t accumulate_steps = 1;  ///< micro-batches per optimizer step (communication on the last)
  uint64_t seed = 0;             ///< init and shuffle seed
  int64_t log_every = 50;        ///< optimizer steps between progress lines; 0 = epoch lines only
  int64_t max_steps = 0;         ///< stop after this many optimizer steps in total; 0 = no limit
  bool print_shapes = false;     ///< each rank prints its replica's input/output shapes once
  /// Continue from a checkpoint: "" (start fresh), "auto" (the newest complete checkpoint in
  /// checkpoint.dir, or fresh when there is none) or the path of a checkpoint file.
  std::string resume;
  /// A fresh run in an output.dir that holds an earlier run's files (checkpoints, metrics,
  /// model) moves them into <dir>/earlier-run-<time>/ instead of refusing to start.
  bool start_over = false;
  /// A non-finite loss or gradient: abort (stop the job naming the step and rank) or
  /// skip_step (every rank skips that optimizer step and training goes on).
  NanPolicy nan_policy = NanPolicy::Abort;
  /// Clip the averaged gradient to this global L2 norm (torch.nn.utils.clip_grad_norm_); 0 = off.
  double clip_grad_norm = 0.0;
  /// fp32, or 16-bit GEMM operands with float32 accumulation (torch.autocast): bf16, or fp16
  /// (GPUs only). Master weights, optimizer state, gradients and checkpoints stay float32.
  Precision precision = Precision::Fp32;
  /// Dynamic loss scaling as torch.cuda.amp.GradScaler does it: the loss gradient times the
  /// scale, the averaged gradient times 1/scale before the non-finite check, clipping and the
  /// update; a step with a non-finite gradient is skipped and halves the scale, and
  /// loss_scale_growth_interval clean steps in a row double it. auto: on with fp16.
  LossScaling loss_scaling = LossScaling::Auto;
  double loss_scale_init = 65536.0;           ///< the first scale (GradScaler's init_scale)
  int64_t loss_scale_growth_interval = 2000;  ///< clean steps before the scale doubles
  /// GPUs: each step's forward, loss, backward and NCCL allreduces captured once as a CUDA
  /// graph and replayed (steps that log, trace or accumulate run eagerly); the same bits.
  bool cuda_graphs = true;
  /// The weights depend on the config and the seed, not on the number of ranks: each step's
  /// gradient is the exact sum of the gradients of chunks of bitwise_chunk_size samples, each
  /// computed alone (train/chunked_gradients.h). CPU ranks; any world size that divides the
  /// global batch's chunk count.
  bool bitwise_across_world_sizes = false;
  int64_t bitwise_chunk_size = 32;  ///< samples per chunk; must divide batch_size
  /// Whether loss scaling is on: on, or auto with fp16 (the gradient path resolves it).
  bool scales_loss() const {
    return loss_scaling == LossScaling::On ||
           (loss_scaling == LossScaling::Auto && precision == Precision::Fp16);
  }
};

struct DistributedConfig {
  /// How gradients are averaged: mpi (CPU memory; on GPUs staged through pinned host memory),
  /// nccl (GPU memory, needs device cuda), auto (nccl on GPUs, mpi on the CPU).
  BackendChoice backend = BackendChoice::Auto;
  double bucket_cap_mb = 25.0;   ///< MiB, buckets after the first
  double first_bucket_mb = 1.0;  ///< MiB, the first bucket (gradients ready earliest)
  /// All ranks on one node: allreduce buckets in place in an MPI shared-memory window.
  bool shared_memory = true;
  /// ZeRO stage 1: each rank keeps the optimizer state of its part of every bucket, gradients
  /// are reduce-scattered and parameters allgathered (on one node: shared, not copied).
  bool shard_optimizer = false;
  /// Sharded on CPU ranks: each bucket's reduce-scatter hands this rank's summed part straight
  /// to the optimizer, during backward (PyTorch ZeroRedundancyOptimizer's overlap_with_ddp), in
  /// one pass over memory; the same bits as after backward. Not with clip_grad_norm or
  /// nan_policy skip_step, which need the whole gradient first.
  bool overlap_optimizer = true;
  /// Gradient buckets travel and are summed in this 16-bit type (PyTorch's bf16_compress_hook
  /// and fp16_compress_hook): each rank casts its pre-scaled bucket, the sum rounds to the type
  /// after every addition, and the result is cast back to float32. Not on one node's
  /// shared-memory path, which moves no bytes over a link, unless compression_on_node.
  /// powersgd (PyTorch's powerSGD_hook): each weight matrix's gradient sent as two factors of
  /// rank powersgd_rank (vectors and matrices too small to gain whole), with warm start and error
  /// feedback, after powersgd_start_step optimizer steps summed whole.
  Compression compression = Compression::None;
  bool compression_on_node = false;
  /// bf16, fp16: wire (PyTorch's hooks) adds the ranks' 16-bit values in the 16-bit type,
  /// rounding after every addition; float32 (Megatron's reduce-scatter with float32
  /// accumulation) adds them in float32 in rank order and rounds once. The same bytes on the
  /// link.
  CompressedSum compression_sum = CompressedSum::Wire;
  int64_t powersgd_rank = 1;
  int64_t powersgd_start_step = 10;
  /// Across nodes: each node sums its ranks' buckets in shared memory, each local rank
  /// allreduces its chunk of that sum across nodes, and the node shares the result (Horovod's
  /// hierarchical allreduce). auto: on with more than one node and more than one rank on each,
  /// for replicated optimizers on the MPI backend.
  Hierarchy hierarchical = Hierarchy::Auto;
  /// auto: at start-up, measure the links and choose the bucket caps, the hierarchy and the
  /// compression by the step-time model, never lossier than the config's own compression
  /// (train/tuner.h); the choice is logged and written to the run's config.yaml (with off).
  Tune tune = Tune::Off;
  /// GPU of each local rank (index = rank within the node); empty: local_rank % visible GPUs.
  std::vector<int64_t> gpus;
  NcclAlgo nccl_algo = NcclAlgo::Auto;  ///< auto (NCCL's own choice) | ring (sets NCCL_ALGO)
  /// Seconds any collective may take before the job is stopped (a dead or stalled peer).
  double timeout_s = 600.0;
};

struct OutputConfig {
  std::string dir = "runs/default";
  bool save_model = true;    ///< write <dir>/model.safetensors at the end
  bool trace = false;        ///< write <dir>/trace.json (Chrome trace format, every rank)
  int64_t trace_steps = 20;  ///< optimizer steps traced (from the first); 0 = all
  /// Collectives each rank remembers for <dir>/flight/rank-<R>.json (0: no flight recorder).
  int64_t flight_recorder = 256;
  bool flight_record_at_exit = false;  ///< also write the records when training ends well
  /// A progress line names the slowest rank when its compute + data wait is this many times the
  /// median rank's; 0: no per-rank report (and no collective for it).
  double straggler_threshold = 1.5;
  /// Peak TFLOP/s of one rank for the summary's MFU; 0: the device's (GPU) or measured (CPU).
  double peak_tflops = 0.0;
};

/// Periodic checkpoints (model, optimizer state, position in the data) for --resume. One is
/// also written when the job is interrupted by SIGTERM/SIGINT/SIGUSR1, and at the end of training
/// when every_steps or every_epochs is set.
struct CheckpointConfig {
  std::string dir;           ///< "" = <output.dir>/checkpoints
  int64_t every_steps = 0;   ///< write after every N optimizer steps (0 = off)
  int64_t every_epochs = 0;  ///< write after every N epochs (0 = off); not with every_steps
  int64_t keep_last = 3;     ///< checkpoints kept (older ones removed); 0 = keep all
  /// Write each checkpoint on a thread from a copy taken at the step boundary; training goes on
  /// while it is written, and the next checkpoint (or the run's end) waits for it.
  bool async = false;
  /// The directory checkpoints go to: dir, or <output_dir>/checkpoints when dir is empty.
  std::string directory(const std::string& output_dir) const {
    return dir.empty() ? output_dir + "/checkpoints" : dir;
  }
  bool periodic() const { return every_steps > 0 || every_epochs > 0; }
};

struct TrainConfig {
  DeviceChoice device = DeviceChoice::Cpu;  ///< auto: cuda when a GPU is visible, else cpu
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  TrainingConfig training;
  DistributedConfig distributed;
  OutputConfig output;
  CheckpointConfig checkpoint;
  std::string source;  ///< the file it was loaded from ("" if built in code)

  /// Samples per optimizer step over all ranks: batch_size x accumulate_steps x world.
  int64_t global_batch(int world) const {
    return training.batch_size * training.accumulate_steps * world;
  }
};

/// Loads `path`, applies `overrides` ("key.path=value", value parsed as YAML), validates.
/// Throws ddp::Error naming the file and key path for: unreadable/malformed YAML, unknown keys,
/// wrong types, out-of-range values, missing data files.
TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});

/// Same, from YAML text (`name` is used in messages in place of a file name). Data files are
/// still checked for existence.
TrainConfig parse_config(const std::string& yaml_text, const std::string& name,
                         const std::vector<std::string>& overrides = {});

/// Validates a config built in code (load/parse call this). Throws naming the key path.
void validate_config(const TrainConfig& cfg);

/// The effective config as YAML (every key, defaults included); parse_config(to_yaml(c)) == c.
std::string to_yaml(const TrainConfig& cfg);

/// Resolves a data path against data.dir (absolute paths and empty dir leave it unchanged).
std::string resolve_data_path(const DataConfig& data, const std::string& path);

}  // namespace ddp
