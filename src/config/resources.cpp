// The memory a config asks of each rank (resources.h): each product is formed in int64 with the
// compiler's overflow checks, and spelled out with the keys' values for the message.
#include "config/resources.h"

#include <unistd.h>

#include <algorithm>

namespace ddp {
namespace {

/// An int64 that remembers an overflow in any step that formed it.
struct Checked {
  int64_t value = 0;
  bool overflow = false;

  Checked times(int64_t f) const {
    Checked r = *this;
    r.overflow = r.overflow || __builtin_mul_overflow(value, f, &r.value);
    return r;
  }
  Checked plus(const Checked& o) const {
    Checked r = *this;
    r.overflow = r.overflow || o.overflow || __builtin_add_overflow(value, o.value, &r.value);
    return r;
  }
  Checked plus(int64_t v) const { return plus(Checked{v}); }
};

std::string layer_key(size_t i) { return "model.layers[" + std::to_string(i) + "]"; }

std::string named(const std::string& key, int64_t v) { return key + " " + std::to_string(v); }

MemoryDemand demand(std::string what, std::vector<std::string> keys, std::string product,
                    const Checked& bytes) {
  return MemoryDemand{std::move(what), std::move(keys), std::move(product), bytes.value,
                      bytes.overflow};
}

/// Forward keeps every layer's output and backward its gradient; the widest layer's alone, for
/// one micro-batch, is the least of it.
MemoryDemand activations(const TrainConfig& c) {
  const std::vector<int64_t>& w = c.model.layers;
  const auto widest = static_cast<size_t>(std::max_element(w.begin(), w.end()) - w.begin());
  const int64_t batch = c.training.batch_size;
  return demand("the activations of one micro-batch", {"training.batch_size", layer_key(widest)},
                named("training.batch_size", batch) + " x " + named(layer_key(widest), w[widest]) +
                    " x 4 bytes",
                Checked{batch}.times(w[widest]).times(4));
}

/// Bytes each parameter takes in float32: the weight, its gradient and the optimizer's state
/// (which a sharded optimizer splits over the ranks, so it is not counted then).
int64_t bytes_per_parameter(const TrainConfig& c, std::string& parts) {
  int64_t states = 0;
  const OptimizerConfig& o = c.optimizer;
  if (!c.distributed.shard_optimizer) {
    const bool sgd = o.name == OptimizerName::Sgd;
    states = sgd ? (o.momentum > 0 ? 1 : 0) : (o.amsgrad ? 3 : 2);  // momentum; exp_avg(_sq)
  }
  parts = states == 0 ? "weight and gradient"
                      : "weight, gradient and " + std::to_string(states) + " optimizer state(s)";
  return 4 * (2 + states);
}

Checked parameter_count(const TrainConfig& c) {
  const std::vector<int64_t>& w = c.model.layers;
  Checked count;
  for (size_t i = 0; i + 1 < w.size(); ++i)
    count = count.plus(Checked{w[i]}.plus(1).times(w[i + 1]));  // in x out weights, out biases
  return count;
}

MemoryDemand parameters(const TrainConfig& c) {
  const Checked count = parameter_count(c);
  std::string parts;
  const int64_t each = bytes_per_parameter(c, parts);
  const std::string how_many = count.overflow ? "(the sum of in x out + out over model.layers)"
                                              : std::to_string(count.value) + " in model.layers";
  return demand("the parameters", {"model.layers"},
                how_many + " x " + std::to_string(each) + " bytes (" + parts + ")",
                count.times(each));
}

/// training.bitwise_across_world_sizes keeps a gradient per chunk of the rank's step.
MemoryDemand kept_chunks(const TrainConfig& c) {
  const TrainingConfig& t = c.training;
  const Checked chunks = Checked{t.batch_size / t.bitwise_chunk_size}.times(t.accumulate_steps);
  const Checked count = parameter_count(c);
  const std::string how_many =
      count.overflow ? "the parameters" : std::to_string(count.value) + " parameters";
  return demand("the kept chunk gradients of bitwise_across_world_sizes",
                {"training.bitwise_chunk_size", "training.batch_size", "training.accumulate_steps",
                 "model.layers"},
                "(" + named("training.batch_size", t.batch_size) + " / " +
                    named("training.bitwise_chunk_size", t.bitwise_chunk_size) + ") x " +
                    named("training.accumulate_steps", t.accumulate_steps) + " x " + how_many +
                    " x 4 bytes",
                chunks.times(count.value).times(4).plus(Checked{0, count.overflow}));
}

/// The loader fills prefetch + 1 slots of a whole batch each, however small the data set.
MemoryDemand prefetched(const TrainConfig& c) {
  const int64_t batch = c.training.batch_size, width = c.model.layers.front();
  return demand("the loader's batches", {"data.prefetch", "training.batch_size", layer_key(0)},
                "(" + named("data.prefetch", c.data.prefetch) + " + 1) x " +
                    named("training.batch_size", batch) + " x " + named(layer_key(0), width) +
                    " x 4 bytes",
                Checked{c.data.prefetch}.plus(1).times(batch).times(width).times(4));
}

/// Generated features (float32) and labels (int32), held whole by every rank.
MemoryDemand generated(const TrainConfig& c, const char* split, int64_t samples) {
  const std::string key = std::string("data.") + split + ".samples";
  const int64_t width = c.model.layers.front();
  return demand(std::string("the generated ") + split + " samples", {key, layer_key(0)},
                named(key, samples) + " x (" + named(layer_key(0), width) + " + 1 label) x 4 bytes",
                Checked{width}.plus(1).times(samples).times(4));
}

}  // namespace

std::vector<MemoryDemand> memory_demands(const TrainConfig& cfg) {
  std::vector<MemoryDemand> out = {activations(cfg), parameters(cfg), prefetched(cfg)};
  if (cfg.training.bitwise_across_world_sizes) out.push_back(kept_chunks(cfg));
  if (cfg.data.format == DataFormat::Synthetic) {
    out.push_back(generated(cfg, "train", cfg.data.train.samples));
    if (cfg.data.test.samples > 0) out.push_back(generated(cfg, "test", cfg.data.test.samples));
  }
  return out;
}

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  const Checked bytes = Checked{pages}.times(page);
  return bytes.overflow ? INT64_MAX : bytes.value;
}

}  // namespace ddp
