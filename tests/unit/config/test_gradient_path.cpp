// The gradient path (config/gradient_path.h): each decision from the config, the device, the
// backend and where the ranks are; each refusal in full; the startup lines.
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "config/gradient_path.h"
#include "core/check.h"
#include "ddp/config.h"

namespace {

using ddp::BackendChoice;
using ddp::Device;
using ddp::GradientPath;
using ddp::RankLayout;
using ddp::TrainConfig;

RankLayout nodes(int count, int each) {
  RankLayout l;
  l.ranks = count * each;
  l.local_ranks = l.fewest_local = l.most_local = each;
  return l;
}

GradientPath cpu_path(const TrainConfig& cfg, const RankLayout& layout = nodes(1, 2)) {
  return ddp::resolve_gradient_path(cfg, Device::CPU, BackendChoice::Mpi, layout);
}

TrainConfig sharded() {
  TrainConfig cfg;
  cfg.distributed.shard_optimizer = true;
  return cfg;
}

std::string refusal(const TrainConfig& cfg, Device device, BackendChoice backend,
                    const RankLayout& layout) {
  try {
    ddp::resolve_gradient_path(cfg, device, backend, layout);
  } catch (const ddp::Error& e) {
    return e.message();
  }
  return "";
}

}  // namespace

TEST_CASE("gradient path: allreduce on every rank by default, scanned on the host only",
          "[config][gradient_path]") {
  const TrainConfig cfg;
  const GradientPath cpu = cpu_path(cfg);
  CHECK_FALSE(cpu.sharded);
  CHECK(std::string(cpu.collective()) == "allreduce");
  CHECK(cpu.scans_gradients);
  CHECK_FALSE(cpu.wire.hierarchical);
  CHECK(cpu.description.empty());
  const GradientPath gpu =
      ddp::resolve_gradient_path(cfg, Device::CUDA, BackendChoice::Nccl, nodes(1, 2));
  CHECK_FALSE(gpu.scans_gradients);  // a host sync on a GPU: only where steps are skipped
  TrainConfig skip = cfg;
  skip.training.nan_policy = ddp::NanPolicy::SkipStep;
  CHECK(ddp::resolve_gradient_path(skip, Device::CUDA, BackendChoice::Nccl, nodes(1, 2))
            .scans_gradients);
}

TEST_CASE("gradient path: the sharded update fused only where nothing must be known first",
          "[config][gradient_path][shard]") {
  TrainConfig cfg = sharded();
  cfg.distributed.overlap_optimizer = false;
  GradientPath p = cpu_path(cfg);
  CHECK(p.sharded);
  CHECK(std::string(p.collective()) == "reduce-scatter");
  CHECK_FALSE(p.fused_update);  // overlap_optimizer is off (it is on by default)
  CHECK_FALSE(p.totals_first);  // they ride on the parameter allgather
  CHECK_FALSE(p.equal_parts);
  cfg.distributed.overlap_optimizer = true;
  p = cpu_path(cfg);
  CHECK(p.fused_update);
  CHECK(p.description ==
        std::vector<std::string>{"optimizer: each bucket's part updated as its reduce-scatter sums "
                                 "it, during backward (distributed.overlap_optimizer)"});
  TrainConfig clip = cfg;
  clip.training.clip_grad_norm = 1.0;
  p = cpu_path(clip);
  CHECK_FALSE(p.fused_update);
  CHECK(p.totals_first);
  CHECK(p.description ==
        std::vector<std::string>{"optimizer: updates after backward: "
                                 "distributed.overlap_optimizer does not apply with "
                                 "training.clip_grad_norm (the global norm first)"});
  TrainConfig skip = cfg;
  skip.training.nan_policy = ddp::NanPolicy::SkipStep;
  p = cpu_path(skip);
  CHECK_FALSE(p.fused_update);
  CHECK(p.totals_first);
  CHECK(p.description.back().find("with training.nan_policy: skip_step") != std::string::npos);
  p = ddp::resolve_gradient_path(cfg, Device::CUDA, BackendChoice::Nccl, nodes(1, 2));
  CHECK_FALSE(p.fused_update);
  CHECK(p.totals_first);  // NCCL's allgather carries no riders
  CHECK(p.equal_parts);
  CHECK(p.description.back() ==
        "optimizer: updates after backward: distributed.overlap_optimizer does not apply on GPUs");
}

TEST_CASE("gradient path: loss scaling scans the gradient, its totals first, never fused",
          "[config][gradient_path][loss_scale]") {
  TrainConfig cfg = sharded();
  CHECK_FALSE(cpu_path(cfg).loss_scaling);
  cfg.training.loss_scaling = ddp::LossScaling::On;
  GradientPath p = cpu_path(cfg);
  CHECK(p.loss_scaling);
  CHECK(p.scans_gradients);
  CHECK(p.totals_first);
  CHECK_FALSE(p.fused_update);
  CHECK(p.description ==
        std::vector<std::string>{
            "optimizer: updates after backward: distributed.overlap_optimizer does not apply "
            "with training.loss_scaling (an overflow skips the step: it decides first)",
            "loss scaling: dynamic (training.loss_scaling on), from 65536, x2 after 2000 steps "
            "without overflow, x0.5 and the step skipped on an overflow"});
  // auto: with fp16, which GPUs run; there the gradient is scanned (a host sync) for it.
  TrainConfig fp16;
  fp16.training.precision = ddp::Precision::Fp16;
  p = ddp::resolve_gradient_path(fp16, Device::CUDA, BackendChoice::Nccl, nodes(1, 2));
  CHECK(p.loss_scaling);
  CHECK(p.scans_gradients);
  fp16.training.loss_scaling = ddp::LossScaling::Off;
  p = ddp::resolve_gradient_path(fp16, Device::CUDA, BackendChoice::Nccl, nodes(1, 2));
  CHECK_FALSE(p.loss_scaling);
  CHECK_FALSE(p.scans_gradients);
}

TEST_CASE("gradient path: hierarchical on auto across equal nodes of several ranks only",
          "[config][gradient_path][hierarchy]") {
  const TrainConfig cfg;                                      // hierarchical: auto
  CHECK_FALSE(cpu_path(cfg, nodes(1, 4)).wire.hierarchical);  // one node
  CHECK_FALSE(cpu_path(cfg, nodes(4, 1)).wire.hierarchical);  // one rank per node
  const GradientPath two_by_two = cpu_path(cfg, nodes(2, 2));
  CHECK(two_by_two.wire.hierarchical);
  CHECK(two_by_two.description ==
        std::vector<std::string>{"gradients: hierarchical allreduce (distributed.hierarchical), "
                                 "2 nodes x 2 ranks: each node sums its buckets in shared memory, "
                                 "each local rank allreduces its chunk across nodes, the node "
                                 "shares the result"});
  RankLayout uneven = nodes(2, 2);
  uneven.ranks = 3;
  uneven.fewest_local = 1;
  CHECK_FALSE(cpu_path(cfg, uneven).wire.hierarchical);  // auto stays flat
  CHECK_FALSE(ddp::resolve_gradient_path(cfg, Device::CUDA, BackendChoice::Nccl, nodes(2, 2))
                  .wire.hierarchical);
  CHECK_FALSE(cpu_path(sharded(), nodes(2, 2)).wire.hierarchical);
  TrainConfig off = cfg;
  off.distributed.hierarchical = ddp::Hierarchy::Off;
  CHECK_FALSE(cpu_path(off, nodes(2, 2)).wire.hierarchical);
  TrainConfig on = cfg;
  on.distributed.hierarchical = ddp::Hierarchy::On;
  CHECK(cpu_path(on, nodes(2, 2)).wire.hierarchical);
  CHECK_FALSE(cpu_path(on, nodes(1, 4)).wire.hierarchical);  // on one node it changes nothing
  CHECK(refusal(on, Device::CPU, BackendChoice::Mpi, uneven) ==
        "distributed.hierarchical: on needs the same number of ranks on every node (the job's 3 "
        "ranks are on nodes of 1 to 2)");
}

TEST_CASE("gradient path: what 16-bit buckets do in this job, said once",
          "[config][gradient_path][compression]") {
  TrainConfig cfg;
  cfg.distributed.compression = ddp::Compression::Bf16;
  GradientPath p = cpu_path(cfg, nodes(1, 2));
  CHECK(p.wire.format == ddp::Compression::Bf16);
  CHECK(p.description == std::vector<std::string>{
                             "gradients: summed in float32: distributed.compression: bf16 saves "
                             "nothing on one node's shared memory (compression_on_node: true "
                             "applies it)"});
  cfg.distributed.compression_on_node = true;
  p = cpu_path(cfg, nodes(1, 2));
  CHECK(p.wire.on_node);
  CHECK(p.description ==
        std::vector<std::string>{"gradients: sent and summed in bf16 (distributed.compression), 2 "
                                 "bytes a value instead of 4, on shared memory too "
                                 "(compression_on_node)"});
  p = ddp::resolve_gradient_path(cfg, Device::CUDA, BackendChoice::Nccl, nodes(1, 2));
  CHECK(p.description ==
        std::vector<std::string>{"gradients: sent and summed in bf16 (distributed.compression), 2 "
                                 "bytes a value instead of 4"});
  CHECK(cpu_path(cfg, nodes(1, 1)).description.empty());  // one rank: nothing travels
}

TEST_CASE("gradient path: 16-bit buckets summed in float32 on CPU ranks, said, refused elsewhere",
          "[config][gradient_path][compression]") {
  TrainConfig cfg;
  cfg.distributed.compression = ddp::Compression::Bf16;
  cfg.distributed.compression_sum = ddp::CompressedSum::Float32;
  const GradientPath p = cpu_path(cfg, nodes(2, 1));
  CHECK(p.wire.format == ddp::Compression::Bf16);
  CHECK(p.wire.sum == ddp::CompressedSum::Float32);
  CHECK(p.description == std::vector<std::string>{"gradients: sent in bf16 and summed in "
                                                  "float32, rounded once "
                                                  "(distributed.compression), 2 bytes a value "
                                                  "instead of 4"});
  CHECK(cpu_path(TrainConfig{}).wire.sum == ddp::CompressedSum::Wire);
  const auto refusal = [](ddp::Compression format, ddp::DeviceChoice device) {
    TrainConfig c;
    c.distributed.compression = format;
    c.distributed.compression_sum = ddp::CompressedSum::Float32;
    c.device = device;
    const auto no = ddp::gradient_path_refusal(c);
    return no ? no->key + ": " + no->message : std::string("no refusal");
  };
  CHECK(refusal(ddp::Compression::None, ddp::DeviceChoice::Cpu) ==
        "distributed.compression_sum: float32 needs distributed.compression: bf16 or fp16 (it "
        "is none)");
  CHECK(refusal(ddp::Compression::PowerSgd, ddp::DeviceChoice::Cpu) ==
        "distributed.compression_sum: float32 needs distributed.compression: bf16 or fp16 (it "
        "is powersgd)");
  CHECK(refusal(ddp::Compression::Fp16, ddp::DeviceChoice::Cuda) ==
        "distributed.compression_sum: float32 runs on CPU ranks for now (NCCL adds 16-bit "
        "buckets in their type: use wire)");
  CHECK(refusal(ddp::Compression::Fp16, ddp::DeviceChoice::Cpu) == "no refusal");
}

TEST_CASE("gradient path: PowerSGD sends factors, flat, says how, and needs NCCL on GPUs",
          "[config][gradient_path][compression]") {
  TrainConfig cfg;
  cfg.distributed.compression = ddp::Compression::PowerSgd;
  cfg.distributed.powersgd_rank = 4;
  cfg.distributed.powersgd_start_step = 7;
  GradientPath p = cpu_path(cfg, nodes(2, 2));
  CHECK(p.powersgd_rank == 4);
  CHECK(p.powersgd_start_step == 7);
  CHECK(p.wire.format == ddp::Compression::None);  // never a bucket's wire type
  CHECK_FALSE(p.wire.hierarchical);                // auto stays flat: the factors are summed flat
  CHECK(p.description ==
        std::vector<std::string>{"gradients: PowerSGD (distributed.compression: powersgd) after 7 "
                                 "steps summed whole: each weight matrix sent as two factors of "
                                 "rank 4 (vectors and matrices too small to gain whole), with "
                                 "warm start and error feedback"});
  CHECK_THAT(cpu_path(cfg, nodes(1, 2)).description.at(0),
             Catch::EndsWith("; on one node no link is saved: it costs compute and accuracy only"));
  CHECK(cpu_path(TrainConfig{}).powersgd_rank == 0);
  // Refused by name where the factors cannot go.
  const auto refused = [](void (*change)(TrainConfig&)) {
    TrainConfig c;
    c.distributed.compression = ddp::Compression::PowerSgd;
    change(c);
    const auto no = ddp::gradient_path_refusal(c);
    return no ? no->key + ": " + no->message : std::string("no refusal");
  };
  CHECK(refused([](TrainConfig& c) { c.distributed.shard_optimizer = true; }) ==
        "distributed.compression: powersgd does not apply to distributed.shard_optimizer: its "
        "reduce-scatter sums parts of buckets, and the factors need whole matrices (use none, "
        "bf16 or fp16)");
  CHECK(refused([](TrainConfig& c) {
          c.device = ddp::DeviceChoice::Cuda;
          c.distributed.backend = ddp::BackendChoice::Mpi;
        }) ==
        "distributed.compression: powersgd on GPUs runs on NCCL's stream: it needs "
        "distributed.backend: nccl (or auto); mpi stages the buckets through host memory");
  CHECK(refused([](TrainConfig& c) { c.device = ddp::DeviceChoice::Cuda; }) == "no refusal");
  // On GPUs its steps run without graphs, and the log says why.
  TrainConfig on_gpu = cfg;
  on_gpu.device = ddp::DeviceChoice::Cuda;
  const GradientPath gpu =
      ddp::resolve_gradient_path(on_gpu, ddp::Device::CUDA, ddp::BackendChoice::Nccl, nodes(2, 1));
  CHECK(gpu.powersgd_rank == cfg.distributed.powersgd_rank);
  CHECK(std::find(gpu.description.begin(), gpu.description.end(),
                  "training.cuda_graphs: steps run without graphs under "
                  "distributed.compression: powersgd (its kernels' arguments change from step to "
                  "step)") != gpu.description.end());
  CHECK(refused([](TrainConfig& c) { c.distributed.hierarchical = ddp::Hierarchy::On; }) ==
        "distributed.hierarchical: on does not apply to distributed.compression: powersgd, whose "
        "factors are summed flat (use auto or off)");
  CHECK(refused([](TrainConfig& c) { c.distributed.compression_on_node = true; }) ==
        "distributed.compression_on_node: true needs distributed.compression: bf16 or fp16 (it "
        "is powersgd)");
  CHECK(refused([](TrainConfig&) {}) == "no refusal");
  CHECK(refused([](TrainConfig& c) { c.checkpoint.every_steps = 10; }) == "no refusal");
}

TEST_CASE("gradient path: every refusal names its key, from the config and once placed",
          "[config][gradient_path][errors]") {
  TrainConfig on_node;
  on_node.distributed.compression_on_node = true;
  const auto no = ddp::gradient_path_refusal(on_node);
  REQUIRE(no);
  CHECK(no->key == "distributed.compression_on_node");
  CHECK(no->message == "true needs distributed.compression: bf16 or fp16 (it is none)");
  // device: auto is refused once placed on a GPU with the MPI backend, as cuda is at once.
  TrainConfig staged = sharded();
  CHECK_FALSE(ddp::gradient_path_refusal(staged));
  CHECK(refusal(staged, Device::CUDA, BackendChoice::Mpi, nodes(1, 2)) ==
        "distributed.shard_optimizer: on GPUs needs distributed.backend: nccl (or auto); mpi "
        "stages the buckets through host memory and has no sharded path");
  staged.device = ddp::DeviceChoice::Cuda;
  staged.distributed.backend = BackendChoice::Mpi;
  REQUIRE(ddp::gradient_path_refusal(staged));
  CHECK(ddp::gradient_path_refusal(staged)->key == "distributed.shard_optimizer");
  TrainConfig hier;
  hier.distributed.hierarchical = ddp::Hierarchy::On;
  CHECK_FALSE(ddp::gradient_path_refusal(hier));
  CHECK(refusal(hier, Device::CUDA, BackendChoice::Nccl, nodes(2, 2)) ==
        "distributed.hierarchical: on applies to the MPI backend; NCCL builds its own hierarchy "
        "across nodes (use auto or off, or distributed.backend: mpi)");
  CHECK(refusal(hier, Device::CUDA, BackendChoice::Mpi, nodes(2, 2)).empty());
}

TEST_CASE("gradient path: distributed.tune auto is refused on GPUs and sharded, by name",
          "[config][gradient_path][tune]") {
  TrainConfig cfg;
  cfg.distributed.tune = ddp::Tune::Auto;
  CHECK(refusal(cfg, Device::CPU, BackendChoice::Mpi, nodes(2, 1)).empty());
  CHECK(refusal(cfg, Device::CUDA, BackendChoice::Nccl, nodes(2, 1)) ==
        "distributed.tune: auto measures the MPI paths of CPU ranks; on GPUs NCCL picks its own "
        "algorithms (use off)");
  cfg.device = ddp::DeviceChoice::Cuda;
  REQUIRE(ddp::gradient_path_refusal(cfg));
  CHECK(ddp::gradient_path_refusal(cfg)->key == "distributed.tune");
  TrainConfig zero = sharded();
  zero.distributed.tune = ddp::Tune::Auto;
  CHECK(refusal(zero, Device::CPU, BackendChoice::Mpi, nodes(2, 1)) ==
        "distributed.tune: auto does not model distributed.shard_optimizer's reduce-scatter and "
        "allgather (use off)");
}

TEST_CASE("gradient path: bitwise_across_world_sizes sums chunks exactly, says which world sizes",
          "[config][gradient_path][bitwise]") {
  TrainConfig cfg;
  cfg.training.bitwise_across_world_sizes = true;
  cfg.training.batch_size = 64;
  cfg.training.bitwise_chunk_size = 16;
  const GradientPath p = cpu_path(cfg, nodes(2, 2));
  CHECK(p.exact_chunk == 16);
  CHECK_FALSE(p.wire.hierarchical);  // auto: the exact sums are one allreduce
  REQUIRE_FALSE(p.description.empty());
  CHECK(p.description.front() ==
        "gradients: summed exactly over 16 chunks of 16 samples per batch, each computed alone "
        "(training.bitwise_across_world_sizes): the same weights, bitwise, on any number of ranks "
        "that divides 16");
  CHECK(cpu_path(TrainConfig{}).exact_chunk == 0);
}

TEST_CASE("gradient path: what bitwise_across_world_sizes cannot keep the bits of is refused",
          "[config][gradient_path][bitwise]") {
  const auto refused = [](void (*change)(TrainConfig&)) {
    TrainConfig c;
    c.training.bitwise_across_world_sizes = true;
    c.training.batch_size = 64;
    c.training.bitwise_chunk_size = 8;
    change(c);
    const auto no = ddp::gradient_path_refusal(c);
    return no ? no->key + ": " + no->message : std::string("no refusal");
  };
  CHECK(refused([](TrainConfig&) {}) == "no refusal");
  CHECK(refused([](TrainConfig& c) { c.device = ddp::DeviceChoice::Cuda; }) ==
        "training.bitwise_across_world_sizes: true runs on CPU ranks (device: cpu): on GPUs it "
        "would need the chunk loop on the device and the exact sums over NCCL");
  CHECK(refused([](TrainConfig& c) { c.distributed.compression = ddp::Compression::Bf16; }) ==
        "training.bitwise_across_world_sizes: true sums float32 gradients exactly and does not "
        "apply to distributed.compression: bf16 (use none)");
  CHECK(refused([](TrainConfig& c) { c.distributed.compression = ddp::Compression::PowerSgd; }) ==
        "training.bitwise_across_world_sizes: true sums float32 gradients exactly and does not "
        "apply to distributed.compression: powersgd (use none)");
  CHECK(refused([](TrainConfig& c) { c.distributed.shard_optimizer = true; }) ==
        "training.bitwise_across_world_sizes: true does not apply to "
        "distributed.shard_optimizer, whose norm and reduce-scatter are split by rank (use "
        "false)");
  CHECK(refused([](TrainConfig& c) { c.distributed.hierarchical = ddp::Hierarchy::On; }) ==
        "training.bitwise_across_world_sizes: true sums exactly in one allreduce and does not "
        "apply to distributed.hierarchical: on (use auto or off)");
  CHECK(refused([](TrainConfig& c) { c.distributed.tune = ddp::Tune::Auto; }) ==
        "training.bitwise_across_world_sizes: true has no bucket caps or hierarchy to tune: "
        "distributed.tune must be off");
  CHECK(refused([](TrainConfig& c) { c.training.bitwise_chunk_size = 48; }) ==
        "training.bitwise_chunk_size: 48 does not divide training.batch_size 64 (each rank's "
        "batch must be whole chunks)");
  // Once placed, the same refusal: a GPU rank of a job whose config said device auto.
  TrainConfig gpu;
  gpu.training.bitwise_across_world_sizes = true;
  CHECK(refusal(gpu, Device::CUDA, BackendChoice::Nccl, nodes(1, 2))
            .find("training.bitwise_across_world_sizes: true runs on CPU ranks") == 0);
}
