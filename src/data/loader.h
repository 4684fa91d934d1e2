// Batches assembled from a Dataset on prefetch threads, so gathering rows overlaps compute.
// With several workers each assembles whole batches, the next unclaimed one into its slot, and
// the consumer takes them in order: a batch's contents depend only on the index order, never on
// which worker made it or when.
// Features read from a file mapping (.npy) that is not all in memory have the rows of the batch
// after the one being assembled announced to the kernel, so that their pages are read in
// parallel, ahead of time, instead of one page fault at a time. Every 16th batch probes
// whether the next one's rows are in memory; read-ahead runs until a probe finds them all.
// Every value of every batch is checked to be finite as it is assembled (a NaN or an infinity
// is an error naming the file, the sample and the feature).
// A ring of prefetch + 1 reusable slots (one held by the consumer, up to `prefetch` ahead):
// no allocation after construction, and the batch contents depend only on the index order.
#pragma once

#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "data/dataset.h"

namespace ddp {

struct Batch {
  std::vector<float> x;    ///< rows*features (capacity batch_size*features, reused)
  std::vector<int32_t> y;  ///< rows
  int64_t rows = 0;
  int64_t index = 0;  ///< batch number within the epoch
};

/// One consumer thread calls start_epoch/next; `ds` must outlive the Loader.
class Loader {
 public:
  /// batch_size > 0, prefetch >= 0, workers >= 1 (at most prefetch + 1 of them fill at once);
  /// throws ddp::Error otherwise or if ds is inconsistent.
  Loader(const Dataset& ds, int64_t batch_size, bool drop_last, int64_t prefetch, int workers = 1);
  /// Stops and joins the workers, also in the middle of an epoch.
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  /// Begins an epoch over `indices` (in this order), abandoning any unfinished one. Indices are
  /// checked by the worker: one outside [0, ds.size) makes next() throw ddp::Error at its batch.
  void start_epoch(std::vector<int64_t> indices);
  /// The next batch, or nullptr at the end of the epoch; valid until the following
  /// next()/start_epoch(). Rethrows an exception raised by the worker for this batch: an index
  /// outside the data set, or a feature that is not finite (as stored, or once normalised).
  const Batch* next();
  /// Batches the current epoch yields (a final partial batch counts unless drop_last).
  int64_t batches_in_epoch() const;
  /// Total seconds next() spent blocked waiting for the workers (the data-wait metric).
  double wait_seconds() const { return wait_seconds_; }

 private:
  void worker_loop();
  void fill(Batch& batch, int64_t batch_index);
  void check_finite(const float* row, int64_t sample) const;
  void read_ahead(int64_t batch_index);
  bool resident(int64_t batch_index) const;
  void announce(int64_t batch_index) const;

  const Dataset& ds_;
  const int64_t batch_size_;
  const bool drop_last_;
  std::vector<Batch> slots_;
  std::vector<int64_t> indices_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> workers_;
  // Guarded by mu_. Batches are numbered within the epoch; batch k lives in slot k % slots.
  bool stop_ = false;
  bool started_ = false;
  int busy_ = 0;  // workers filling a slot outside the lock
  int64_t total_batches_ = 0;
  int64_t claimed_ = 0;                    // batches a worker has taken on
  std::vector<int64_t> filled_;            // per slot: the batch it holds complete, or -1
  int64_t consumed_ = 0;                   // batches handed out by next()
  int64_t released_ = 0;                   // batches whose slots the consumer gave back
  int64_t failed_ = INT64_MAX;             // the first batch whose fill failed
  std::exception_ptr error_;               // that failure
  double wait_seconds_ = 0.0;              // consumer-thread only
  std::atomic<bool> reading_ahead_{true};  // the last probe found rows not in memory
};

}  // namespace ddp
