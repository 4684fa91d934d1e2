// The prefetching batch loader. The worker fills batch k into slot k % slots outside the lock;
// a slot is reused only after the consumer has moved past it, and start_epoch waits for an
// in-flight fill to finish, so no slot is read while it is being written.
#include "data/loader.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/check.h"

namespace ddp {

Loader::Loader(const Dataset& ds, int64_t batch_size, bool drop_last, int64_t prefetch)
    : ds_(ds), batch_size_(batch_size), drop_last_(drop_last) {
  DDP_CHECK(batch_size > 0, "Loader: batch_size must be positive, got " << batch_size);
  DDP_CHECK(prefetch >= 0, "Loader: prefetch must be non-negative, got " << prefetch);
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
  worker_ = std::thread([this] { worker_loop(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

int64_t Loader::batches_in_epoch() const {
  const auto n = static_cast<int64_t>(indices_.size());
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

void Loader::start_epoch(std::vector<int64_t> indices) {
  std::unique_lock<std::mutex> lock(mu_);
  // Stop the worker from starting another fill of the old epoch and let an in-flight one
  // finish (it reads indices_); resetting the counters below then discards what it made.
  started_ = false;
  cv_.wait(lock, [this] { return !busy_; });
  indices_ = std::move(indices);
  total_batches_ = batches_in_epoch();
  produced_ = consumed_ = released_ = 0;
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
  const auto ready = [this] { return produced_ > consumed_ || error_; };
  if (!ready()) {
    const auto t0 = std::chrono::steady_clock::now();
    cv_.wait(lock, ready);
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Batches finished before a failure are still delivered; the error belongs to the next one.
  if (produced_ <= consumed_) std::rethrow_exception(error_);
  const Batch* batch = &slots_[static_cast<size_t>(consumed_) % slots_.size()];
  ++consumed_;
  return batch;
}

void Loader::worker_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto slots = static_cast<int64_t>(slots_.size());
  for (;;) {
    cv_.wait(lock, [&] {
      return stop_ ||
             (started_ && !error_ && produced_ < total_batches_ && produced_ < released_ + slots);
    });
    if (stop_) return;
    const int64_t k = produced_;
    busy_ = true;
    lock.unlock();
    std::exception_ptr failure;
    try {
      fill(slots_[static_cast<size_t>(k % slots)], k);
    } catch (...) {
      failure = std::current_exception();
    }
    lock.lock();
    busy_ = false;
    if (failure)
      error_ = failure;
    else
      ++produced_;
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
