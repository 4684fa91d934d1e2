// A step's gradient as the exact sum of fixed chunks of the global batch (chunked_gradients.h).
#include "train/chunked_gradients.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "comm/exact_sum.h"
#include "core/check.h"

namespace ddp {

ChunkedGradients::ChunkedGradients(const Sequential& model, const BucketPlan& plan,
                                   const ChunkLayout& layout, HostGradientCommunicator& sums,
                                   bool shared)
    : layout_(layout), arena_numel_(plan.total_numel), communicator_(sums) {
  DDP_CHECK(layout.chunk > 0 && layout.batch_rows % layout.chunk == 0,
            "training.bitwise_chunk_size: " << layout.chunk << " does not divide the batch of "
                                            << layout.batch_rows << " rows");
  const std::vector<size_t> numels = model.parameter_numels();
  for (size_t p = 0; p < numels.size(); ++p) params_.push_back({plan.param_offset[p], numels[p]});
  offsets_ = plan.param_offset;
  const int64_t chunks = layout.local_chunks() * layout.micro_batches;
  chunk_x_ = Buffer(static_cast<size_t>(layout.chunk * model.in_features()));
  chunk_labels_.resize(static_cast<size_t>(layout.chunk));
  kept_stride_ = (arena_numel_ + 15) / 16 * 16;
  kept_ = Buffer(static_cast<size_t>(chunks) * kept_stride_);
  sums_ = sums.exact_sum_arena(arena_numel_, shared);
  largest_.resize(params_.size());
}

void ChunkedGradients::begin_step() {
  kept_chunks_ = 0;
  chunk_totals_.clear();
  std::fill(largest_.begin(), largest_.end(), 0.0);
  first_bad_rank_ = -1;
}

void ChunkedGradients::add_micro_batch(Backend& be, Sequential& model, const Tensor& x,
                                       const int32_t* labels, int64_t rows, float coef,
                                       Tensor dlogits) {
  DDP_CHECK(rows == layout_.batch_rows, "training.bitwise_across_world_sizes: a batch of "
                                            << rows << " rows where every batch "
                                            << "has " << layout_.batch_rows);
  DDP_CHECK(kept_chunks_ + layout_.local_chunks() <= layout_.local_chunks() * layout_.micro_batches,
            "training.bitwise_across_world_sizes: more than the step's " << layout_.micro_batches
                                                                         << " micro-batch(es)");
  const Tensor chunk_x{chunk_x_.data(), layout_.chunk, x.cols, Device::CPU};
  const Tensor chunk_dlogits = dlogits.first_rows(layout_.chunk);
  float* const values = model.parameters().front()->value.data - offsets_.front();
  for (int64_t t = 0; t < layout_.local_chunks(); ++t) {
    gather_chunk(x, labels, t);
    const Tensor& logits = model.forward(be, chunk_x);
    Tensor d = chunk_dlogits;
    chunk_totals_.push_back(be.softmax_xent(logits, chunk_labels_.data(), coef, &d));
    float* const gradient = kept(kept_chunks_);
    model.bind(values, gradient, offsets_);
    model.backward(be, d, /*accumulate=*/false, [](size_t) {});
    note_largest(gradient);
    ++kept_chunks_;
  }
}

// Chunk t of this rank: its rows t, t + L, t + 2L, ... (L = local_chunks()), in that order.
void ChunkedGradients::gather_chunk(const Tensor& x, const int32_t* labels, int64_t t) {
  const int64_t stride = layout_.local_chunks();
  const size_t row_bytes = static_cast<size_t>(x.cols) * sizeof(float);
  for (int64_t m = 0; m < layout_.chunk; ++m) {
    const int64_t row = t + m * stride;
    std::memcpy(chunk_x_.data() + m * x.cols, x.data + row * x.cols, row_bytes);
    chunk_labels_[static_cast<size_t>(m)] = labels[row];
  }
}

// Each parameter's largest magnitude, with that of a new kept chunk.
void ChunkedGradients::note_largest(const float* chunk) {
  for (size_t p = 0; p < params_.size(); ++p)
    largest_[p] = std::max(largest_[p], max_magnitude(chunk + params_[p].offset, params_[p].numel));
}

XentResult ChunkedGradients::finish(ProcessGroup& comm, Sequential& model, Tensor values,
                                    Tensor grads) {
  model.bind(values.data, grads.data, offsets_);
  DDP_CHECK(comm.size() == layout_.world && kept_chunks_ > 0,
            "training.bitwise_across_world_sizes: a step of "
                << kept_chunks_ << " chunks on " << comm.size() << " of " << layout_.world
                << " ranks");
  const std::vector<double> all = gather_chunk_facts(comm);
  const XentResult totals = job_totals(all);
  sum_chunks(comm.size(), job_largest(all), grads);
  return totals;
}

// One allgather: every rank's chunk loss sums and correct counts, and its largest magnitudes,
// rank-major (the facts of one rank at a time). It also tells every rank that its peers are done
// reading its exact-sum array of the last step (allreduce_exact_async's contract): the array is
// written only after it.
std::vector<double> ChunkedGradients::gather_chunk_facts(ProcessGroup& comm) const {
  std::vector<double> mine;
  mine.reserve(facts_per_rank());
  for (const XentResult& r : chunk_totals_) mine.push_back(r.loss_sum);
  for (const XentResult& r : chunk_totals_) mine.push_back(static_cast<double>(r.correct));
  mine.insert(mine.end(), largest_.begin(), largest_.end());
  if (comm.size() == 1) return mine;
  std::vector<double> all(mine.size() * static_cast<size_t>(comm.size()));
  comm.allgather(mine.data(), mine.size(), all.data());
  return all;
}

// Each parameter's largest magnitude over every rank's chunks: a maximum of maxima, exact, so
// the same on every rank in any order.
std::vector<double> ChunkedGradients::job_largest(const std::vector<double>& all) const {
  const size_t count = facts_per_rank(), first = 2 * chunk_totals_.size();
  std::vector<double> largest(params_.size(), 0.0);
  for (size_t at = 0; at < all.size(); at += count) {
    for (size_t p = 0; p < params_.size(); ++p)
      largest[p] = std::max(largest[p], all[at + first + p]);
  }
  return largest;
}

// The kept chunks of every rank added exactly, parameter by parameter on its grid, into `grads`;
// a parameter whose largest magnitude is not finite becomes NaN. On one rank the sums go
// straight to float32; otherwise into the exact-sum array, allreduced, then converted.
void ChunkedGradients::sum_chunks(int world, const std::vector<double>& largest, Tensor grads) {
  const int64_t terms = kept_chunks_ * world;
  const size_t chunks = static_cast<size_t>(kept_chunks_);
  std::vector<int> exponent(params_.size(), 0);
  for (size_t p = 0; p < params_.size(); ++p) {
    const Span& s = params_[p];
    if (!std::isfinite(largest[p])) {
      std::fill_n(sums_ + s.offset, s.numel, 0.0);  // NaN once summed
      continue;
    }
    exponent[p] = exact_sum_exponent(largest[p], terms);
    if (world == 1) {
      sum_values_on_grid(kept(0) + s.offset, kept_stride_, chunks, s.numel, exponent[p],
                         grads.data + s.offset);
    } else {
      sum_on_grid(kept(0) + s.offset, kept_stride_, chunks, s.numel, exponent[p], sums_ + s.offset);
    }
  }
  if (world > 1) {
    // Each part of the sums, as the allreduce hands it over (exact: any order, the same bits),
    // rounded into the parameters it covers. Everything by value but the gradient arena, which
    // the communicator owns: a lost allreduce may still call it after this step gave up.
    float* const out = grads.data;
    communicator_
        .allreduce_exact_async(
            [params = params_, largest, exponent, out](size_t first, const double* sums, size_t n) {
              for (size_t p = 0; p < params.size(); ++p) {
                const size_t lo = std::max(first, params[p].offset);
                const size_t hi = std::min(first + n, params[p].end());
                if (lo < hi && std::isfinite(largest[p]))
                  values_from_grid(sums + (lo - first), hi - lo, exponent[p], out + lo);
              }
            })
        ->wait();
  }
  for (size_t p = 0; p < params_.size(); ++p) {
    const Span& s = params_[p];
    if (!std::isfinite(largest[p]))
      std::fill_n(grads.data + s.offset, s.numel, std::numeric_limits<float>::quiet_NaN());
  }
}

// The job's loss totals from every rank's chunk totals (rank-major in `all`), added in the
// chunks' global order: micro-batch by micro-batch, chunk k of rank k mod N, its (k / N)-th.
XentResult ChunkedGradients::job_totals(const std::vector<double>& all) {
  const int world = layout_.world;
  const size_t chunks = chunk_totals_.size(), count = facts_per_rank();
  const int64_t local = layout_.local_chunks();
  XentResult totals;
  const int64_t micro_batches = kept_chunks_ / local;  // the epoch's last step may have fewer
  for (int64_t m = 0; m < micro_batches; ++m) {
    for (int64_t k = 0; k < layout_.job_chunks(); ++k) {
      const int r = static_cast<int>(k % world);
      const size_t at = r * count + static_cast<size_t>(m * local + k / world);
      totals.loss_sum += all[at];
      totals.correct += static_cast<int64_t>(all[at + chunks]);
      if (!std::isfinite(all[at]) && (first_bad_rank_ < 0 || r < first_bad_rank_))
        first_bad_rank_ = r;
    }
  }
  return totals;
}

}  // namespace ddp
