// The gradient path's rules (gradient_path.h): what is refused, what is chosen, what is said.
#include "config/gradient_path.h"

#include <sstream>

#include "core/check.h"

namespace ddp {

namespace {

/// What the rules know of the rank: its device, its backend (Auto before placement) and, once
/// placed, where the ranks are.
struct Facts {
  bool gpu = false;
  BackendChoice backend = BackendChoice::Auto;
  const RankLayout* layout = nullptr;
};

std::optional<PathRefusal> refuse_hierarchy(const DistributedConfig& d, const Facts& f) {
  if (d.shard_optimizer) {
    return PathRefusal{"distributed.hierarchical",
                       "on does not apply to distributed.shard_optimizer, whose reduce-scatter "
                       "and allgather are flat (use auto or off)"};
  }
  if (!d.shared_memory) {
    return PathRefusal{"distributed.hierarchical",
                       "on sums each node's buckets in shared memory and needs "
                       "distributed.shared_memory: true"};
  }
  if (f.gpu && f.backend != BackendChoice::Mpi) {
    return PathRefusal{"distributed.hierarchical",
                       "on applies to the MPI backend; NCCL builds its own hierarchy across nodes "
                       "(use auto or off, or distributed.backend: mpi)"};
  }
  const RankLayout* l = f.layout;
  if (l && l->several_nodes() && !l->equal_nodes()) {
    return PathRefusal{"distributed.hierarchical",
                       "on needs the same number of ranks on every node (the job's " +
                           std::to_string(l->ranks) + " ranks are on nodes of " +
                           std::to_string(l->fewest_local) + " to " +
                           std::to_string(l->most_local) + ")"};
  }
  return std::nullopt;
}

bool sixteen_bits(Compression c) { return c == Compression::Bf16 || c == Compression::Fp16; }

std::optional<PathRefusal> refuse_powersgd(const DistributedConfig& d, const Facts& f) {
  if (d.shard_optimizer) {
    return PathRefusal{"distributed.compression",
                       "powersgd does not apply to distributed.shard_optimizer: its "
                       "reduce-scatter sums parts of buckets, and the factors need whole "
                       "matrices (use none, bf16 or fp16)"};
  }
  if (f.gpu && f.backend == BackendChoice::Mpi) {
    return PathRefusal{"distributed.compression",
                       "powersgd on GPUs runs on NCCL's stream: it needs distributed.backend: "
                       "nccl (or auto); mpi stages the buckets through host memory"};
  }
  if (d.hierarchical == Hierarchy::On) {
    return PathRefusal{"distributed.hierarchical",
                       "on does not apply to distributed.compression: powersgd, whose factors "
                       "are summed flat (use auto or off)"};
  }
  return std::nullopt;
}

// The tuner measures and models the MPI paths of replicated optimizers (train/tuner.h).
std::optional<PathRefusal> refuse_tune(const DistributedConfig& d, const Facts& f) {
  if (f.gpu) {
    return PathRefusal{"distributed.tune",
                       "auto measures the MPI paths of CPU ranks; on GPUs NCCL picks its own "
                       "algorithms (use off)"};
  }
  if (d.shard_optimizer) {
    return PathRefusal{"distributed.tune",
                       "auto does not model distributed.shard_optimizer's reduce-scatter and "
                       "allgather (use off)"};
  }
  return std::nullopt;
}

// The exact chunk sums need the same kernels for every chunk wherever it runs and float32
// gradients summed whole on the host (train/chunked_gradients.h).
std::optional<PathRefusal> refuse_bitwise(const TrainConfig& c, const Facts& f) {
  const DistributedConfig& d = c.distributed;
  const TrainingConfig& t = c.training;
  const char* key = "training.bitwise_across_world_sizes";
  if (f.gpu) {
    return PathRefusal{key,
                       "true runs on CPU ranks (device: cpu): on GPUs it would need the chunk "
                       "loop on the device and the exact sums over NCCL"};
  }
  if (d.compression != Compression::None) {
    return PathRefusal{key, std::string("true sums float32 gradients exactly and does not apply "
                                        "to distributed.compression: ") +
                                to_string(d.compression) + " (use none)"};
  }
  if (d.shard_optimizer) {
    return PathRefusal{key,
                       "true does not apply to distributed.shard_optimizer, whose norm and "
                       "reduce-scatter are split by rank (use false)"};
  }
  if (d.hierarchical == Hierarchy::On) {
    return PathRefusal{key,
                       "true sums exactly in one allreduce and does not apply to "
                       "distributed.hierarchical: on (use auto or off)"};
  }
  if (d.tune == Tune::Auto) {
    return PathRefusal{key,
                       "true has no bucket caps or hierarchy to tune: distributed.tune must be "
                       "off"};
  }
  if (t.batch_size % t.bitwise_chunk_size != 0) {
    return PathRefusal{"training.bitwise_chunk_size",
                       std::to_string(t.bitwise_chunk_size) + " does not divide "
                       "training.batch_size " + std::to_string(t.batch_size) +
                           " (each rank's batch must be whole chunks)"};
  }
  return std::nullopt;
}

std::optional<PathRefusal> refuse(const TrainConfig& c, const Facts& f) {
  const DistributedConfig& d = c.distributed;
  if (c.training.bitwise_across_world_sizes) {
    if (const auto no = refuse_bitwise(c, f)) return no;
  }
  if (d.tune == Tune::Auto) {
    if (const auto no = refuse_tune(d, f)) return no;
  }
  if (d.shard_optimizer && f.gpu && f.backend == BackendChoice::Mpi) {
    return PathRefusal{"distributed.shard_optimizer",
                       "on GPUs needs distributed.backend: nccl (or auto); mpi stages the buckets "
                       "through host memory and has no sharded path"};
  }
  if (d.compression_on_node && !sixteen_bits(d.compression)) {
    return PathRefusal{"distributed.compression_on_node",
                       std::string("true needs distributed.compression: bf16 or fp16 (it is ") +
                           to_string(d.compression) + ")"};
  }
  if (d.compression == Compression::PowerSgd) {
    if (const auto no = refuse_powersgd(d, f)) return no;
  }
  if (d.compression_sum == CompressedSum::Float32) {
    if (!sixteen_bits(d.compression)) {
      return PathRefusal{"distributed.compression_sum",
                         std::string("float32 needs distributed.compression: bf16 or fp16 (it "
                                     "is ") +
                             to_string(d.compression) + ")"};
    }
    if (f.gpu) {
      return PathRefusal{"distributed.compression_sum",
                         "float32 runs on CPU ranks for now (NCCL adds 16-bit buckets in their "
                         "type: use wire)"};
    }
  }
  if (d.hierarchical == Hierarchy::On) return refuse_hierarchy(d, f);
  return std::nullopt;
}

// Across nodes with more than one rank each, where the buckets go through MPI's shared-memory
// windows (not NCCL, which builds its own hierarchy; not the sharded optimizer's collectives,
// which are flat); auto only where every node has as many ranks.
bool hierarchical(const DistributedConfig& d, const Facts& f) {
  const RankLayout& l = *f.layout;
  const bool several_per_node = l.several_nodes() && l.local_ranks > 1;
  if (!several_per_node || d.hierarchical == Hierarchy::Off) return false;
  if (d.hierarchical == Hierarchy::On) return true;  // refuse() ruled out what cannot be
  return f.backend != BackendChoice::Nccl && !d.shard_optimizer && d.shared_memory &&
         d.compression != Compression::PowerSgd && l.equal_nodes();
}

// MPI's shared-memory path on one node has no link to save bytes on and stays float32 unless
// compression_on_node says otherwise.
std::string describe_compression(const DistributedConfig& d, const Facts& f) {
  const RankLayout& l = *f.layout;
  if (d.compression == Compression::None || l.ranks == 1) return "";
  if (d.compression == Compression::PowerSgd) {
    return "gradients: PowerSGD (distributed.compression: powersgd) after " +
           std::to_string(d.powersgd_start_step) +
           " steps summed whole: each weight matrix sent as two factors of rank " +
           std::to_string(d.powersgd_rank) +
           " (vectors and matrices too small to gain whole), with warm start and error feedback" +
           (l.several_nodes() ? ""
                              : "; on one node no link is saved: it costs compute and accuracy "
                                "only");
  }
  const std::string name = to_string(d.compression);
  const bool window = f.backend != BackendChoice::Nccl && d.shared_memory && !l.several_nodes();
  if (window && !d.compression_on_node)
    return "gradients: summed in float32: distributed.compression: " + name +
           " saves nothing on one node's shared memory (compression_on_node: true applies it)";
  const std::string sums = d.compression_sum == CompressedSum::Float32
                               ? "sent in " + name + " and summed in float32, rounded once"
                               : "sent and summed in " + name;
  return "gradients: " + sums + " (distributed.compression), 2 bytes a value instead of 4" +
         (window ? ", on shared memory too (compression_on_node)" : "");
}

std::string describe_hierarchy(const RankLayout& l) {
  return "gradients: hierarchical allreduce (distributed.hierarchical), " +
         std::to_string(l.ranks / l.local_ranks) + " nodes x " + std::to_string(l.local_ranks) +
         " ranks: each node sums its buckets in shared memory, each local rank allreduces its "
         "chunk across nodes, the node shares the result";
}

// Sharded: where the update runs, and why not inside the reduce-scatters when
// distributed.overlap_optimizer asks for it but the step must see the whole gradient first.
std::string describe_update(const TrainConfig& c, const GradientPath& p, bool gpu) {
  if (!p.sharded) return "";
  if (p.fused_update)
    return "optimizer: each bucket's part updated as its reduce-scatter sums it, during backward "
           "(distributed.overlap_optimizer)";
  if (!c.distributed.overlap_optimizer) return "";
  std::string why = "on GPUs";
  if (!gpu && c.training.clip_grad_norm > 0)
    why = "with training.clip_grad_norm (the global norm first)";
  else if (!gpu && p.loss_scaling)
    why = "with training.loss_scaling (an overflow skips the step: it decides first)";
  else if (!gpu)
    why = "with training.nan_policy: skip_step (it decides first)";
  return "optimizer: updates after backward: distributed.overlap_optimizer does not apply " + why;
}

// GradScaler's schedule, with the values of this run.
std::string describe_scaling(const TrainingConfig& t) {
  std::ostringstream line;
  line << "loss scaling: dynamic (training.loss_scaling " << to_string(t.loss_scaling) << "), from "
       << t.loss_scale_init << ", x2 after " << t.loss_scale_growth_interval
       << " steps without overflow, x0.5 and the step skipped on an overflow";
  return line.str();
}

// CUDA graphs replay a step's kernels with the arguments of its capture; PowerSGD's differ
// from step to step (Q's seed, the step that starts compressing).
std::string describe_graphs(const TrainConfig& c, const Facts& f) {
  if (!f.gpu || !c.training.cuda_graphs || c.distributed.compression != Compression::PowerSgd)
    return "";
  return "training.cuda_graphs: steps run without graphs under distributed.compression: "
         "powersgd (its kernels' arguments change from step to step)";
}

// Which world sizes keep the bits: those whose ranks each hold whole chunks of every batch.
std::string describe_exact(const TrainConfig& c, const Facts& f) {
  if (!c.training.bitwise_across_world_sizes) return "";
  const int64_t chunk = c.training.bitwise_chunk_size;
  const int64_t chunks = c.global_batch(f.layout->ranks) / c.training.accumulate_steps / chunk;
  return "gradients: summed exactly over " + std::to_string(chunks) + " chunks of " +
         std::to_string(chunk) + " samples per batch, each computed alone "
         "(training.bitwise_across_world_sizes): the same weights, bitwise, on any number of "
         "ranks that divides " + std::to_string(chunks);
}

void describe(const TrainConfig& c, const Facts& f, GradientPath& p) {
  for (const std::string& line :
       {describe_exact(c, f), describe_compression(c.distributed, f), describe_graphs(c, f),
        p.wire.hierarchical ? describe_hierarchy(*f.layout) : "", describe_update(c, p, f.gpu),
        p.loss_scaling ? describe_scaling(c.training) : ""}) {
    if (!line.empty()) p.description.push_back(line);
  }
}

}  // namespace

std::optional<PathRefusal> gradient_path_refusal(const TrainConfig& cfg) {
  Facts f;
  f.gpu = cfg.device == DeviceChoice::Cuda;
  f.backend = cfg.distributed.backend;
  return refuse(cfg, f);
}

GradientPath resolve_gradient_path(const TrainConfig& cfg, Device device, BackendChoice backend,
                                   const RankLayout& layout) {
  const Facts f{device == Device::CUDA, backend, &layout};
  if (const auto no = refuse(cfg, f)) DDP_THROW(no->key << ": " << no->message);
  const DistributedConfig& d = cfg.distributed;
  const TrainingConfig& t = cfg.training;
  const bool skip = t.nan_policy == NanPolicy::SkipStep;
  GradientPath p;
  p.loss_scaling = t.scales_loss();
  // The update waits for the whole gradient's totals where they may skip or clip it.
  const bool decides = t.clip_grad_norm > 0 || skip || p.loss_scaling;
  p.sharded = d.shard_optimizer;
  p.fused_update = p.sharded && d.overlap_optimizer && !f.gpu && !decides;
  p.totals_first = p.sharded && (decides || f.gpu);
  p.scans_gradients = !f.gpu || skip || p.loss_scaling;
  p.equal_parts = p.sharded && f.gpu;
  const Compression wire = sixteen_bits(d.compression) ? d.compression : Compression::None;
  // The exact sums of bitwise_across_world_sizes are one allreduce, never hierarchical.
  const bool hierarchy = hierarchical(d, f) && !t.bitwise_across_world_sizes;
  p.wire = BucketWire{wire, d.compression_on_node, hierarchy, d.shared_memory, d.compression_sum};
  if (d.compression == Compression::PowerSgd) {
    p.powersgd_rank = static_cast<int>(d.powersgd_rank);
    p.powersgd_start_step = d.powersgd_start_step;
  }
  if (t.bitwise_across_world_sizes) p.exact_chunk = t.bitwise_chunk_size;
  describe(cfg, f, p);
  return p;
}

}  // namespace ddp
