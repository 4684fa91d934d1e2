// The prefetching batch loader. A worker claims the next batch k and fills it into slot
// k % slots outside the lock; a slot is claimed again only after the consumer has moved past
// it, the consumer takes batch k only once its slot says it holds k complete, and start_epoch
// waits for in-flight fills to finish, so no slot is read while it is being written.
#include "data/loader.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/check.h"

namespace ddp {

Loader::Loader(const Dataset& ds, int64_t batch_size, bool drop_last, int64_t prefetch, int workers)
    : ds_(ds), batch_size_(batch_size), drop_last_(drop_last) {
  DDP_CHECK(batch_size > 0, "Loader: batch_size must be positive, got " << batch_size);
  DDP_CHECK(prefetch >= 0, "Loader: prefetch must be non-negative, got " << prefetch);
  DDP_CHECK(workers >= 1, "Loader: workers must be at least 1, got " << workers);
  DDP_CHECK(ds.features > 0 && static_cast<int64_t>(ds.x.size()) == ds.size * ds.features &&
                static_cast<int64_t>(ds.y.size()) == ds.size,
            "Loader: dataset " << ds.source << " is inconsistent: size " << ds.size << ", features "
                               << ds.features << ", " << ds.x.size() << " values, " << ds.y.size()
                               << " labels");
  slots_.resize(static_cast<size_t>(prefetch + 1));
  for (auto& s : slots_) {
    s.x.reserve(static_cast<size_t>(batch_size * ds.features));
    s.y.reserve(static_cast<size_t>(batch_size));
  }
  filled_.assign(slots_.size(), -1);
  for (int w = 0; w < workers; ++w) workers_.emplace_back([this] { worker_loop(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& w : workers_) w.join();
}

int64_t Loader::batches_in_epoch() const {
  const auto n = static_cast<int64_t>(indices_.size());
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

void Loader::start_epoch(std::vector<int64_t> indices) {
  std::unique_lock<std::mutex> lock(mu_);
  // Stop the workers from starting another fill of the old epoch and let the in-flight ones
  // finish (they read indices_); resetting the counters below then discards what they made.
  started_ = false;
  cv_.wait(lock, [this] { return busy_ == 0; });
  indices_ = std::move(indices);
  total_batches_ = batches_in_epoch();
  claimed_ = consumed_ = released_ = 0;
  std::fill(filled_.begin(), filled_.end(), -1);
  failed_ = INT64_MAX;
  error_ = nullptr;
  started_ = true;
  lock.unlock();
  cv_.notify_all();
}

const Batch* Loader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  DDP_CHECK(started_, "Loader::next() called before start_epoch()");
  released_ = consumed_;  // the batch handed out last time is done with
  cv_.notify_all();
  if (consumed_ == total_batches_) return nullptr;
  const size_t slot = static_cast<size_t>(consumed_) % slots_.size();
  const auto ready = [&] { return filled_[slot] == consumed_ || failed_ <= consumed_; };
  if (!ready()) {
    const auto t0 = std::chrono::steady_clock::now();
    cv_.wait(lock, ready);
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Batches before a failed one are still delivered; the error belongs to the failed one.
  if (filled_[slot] != consumed_) std::rethrow_exception(error_);
  ++consumed_;
  return &slots_[slot];
}

void Loader::worker_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto slots = static_cast<int64_t>(slots_.size());
  for (;;) {
    cv_.wait(lock, [&] {
      return stop_ || (started_ && claimed_ < failed_ && claimed_ < total_batches_ &&
                       claimed_ < released_ + slots);
    });
    if (stop_) return;
    const int64_t k = claimed_++;
    const auto slot = static_cast<size_t>(k % slots);
    ++busy_;
    lock.unlock();
    std::exception_ptr failure;
    try {
      fill(slots_[slot], k);
    } catch (...) {
      failure = std::current_exception();
    }
    lock.lock();
    --busy_;
    if (!failure) {
      filled_[slot] = k;
    } else if (k < failed_) {  // the first failure in batch order is the one reported
      failed_ = k;
      error_ = failure;
    }
    cv_.notify_all();
  }
}

namespace {

constexpr int64_t kProbeEvery = 16;  // batches between residency probes of a file-backed store

// Calls `row(i)` for each valid sample index of batch `batch_index` (none past the epoch).
template <typename Row>
void for_each_row(const std::vector<int64_t>& indices, int64_t batch_size, int64_t size,
                  int64_t batch_index, Row row) {
  const auto n = static_cast<int64_t>(indices.size());
  const int64_t end = std::min(n, (batch_index + 1) * batch_size);
  for (int64_t p = batch_index * batch_size; p < end; ++p) {
    const int64_t i = indices[static_cast<size_t>(p)];
    if (i >= 0 && i < size) row(static_cast<size_t>(i));
  }
}

}  // namespace

bool Loader::resident(int64_t batch_index) const {
  const auto f = static_cast<size_t>(ds_.features);
  bool all = true;
  for_each_row(indices_, batch_size_, ds_.size, batch_index,
               [&](size_t i) { all = all && ds_.x.resident(i * f, f); });
  return all;
}

// The rows of batch `batch_index` will be read soon.
void Loader::announce(int64_t batch_index) const {
  const auto f = static_cast<size_t>(ds_.features);
  for_each_row(indices_, batch_size_, ds_.size, batch_index,
               [&](size_t i) { ds_.x.will_need(i * f, f); });
}

// Before batch `batch_index` is assembled: the next batch's reads start, while the data is
// not all in memory.
void Loader::read_ahead(int64_t batch_index) {
  if (!ds_.x.file_backed()) return;
  if (batch_index == 0 && !resident(0)) announce(0);
  if (batch_index % kProbeEvery == 0) reading_ahead_ = !resident(batch_index + 1);
  if (reading_ahead_) announce(batch_index + 1);
}

// Every value the model sees must be finite: a NaN or an infinity in the data would surface only
// as a non-finite loss, blamed on the learning rate. The stored value tells which is at fault:
// the file, or a normalisation that overflows.
void Loader::check_finite(const float* row, int64_t sample) const {
  const auto f = static_cast<size_t>(ds_.features);
  const size_t j = first_non_finite(row, f);
  if (j == f) return;
  require_finite_rows(ds_.x, ds_.features, sample, 1, ds_.source);
  DDP_THROW(ds_.source << ": sample " << sample << ", feature " << j << " is "
                       << ds_.x[static_cast<size_t>(sample) * f + j]
                       << ", which data.normalize (mean " << ds_.transform.mean[j] << ", std "
                       << ds_.transform.std[j] << ") turns into " << row[j]);
}

void Loader::fill(Batch& batch, int64_t batch_index) {
  const auto n = static_cast<int64_t>(indices_.size());
  const int64_t begin = batch_index * batch_size_;
  const int64_t rows = std::min(batch_size_, n - begin);
  const auto f = static_cast<size_t>(ds_.features);
  read_ahead(batch_index);
  batch.x.resize(static_cast<size_t>(rows) * f);  // within the reserved capacity: no allocation
  batch.y.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = indices_[static_cast<size_t>(begin + r)];
    DDP_CHECK(i >= 0 && i < ds_.size, "Loader: index " << i << " at position " << begin + r
                                                       << " of the epoch is outside dataset "
                                                       << ds_.source << " (size " << ds_.size
                                                       << ")");
    float* row = batch.x.data() + static_cast<size_t>(r) * f;
    ds_.read_rows(i, 1, row);
    check_finite(row, i);
    batch.y[static_cast<size_t>(r)] = ds_.y[static_cast<size_t>(i)];
  }
  batch.rows = rows;
  batch.index = batch_index;
}

}  // namespace ddp
