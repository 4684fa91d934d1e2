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

namespace {

// A PowerSgdBucket reduced on the host communicator's lane. The lane's collective holds the
// bucket: a collective declared lost may return after the communicator is gone.
class HostCompressor final : public PowerSgdCompressor {
 public:
  HostCompressor(HostGradientCommunicator& host, const PowerSgdLayout& layout,
                 const PowerSgdOptions& options, int world)
      : host_(host),
        bucket_(std::make_shared<PowerSgdBucket>(layout.params, layout.numel, options)),
        world_(world) {}

  const PowerSgdPlan& plan() const override { return bucket_->plan(); }

  std::shared_ptr<Work> reduce_async(float* data, bool average, uint64_t seed) override {
    const size_t count = plan().numel(), sent = plan().sent_floats();
    const std::string what =
        "PowerSGD allreduce of " + std::to_string(count) + " floats as " + std::to_string(sent);
    return host_.reduce_on_lane(what, sent * sizeof(float), data, count,
                                [bucket = bucket_, seed, world = world_, average](
                                    float* values, size_t n, const auto& sum) {
                                  bucket->reduce(values, world, sum, seed);
                                  if (average) {
                                    const float inv = 1.0f / static_cast<float>(world);
                                    for (size_t i = 0; i < n; ++i) values[i] *= inv;
                                  }
                                });
  }

  std::vector<float> error() const override { return bucket_->error(); }
  std::vector<float> q() const override { return bucket_->q(); }
  void restore(std::vector<float> error, std::vector<float> q) override {
    bucket_->restore(std::move(error), std::move(q));
  }

 private:
  HostGradientCommunicator& host_;
  std::shared_ptr<PowerSgdBucket> bucket_;
  int world_;
};

}  // namespace

PowerSgdCompressors host_powersgd_compressors(HostGradientCommunicator& host,
                                              const std::vector<PowerSgdLayout>& buckets,
                                              const PowerSgdOptions& options, int world) {
  PowerSgdCompressors compressors;
  for (const PowerSgdLayout& b : buckets)
    compressors.push_back(std::make_unique<HostCompressor>(host, b, options, world));
  return compressors;
}

PowerSgdCommunicator::PowerSgdCommunicator(GradientCommunicator& whole, PowerSgdCompressors buckets,
                                           int64_t start_step, uint64_t seed)
    : whole_(whole), buckets_(std::move(buckets)), start_step_(start_step), seed_(seed) {
  size_t offset = 0;
  for (const auto& b : buckets_) {
    offsets_.push_back(offset);
    offset += b->plan().numel();
  }
}

size_t PowerSgdCommunicator::total() const {
  return offsets_.empty() ? 0 : offsets_.back() + buckets_.back()->plan().numel();
}

float* PowerSgdCommunicator::gradient_arena(size_t numel, const BucketWire& wire) {
  DDP_CHECK(numel == total(),
            "PowerSGD: a gradient arena of " << numel << " floats for buckets of " << total());
  arena_ = whole_.gradient_arena(numel, wire);
  return arena_;
}

size_t PowerSgdCommunicator::bucket_of(const float* data, size_t count) const {
  DDP_CHECK(arena_ != nullptr && data >= arena_, "PowerSGD: a bucket outside the gradient arena");
  const size_t offset = static_cast<size_t>(data - arena_);
  const auto at = std::lower_bound(offsets_.begin(), offsets_.end(), offset);
  DDP_CHECK(at != offsets_.end() && *at == offset,
            "PowerSGD: an allreduce at float " << offset << " does not start a bucket");
  const size_t b = static_cast<size_t>(at - offsets_.begin());
  const size_t numel = buckets_[b]->plan().numel();
  DDP_CHECK(numel == count,
            "PowerSGD: bucket " << b << " has " << numel << " floats, not " << count);
  return b;
}

std::shared_ptr<Work> PowerSgdCommunicator::allreduce_async(float* data, size_t count,
                                                            bool average) {
  const size_t b = bucket_of(data, count);
  const int64_t step = steps_;
  if (b + 1 == buckets_.size()) ++steps_;
  if (step < start_step_) return whole_.allreduce_async(data, count, average);
  const uint64_t seed = mix(seed_ ^ mix(b + 1) ^ mix(static_cast<uint64_t>(step) << 20));
  return buckets_[b]->reduce_async(data, average, seed);
}

PowerSgdState PowerSgdCommunicator::state() const {
  PowerSgdState s;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const PowerSgdPlan& plan = buckets_[b]->plan();
    const std::vector<float> error = buckets_[b]->error();
    if (!error.empty()) {
      if (s.error.empty()) s.error.assign(total(), 0.0f);
      std::copy(error.begin(), error.end(), s.error.begin() + offsets_[b]);
    }
    const std::vector<float> q = buckets_[b]->q();
    if (q.empty()) continue;
    for (size_t i = 0; i < plan.matrices(); ++i) {
      if (!plan.compressed(i)) continue;
      const auto first = q.begin() + static_cast<ptrdiff_t>(plan.q_offset(i));
      const size_t size = plan.matrix(i).cols * plan.factor_rank(i);
      s.q[offsets_[b] + plan.matrix(i).offset].assign(first, first + size);
    }
  }
  return s;
}

void PowerSgdCommunicator::restore(const PowerSgdState& state) {
  DDP_CHECK(state.error.empty() || state.error.size() == total(),
            "PowerSGD state: an error feedback of "
                << state.error.size() << " floats for a gradient arena of " << total());
  size_t used = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const PowerSgdPlan& plan = buckets_[b]->plan();
    std::vector<float> error, q;
    if (!state.error.empty()) {
      const auto first = state.error.begin() + static_cast<ptrdiff_t>(offsets_[b]);
      error.assign(first, first + static_cast<ptrdiff_t>(plan.numel()));
    }
    size_t held = 0, factored = 0;
    q.assign(plan.q_size(), 0.0f);
    for (size_t i = 0; i < plan.matrices(); ++i) {
      if (!plan.compressed(i)) continue;
      ++factored;
      const size_t at = offsets_[b] + plan.matrix(i).offset;
      const auto found = state.q.find(at);
      if (found == state.q.end()) continue;
      const size_t size = plan.matrix(i).cols * plan.factor_rank(i);
      DDP_CHECK(found->second.size() == size, "PowerSGD state: a Q of "
                                                  << found->second.size()
                                                  << " floats for the matrix at float " << at
                                                  << ", whose factors take " << size);
      std::copy(found->second.begin(), found->second.end(),
                q.begin() + static_cast<ptrdiff_t>(plan.q_offset(i)));
      ++held;
    }
    // A bucket of a resumed run's plan may gather matrices whose Q came from buckets of
    // different histories (one started afresh after a non-finite step): it starts afresh too.
    if (held < factored) q.clear();
    used += held;
    buckets_[b]->restore(std::move(error), std::move(q));
  }
  DDP_CHECK(used == state.q.size(), "PowerSGD state: " << state.q.size() - used
                                                       << " Q(s) for matrices sent whole or "
                                                          "not in the gradient arena");
}

size_t PowerSgdCommunicator::factor_rank(size_t offset) const {
  const auto after = std::upper_bound(offsets_.begin(), offsets_.end(), offset);
  if (after == offsets_.begin()) return 0;
  const size_t b = static_cast<size_t>(after - offsets_.begin()) - 1;
  const PowerSgdPlan& plan = buckets_[b]->plan();
  for (size_t i = 0; i < plan.matrices(); ++i)
    if (offsets_[b] + plan.matrix(i).offset == offset) return plan.factor_rank(i);
  return 0;
}

size_t PowerSgdCommunicator::sent_floats() const {
  size_t n = 0;
  for (const auto& b : buckets_) n += b->plan().sent_floats();
  return n;
}

size_t PowerSgdCommunicator::whole_floats() const {
  size_t n = 0;
  for (const auto& b : buckets_) n += b->plan().numel();
  return n;
}

}  // namespace ddp
