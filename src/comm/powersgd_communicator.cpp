// distributed.compression powersgd on the host (powersgd_communicator.h).
#include "comm/powersgd_communicator.h"

#include <algorithm>
#include <string>

#include "core/check.h"

namespace ddp {

namespace {

// splitmix64's finaliser: the seed of Q's random start for one bucket at one step.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

std::vector<PowerSgdLayout> powersgd_layouts(const BucketPlan& plan,
                                             const std::vector<size_t>& numel,
                                             const std::vector<size_t>& rows) {
  std::vector<PowerSgdLayout> layouts;
  for (const BucketPlan::Bucket& bucket : plan.buckets) {
    PowerSgdLayout layout;
    layout.numel = bucket.numel;
    for (const size_t p : bucket.params)
      layout.params.push_back({plan.param_offset[p] - bucket.offset, rows[p], numel[p] / rows[p]});
    layouts.push_back(std::move(layout));
  }
  return layouts;
}

PowerSgdCommunicator::PowerSgdCommunicator(HostGradientCommunicator& host,
                                           const std::vector<PowerSgdLayout>& buckets,
                                           const PowerSgdOptions& options, int64_t start_step,
                                           uint64_t seed, int world)
    : host_(host), start_step_(start_step), seed_(seed), world_(world) {
  size_t offset = 0;
  for (const PowerSgdLayout& b : buckets) {
    buckets_.push_back(std::make_shared<PowerSgdBucket>(b.params, b.numel, options));
    offsets_.push_back(offset);
    offset += b.numel;
  }
}

float* PowerSgdCommunicator::gradient_arena(size_t numel, const BucketWire& wire) {
  const size_t planned = offsets_.empty() ? 0 : offsets_.back() + buckets_.back()->numel();
  DDP_CHECK(numel == planned,
            "PowerSGD: a gradient arena of " << numel << " floats for buckets of " << planned);
  arena_ = host_.gradient_arena(numel, wire);
  return arena_;
}

size_t PowerSgdCommunicator::bucket_of(const float* data, size_t count) const {
  DDP_CHECK(arena_ != nullptr && data >= arena_, "PowerSGD: a bucket outside the gradient arena");
  const size_t offset = static_cast<size_t>(data - arena_);
  const auto at = std::lower_bound(offsets_.begin(), offsets_.end(), offset);
  DDP_CHECK(at != offsets_.end() && *at == offset,
            "PowerSGD: an allreduce at float " << offset << " does not start a bucket");
  const size_t b = static_cast<size_t>(at - offsets_.begin());
  DDP_CHECK(buckets_[b]->numel() == count, "PowerSGD: bucket " << b << " has "
                                                               << buckets_[b]->numel()
                                                               << " floats, not " << count);
  return b;
}

std::shared_ptr<Work> PowerSgdCommunicator::allreduce_async(float* data, size_t count,
                                                            bool average) {
  const size_t b = bucket_of(data, count);
  const int64_t step = steps_;
  if (b + 1 == buckets_.size()) ++steps_;
  if (step < start_step_) return host_.allreduce_async(data, count, average);
  std::shared_ptr<PowerSgdBucket> bucket = buckets_[b];
  const uint64_t seed = mix(seed_ ^ mix(b + 1) ^ mix(static_cast<uint64_t>(step) << 20));
  const int world = world_;
  const std::string what = "PowerSGD allreduce of " + std::to_string(count) + " floats as " +
                           std::to_string(bucket->sent_floats());
  return host_.reduce_on_lane(
      what, bucket->sent_floats() * sizeof(float), data, count,
      [bucket, seed, world, average](float* values, size_t n, const auto& sum) {
        bucket->reduce(values, world, sum, seed);
        if (average) {
          const float inv = 1.0f / static_cast<float>(world);
          for (size_t i = 0; i < n; ++i) values[i] *= inv;
        }
      });
}

PowerSgdState PowerSgdCommunicator::state() const {
  PowerSgdState s;
  const size_t total = offsets_.empty() ? 0 : offsets_.back() + buckets_.back()->numel();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const PowerSgdBucket& bucket = *buckets_[b];
    if (!bucket.error().empty()) {
      if (s.error.empty()) s.error.assign(total, 0.0f);
      std::copy(bucket.error().begin(), bucket.error().end(), s.error.begin() + offsets_[b]);
    }
    if (bucket.q().empty()) continue;
    for (size_t i = 0; i < bucket.matrices(); ++i) {
      if (!bucket.compressed(i)) continue;
      const auto first = bucket.q().begin() + static_cast<ptrdiff_t>(bucket.q_offset(i));
      const size_t size = bucket.matrix(i).cols * bucket.factor_rank(i);
      s.q[offsets_[b] + bucket.matrix(i).offset].assign(first, first + size);
    }
  }
  return s;
}

void PowerSgdCommunicator::restore(const PowerSgdState& state) {
  const size_t total = offsets_.empty() ? 0 : offsets_.back() + buckets_.back()->numel();
  DDP_CHECK(state.error.empty() || state.error.size() == total,
            "PowerSGD state: an error feedback of " << state.error.size()
                                                    << " floats for a gradient arena of " << total);
  size_t used = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    PowerSgdBucket& bucket = *buckets_[b];
    std::vector<float> error, q;
    if (!state.error.empty()) {
      const auto first = state.error.begin() + static_cast<ptrdiff_t>(offsets_[b]);
      error.assign(first, first + static_cast<ptrdiff_t>(bucket.numel()));
    }
    size_t held = 0, factored = 0;
    q.assign(bucket.q_size(), 0.0f);
    for (size_t i = 0; i < bucket.matrices(); ++i) {
      if (!bucket.compressed(i)) continue;
      ++factored;
      const size_t at = offsets_[b] + bucket.matrix(i).offset;
      const auto found = state.q.find(at);
      if (found == state.q.end()) continue;
      const size_t size = bucket.matrix(i).cols * bucket.factor_rank(i);
      DDP_CHECK(found->second.size() == size, "PowerSGD state: a Q of "
                                                  << found->second.size()
                                                  << " floats for the matrix at float " << at
                                                  << ", whose factors take " << size);
      std::copy(found->second.begin(), found->second.end(),
                q.begin() + static_cast<ptrdiff_t>(bucket.q_offset(i)));
      ++held;
    }
    // A bucket of a resumed run's plan may gather matrices whose Q came from buckets of
    // different histories (one started afresh after a non-finite step): it starts afresh too.
    if (held < factored) q.clear();
    used += held;
    bucket.restore(std::move(error), std::move(q));
  }
  DDP_CHECK(used == state.q.size(), "PowerSGD state: " << state.q.size() - used
                                                       << " Q(s) for matrices sent whole or "
                                                          "not in the gradient arena");
}

size_t PowerSgdCommunicator::factor_rank(size_t offset) const {
  const auto after = std::upper_bound(offsets_.begin(), offsets_.end(), offset);
  if (after == offsets_.begin()) return 0;
  const size_t b = static_cast<size_t>(after - offsets_.begin()) - 1;
  const PowerSgdBucket& bucket = *buckets_[b];
  for (size_t i = 0; i < bucket.matrices(); ++i)
    if (offsets_[b] + bucket.matrix(i).offset == offset) return bucket.factor_rank(i);
  return 0;
}

size_t PowerSgdCommunicator::sent_floats() const {
  size_t n = 0;
  for (const auto& b : buckets_) n += b->sent_floats();
  return n;
}

size_t PowerSgdCommunicator::whole_floats() const {
  size_t n = 0;
  for (const auto& b : buckets_) n += b->numel();
  return n;
}

}  // namespace ddp
