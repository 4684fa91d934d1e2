// The optimizers over spans of the arena (a sharded optimizer updates its rank's parts only):
// the ranks' optimizers together give every parameter and every state value the bits of one
// optimizer over the whole arena, and each keeps state for its own parts alone.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "core/random.h"
#include "comm/shard_plan.h"
#include "kernels/backend.h"
#include "nn/optimizer.h"

namespace {

std::vector<float> random_values(size_t n, uint64_t seed, float scale) {
  ddp::Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = scale * static_cast<float>(rng.uniform(-1.0, 1.0));
  return v;
}

ddp::Tensor view(std::vector<float>& v) {
  return ddp::Tensor{v.data(), 1, static_cast<int64_t>(v.size()), ddp::Device::CPU};
}

bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Each of 3 ranks' optimizers over its shard, stepped by `step_rank`, against one optimizer over
// the whole arena for 4 steps: every parameter and every state value has the same bits.
using StepRank =
    std::function<void(ddp::Backend&, ddp::Optimizer&, const ddp::ShardPlan&,
                       std::vector<float>& params, std::vector<float>& grads, double lr, int step)>;

void require_ranks_equal_whole(const ddp::OptimizerConfig& cfg, const StepRank& step_rank) {
  const std::vector<size_t> numel = {40 * 30, 40, 30 * 7, 7};
  const ddp::BucketPlan plan = ddp::compute_bucket_plan(numel, 256, 2048);
  const size_t total = plan.total_numel;
  auto be = ddp::make_cpu_backend();
  const int world = 3;
  std::vector<float> whole_params = random_values(total, 1, 0.5f);
  std::vector<float> shard_params = whole_params;
  auto whole = ddp::make_optimizer(cfg, ddp::whole_arena(total), ddp::Device::CPU);
  std::vector<std::unique_ptr<ddp::Optimizer>> ranks;
  std::vector<ddp::ShardPlan> shards;
  for (int r = 0; r < world; ++r) {
    shards.push_back(ddp::compute_shard_plan(plan, world, r));
    ranks.push_back(ddp::make_optimizer(cfg, shards.back().owned, ddp::Device::CPU));
    REQUIRE(ranks.back()->state_numel() == shards.back().owned_numel);
  }
  for (int step = 0; step < 4; ++step) {
    std::vector<float> grads = random_values(total, 100 + step, 1.0f);
    const double lr = 0.01 * (step + 1);
    whole->step(*be, view(whole_params), view(grads), lr);
    for (int r = 0; r < world; ++r) {
      const auto i = static_cast<size_t>(r);
      step_rank(*be, *ranks[i], shards[i], shard_params, grads, lr, step);
    }
  }
  REQUIRE(same_bits(shard_params.data(), whole_params.data(), total));
  for (const std::string& name : whole->state_names()) {
    INFO("state " << name);
    const ddp::Tensor w = whole->state(name);
    for (int r = 0; r < world; ++r) {
      const ddp::Tensor s = ranks[static_cast<size_t>(r)]->state(name);
      size_t at = 0;
      for (const ddp::Span& part : shards[static_cast<size_t>(r)].owned) {
        REQUIRE(same_bits(s.data + at, w.data + part.offset, part.numel));
        at += part.numel;
      }
      REQUIRE(static_cast<int64_t>(at) == s.numel());
    }
  }
  REQUIRE(ranks[1]->steps_taken() == 4);
}

// A sharded optimizer's step() over its spans.
void require_shards_equal_whole(const ddp::OptimizerConfig& cfg) {
  require_ranks_equal_whole(cfg, [](ddp::Backend& be, ddp::Optimizer& o, const ddp::ShardPlan&,
                                    std::vector<float>& params, std::vector<float>& grads,
                                    double lr, int) { o.step(be, view(params), view(grads), lr); });
}

// The fused sharded update (update_range): each rank's parts block by block, uneven blocks,
// from sums held elsewhere (a copy), then end_step().
void require_ranges_equal_whole(const ddp::OptimizerConfig& cfg) {
  require_ranks_equal_whole(
      cfg, [](ddp::Backend& be, ddp::Optimizer& o, const ddp::ShardPlan& shard,
              std::vector<float>& params, std::vector<float>& grads, double lr, int step) {
        for (const ddp::Span& part : shard.owned) {
          for (size_t at = 0; at < part.numel;) {
            const size_t n = std::min<size_t>(part.numel - at, 37 + 11 * static_cast<size_t>(step));
            const auto first = grads.begin() + static_cast<long>(part.offset + at);
            const std::vector<float> sums(first, first + static_cast<long>(n));
            o.update_range(be, params.data(), part.offset + at, sums.data(), n, lr);
            at += n;
          }
        }
        o.end_step();
      });
}

}  // namespace

TEST_CASE("optimizers over the ranks' shards give bitwise the whole-arena update", "[shard]") {
  ddp::OptimizerConfig sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  sgd.weight_decay = 0.01;
  sgd.nesterov = true;
  SECTION("sgd, nesterov momentum, weight decay") { require_shards_equal_whole(sgd); }
  ddp::OptimizerConfig adamw;
  adamw.name = ddp::OptimizerName::AdamW;
  adamw.weight_decay = 0.05;
  adamw.amsgrad = true;
  SECTION("adamw, amsgrad") { require_shards_equal_whole(adamw); }
  ddp::OptimizerConfig adam;
  adam.name = ddp::OptimizerName::Adam;
  adam.weight_decay = 0.01;
  SECTION("adam, L2 weight decay") { require_shards_equal_whole(adam); }
}

TEST_CASE("the fused update of a shard, block by block, gives bitwise the whole-arena update",
          "[shard]") {
  ddp::OptimizerConfig sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  sgd.weight_decay = 0.01;
  SECTION("sgd, momentum (its first step copies the gradient), weight decay") {
    require_ranges_equal_whole(sgd);
  }
  ddp::OptimizerConfig adamw;
  adamw.name = ddp::OptimizerName::AdamW;
  adamw.weight_decay = 0.05;
  adamw.amsgrad = true;
  SECTION("adamw, amsgrad (bias correction counts end_step)") { require_ranges_equal_whole(adamw); }
}

TEST_CASE("a fused update refuses a range outside the optimizer's spans", "[shard]") {
  ddp::OptimizerConfig sgd;
  auto be = ddp::make_cpu_backend();
  auto opt = ddp::make_optimizer(sgd, {ddp::Span{4, 4}, ddp::Span{12, 4}}, ddp::Device::CPU);
  std::vector<float> p(16), g(8);
  opt->update_range(*be, p.data(), 13, g.data(), 3, 0.1);  // inside the second span
  REQUIRE_THROWS_WITH(opt->update_range(*be, p.data(), 2, g.data(), 2, 0.1),
                      Catch::Contains("[2, 4) outside the spans"));
  REQUIRE_THROWS_WITH(opt->update_range(*be, p.data(), 6, g.data(), 4, 0.1),
                      Catch::Contains("[6, 10) outside the spans"));
  REQUIRE_THROWS_WITH(
      ddp::make_optimizer(sgd, {ddp::Span{12, 4}, ddp::Span{4, 4}}, ddp::Device::CPU),
      Catch::Contains("spans must be in arena order"));
}

TEST_CASE("an optimizer refuses a span outside the arena", "[shard]") {
  ddp::OptimizerConfig sgd;
  auto be = ddp::make_cpu_backend();
  auto opt = ddp::make_optimizer(sgd, {ddp::Span{8, 4}}, ddp::Device::CPU);
  std::vector<float> p(10), g(10);
  REQUIRE_THROWS_WITH(opt->step(*be, view(p), view(g), 0.1),
                      Catch::Contains("span [8, 12) outside an arena of 10"));
}
