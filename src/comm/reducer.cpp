// Bucket plan and Reducer (see reducer.h for the contracts).
#include "comm/reducer.h"

#include <algorithm>
#include <sstream>

#include "core/check.h"
#include "core/clock.h"

namespace ddp {

BucketPlan compute_bucket_plan(const std::vector<size_t>& param_numel, size_t first_bucket_bytes,
                               size_t bucket_bytes, size_t align) {
  DDP_CHECK(first_bucket_bytes > 0 && bucket_bytes > 0, "bucket caps must be positive");
  DDP_CHECK(align >= 1, "bucket alignment must be >= 1 float");
  BucketPlan plan;
  const size_t n = param_numel.size();
  plan.param_bucket.assign(n, 0);
  plan.param_offset.assign(n, 0);
  BucketPlan::Bucket current;
  size_t offset = 0;
  for (size_t k = 0; k < n; ++k) {
    const size_t p = n - 1 - k;  // reverse registration order
    const size_t padding = (align - offset % align) % align;
    if (!current.params.empty()) current.numel += padding;  // a gap inside the bucket
    offset += padding;
    plan.param_bucket[p] = plan.buckets.size();
    plan.param_offset[p] = offset;
    current.params.push_back(p);
    current.numel += param_numel[p];
    offset += param_numel[p];
    const size_t cap = plan.buckets.empty() ? first_bucket_bytes : bucket_bytes;
    if (current.numel * sizeof(float) >= cap || k + 1 == n) {
      current.offset = offset - current.numel;
      plan.buckets.push_back(std::move(current));
      current = BucketPlan::Bucket{};
    }
  }
  plan.total_numel = offset;
  return plan;
}

std::string describe_plan(const BucketPlan& plan, const std::vector<std::string>& names) {
  std::ostringstream oss;
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const auto& bucket = plan.buckets[b];
    oss << "bucket " << b << ": " << bucket.numel << " floats:";
    for (size_t p : bucket.params) oss << ' ' << (p < names.size() ? names[p] : std::to_string(p));
    oss << '\n';
  }
  return oss.str();
}

Reducer::Reducer(BucketPlan plan, std::vector<std::string> param_names, float* grad_arena,
                 GradientCommunicator& comm)
    : plan_(std::move(plan)), names_(std::move(param_names)), arena_(grad_arena), comm_(&comm) {
  DDP_CHECK(
      names_.size() == plan_.param_bucket.size(),
      "Reducer: " << names_.size() << " names for " << plan_.param_bucket.size() << " parameters");
  pending_.resize(plan_.buckets.size());
  marked_.resize(names_.size());
  work_.resize(plan_.buckets.size());
}

Reducer Reducer::sharded(BucketPlan plan, std::vector<std::string> param_names, float* grad_arena,
                         ShardedCommunicator& comm) {
  Reducer r(std::move(plan), std::move(param_names), grad_arena, comm);
  r.sharded_ = &comm;
  return r;
}

void Reducer::fuse(HostGradientCommunicator& comm, HostGradientCommunicator::PartConsumer consume,
                   std::vector<size_t> layer) {
  DDP_CHECK(sharded_ == &comm && consume,
            "Reducer::fuse: needs a sharded optimizer's consumer and the Reducer's communicator");
  DDP_CHECK(layer.size() == names_.size(),
            "Reducer::fuse: " << layer.size() << " layers for " << names_.size() << " parameters");
  fused_ = &comm;
  consume_ = std::move(consume);
  layer_ = std::move(layer);
  lowest_layer_.assign(plan_.buckets.size(), SIZE_MAX);
  for (size_t b = 0; b < plan_.buckets.size(); ++b)
    for (size_t p : plan_.buckets[b].params)
      lowest_layer_[b] = std::min(lowest_layer_[b], layer_[p]);
}

void Reducer::prepare_for_backward(bool sync) {
  sync_ = sync;
  reached_ = SIZE_MAX;
  finalizing_ = false;
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    pending_[b] = plan_.buckets[b].params.size();
    work_[b].reset();
  }
  std::fill(marked_.begin(), marked_.end(), 0);
  next_to_launch_ = 0;
}

void Reducer::mark_ready(size_t param) {
  DDP_CHECK(param < marked_.size(), "Reducer: parameter index " << param << " out of range");
  DDP_CHECK(!marked_[param], "Reducer: gradient of "
                                 << names_[param]
                                 << " marked ready twice in one backward pass (is the parameter "
                                    "used twice, or prepare_for_backward() missing?)");
  marked_[param] = 1;
  if (!sync_) return;
  --pending_[plan_.param_bucket[param]];
  if (consume_) reached_ = std::min(reached_, layer_[param]);
  launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  // Buckets start strictly in index order so every rank issues the same sequence of
  // collectives, even when gradients become ready in a different order on different ranks.
  while (next_to_launch_ < plan_.buckets.size() && pending_[next_to_launch_] == 0 &&
         released(next_to_launch_)) {
    const auto& bucket = plan_.buckets[next_to_launch_];
    float* data = arena_ + bucket.offset;
    if (recorder_) recorder_->set_bucket(static_cast<int64_t>(next_to_launch_));
    try {
      if (fused_) {
        work_[next_to_launch_] = fused_->reduce_scatter_into_async(data, bucket.numel, consume_);
      } else if (sharded_) {
        work_[next_to_launch_] = sharded_->reduce_scatter_async(data, bucket.numel);
      } else {
        work_[next_to_launch_] = comm_->allreduce_async(data, bucket.numel, false);
      }
    } catch (const Error& e) {
      if (recorder_) recorder_->set_bucket(-1);
      DDP_THROW("gradient " << collective() << " of " << describe_bucket(next_to_launch_) << ": "
                            << e.message());
    }
    if (recorder_) recorder_->set_bucket(-1);
    ++next_to_launch_;
  }
}

// Fused: whether backward has stopped reading the values of the bucket's parameters.
bool Reducer::released(size_t bucket) const {
  return !consume_ || finalizing_ || lowest_layer_[bucket] > reached_;
}

std::string Reducer::describe_bucket(size_t b) const {
  std::ostringstream oss;
  oss << "bucket " << b << " (";
  const auto& params = plan_.buckets[b].params;
  for (size_t i = 0; i < params.size(); ++i) oss << (i ? " " : "") << names_[params[i]];
  oss << ")";
  return oss.str();
}

double Reducer::finalize() {
  for (size_t p = 0; p < marked_.size(); ++p) {
    DDP_CHECK(marked_[p], "Reducer: backward finished but the gradient of "
                              << names_[p] << " was never marked ready; buckets cannot complete");
  }
  if (!sync_) return 0.0;
  finalizing_ = true;  // backward has ended: every remaining bucket may start (fused)
  launch_ready_buckets();
  const double wait_begin = seconds_now();
  for (size_t b = 0; b < work_.size(); ++b) {
    try {
      work_[b]->wait();
    } catch (const Error& e) {
      DDP_THROW("gradient " << collective() << " of " << describe_bucket(b) << ": " << e.message());
    }
  }
  return seconds_now() - wait_begin;
}

void Reducer::synchronize(const std::vector<std::shared_ptr<Work>>& works, int64_t step) const {
  for (size_t b = 0; b < works.size(); ++b) {
    try {
      works[b]->synchronize();
    } catch (const Error& e) {
      DDP_THROW("gradient " << collective() << " of " << describe_bucket(b) << " (global step "
                            << step << "): " << e.message());
    }
  }
}

ReducerStepStats overlap_stats(const std::vector<std::shared_ptr<Work>>& works,
                               const BackwardWindow& backward) {
  ReducerStepStats stats;
  double inside = 0.0;
  for (const auto& w : works) {
    const double s = w->start_time(), e = w->end_time();
    stats.comm_seconds += e - s;
    inside += std::max(0.0, std::min(e, backward.end) - std::max(s, backward.begin));
  }
  const double off_core = std::max(0.0, backward.end - backward.begin - backward.cpu_seconds);
  stats.hidden_seconds = std::max(0.0, inside - off_core);
  return stats;
}

double bucket_wait(const std::vector<std::shared_ptr<Work>>& works) {
  if (works.empty()) return 0.0;
  double end = works.front()->end_time();
  for (const auto& w : works) end = std::max(end, w->end_time());
  return std::max(0.0, end - works.back()->ready_time());
}

}  // namespace ddp
