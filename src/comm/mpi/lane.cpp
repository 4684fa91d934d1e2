// The communication lane (lane.h): a FIFO of collectives that the lane's thread and any thread
// waiting for one of them drive in turn, and the bounded, core-yielding wait they all use.
#include "comm/mpi/lane.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "comm/environment.h"
#include "comm/lost_peer.h"
#include "core/check.h"
#include "core/clock.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace ddp {

namespace {

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// The spin is worth it only while the awaited peer is running on another core right now; the
// yielding phase then hands the core to whoever else is runnable on it (another rank, the
// training thread, another program) and returns at once on an idle core; the sleeping phase
// keeps a long wait (a peer writing a checkpoint, a stalled peer) from costing a core.
constexpr double kSpinSeconds = 20e-6;
constexpr double kYieldSeconds = 2e-3;
constexpr double kMaxSleepSeconds = 1e-3;

// The range of SpinBudget: a spin longer than kMaxSpin is not worth its CPU on any machine.
constexpr double kMinSpinSeconds = 2e-6;
constexpr double kMaxSpinSeconds = 2e-3;
// The lane whose own thread this is (nullptr on every other thread).
thread_local const Lane* this_lanes_thread = nullptr;

}  // namespace

void SpinBudget::learn(double waited, bool slept) {
  if (!slept) return;
  if (waited < kMaxSpinSeconds) {
    seconds_ = std::min(kMaxSpinSeconds, std::max(2 * seconds_, 1.5 * waited));
  } else {
    seconds_ = std::max(kMinSpinSeconds, seconds_ / 2);
  }
}

bool spin_until(const std::function<bool()>& done, double seconds) {
  const double start = seconds_now();
  do {
    for (int k = 0; k < 16; ++k) {
      if (done()) return true;
      cpu_relax();
    }
  } while (seconds_now() - start < seconds);
  return done();
}

WaitResult poll_until(const std::function<bool()>& done, double timeout_s,
                      const std::atomic<bool>* cancel) {
  const double start = seconds_now();
  double sleep_s = 20e-6;
  for (;;) {
    if (done()) return WaitResult::Done;
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) return WaitResult::Cancelled;
    const double waited = seconds_now() - start;
    if (waited > timeout_s) return done() ? WaitResult::Done : WaitResult::TimedOut;
    if (waited < kSpinSeconds) {
      for (int k = 0; k < 16; ++k) cpu_relax();
    } else if (waited < kYieldSeconds) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
      sleep_s = std::min(kMaxSleepSeconds, sleep_s * 2);
    }
  }
}

void throw_collective_timeout(const std::string& what, double timeout_s) {
  note_collective_timeout();
  DDP_THROW(what << " did not complete within " << timeout_s
                 << " s (distributed.timeout_s): a peer rank died, stalled or stopped on an "
                    "error");
}

LaneWork::LaneWork(Lane& lane, std::string what, std::function<void()> fn, LaneHooks hooks,
                   bool any_thread, std::shared_ptr<FlightRecorder> recorder, uint64_t seq)
    : lane_(lane),
      what_(std::move(what)),
      fn_(std::move(fn)),
      hooks_(std::move(hooks)),
      any_thread_(any_thread),
      recorder_(std::move(recorder)),
      seq_(seq) {}

void LaneWork::wait() { lane_.wait_for(*this); }

// Runs on exactly one thread, with the lane's mutex released; done_ is set by the caller.
void LaneWork::run(bool cancelled) {
  try {
    if (cancelled) DDP_THROW(what_ << " cancelled: an earlier collective was lost");
    if (hooks_.ready) hooks_.ready();
    start_ = seconds_now();
    if (recorder_) recorder_->started(seq_, start_);
    if (hooks_.before) hooks_.before();
    fn_();
    if (hooks_.after) hooks_.after();
  } catch (...) {
    error_ = std::current_exception();
  }
  if (start_ == 0.0) start_ = seconds_now();
  end_ = seconds_now();
  if (recorder_) recorder_->ended(seq_, error_ == nullptr, end_);
  fn_ = nullptr;  // what it captured goes now, not when the last handle does
  hooks_ = LaneHooks{};
}

Lane::Lane(bool spin) : spare_core_(spin && usable_cpus() > 1) {
  thread_ = std::thread([this] { loop(); });
}

Lane::~Lane() {
  if (stopped_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Lane::stop_broken() {
  cancel_ = true;
  std::unique_lock<std::mutex> lock(mutex_);
  stop_ = true;
  stopped_ = true;
  work_cv_.notify_all();
  const bool exited = done_cv_.wait_for(lock, std::chrono::seconds(1), [&] { return exited_; });
  lock.unlock();
  if (exited) {
    thread_.join();
    return false;
  }
  thread_.detach();
  return true;
}

void Lane::record_timeout() {
  if (current_ != nullptr && current_->recorder_) current_->recorder_->timed_out(current_->seq_);
}

void Lane::set_recorder(std::shared_ptr<FlightRecorder> recorder) {
  std::lock_guard<std::mutex> lock(mutex_);
  recorder_ = std::move(recorder);
}

std::shared_ptr<Work> Lane::submit(Collective what, std::function<void()> fn,
                                   const LaneHooks* hooks, bool any_thread, bool wake) {
  DDP_CHECK(!broken(), what.what << " refused: an earlier collective timed out and the "
                                    "communication lane is stuck");
  std::shared_ptr<LaneWork> work;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Numbered as queued: the order every rank issues its collectives in.
    const uint64_t seq = recorder_ ? recorder_->issued(what.what, what.bytes, what.wire) : 0;
    work = std::make_shared<LaneWork>(*this, std::move(what.what), std::move(fn),
                                      hooks != nullptr ? *hooks : LaneHooks{}, any_thread,
                                      recorder_, seq);
    queue_.push_back(work);
  }
  // Not woken, a busy lane thread still finds it when it finishes (run_front notifies).
  if (wake || !any_thread) work_cv_.notify_one();
  return work;
}

// Pops the front collective and runs it on this thread; the mutex is released meanwhile.
void Lane::run_front(std::unique_lock<std::mutex>& lock) {
  std::shared_ptr<LaneWork> work = std::move(queue_.front());
  queue_.pop_front();
  running_ = true;
  current_ = work.get();
  lock.unlock();
  work->run(cancel_.load());
  lock.lock();
  current_ = nullptr;
  running_ = false;
  work->done_ = true;
  done_cv_.notify_all();
  // The lane's thread has something to do only when more is queued (or it must stop).
  if (!queue_.empty() || stop_) work_cv_.notify_one();
}

// A waiting thread has nothing better to do than drive the lane itself: it runs the queue up
// to its collective whenever no other thread is running one, and sleeps only while one is.
void Lane::wait_for(LaneWork& work) {
  std::unique_lock<std::mutex> lock(mutex_);
  const double timeout = timeout_s_.load();
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(timeout));
  while (!work.done_) {
    if (!running_ && !queue_.empty() && queue_.front()->any_thread_) {
      run_front(lock);
      continue;
    }
    // Another thread runs the front collective. Where it can run on another core it may well
    // end before a sleeper could be woken, so spin first (within what such waits have been
    // taking); on a rank bound to one core spinning would only delay it: sleep at once.
    lock.unlock();
    const double start = seconds_now();
    const bool caught =
        spare_core_ && spin_until([&] { return work.done_ || !running_; }, wait_spin_.seconds());
    lock.lock();
    if (caught) {
      wait_spin_.learn(seconds_now() - start, false);
      continue;
    }
    // The front may have finished while the mutex was released: sleep only while another
    // thread is still running it (a notification before this wait would otherwise be lost).
    ++sleeping_waiters_;
    const bool woken = done_cv_.wait_until(lock, deadline, [&] { return work.done_ || !running_; });
    --sleeping_waiters_;
    if (!woken) {
      broken_ = true;
      if (work.recorder_) work.recorder_->timed_out(work.seq_);
      throw_collective_timeout(work.what_, timeout);
    }
    wait_spin_.learn(seconds_now() - start, true);
  }
  if (work.error_) std::rethrow_exception(work.error_);
}

bool Lane::may_spin_here() const {
  return spare_core_ || this_lanes_thread != this || sleeping_waiters_.load() > 0;
}

void Lane::wait_until(const std::function<bool()>& done) {
  const double timeout = timeout_s_.load();
  switch (poll_until(done, timeout, &cancel_)) {
    case WaitResult::Done:
      return;
    case WaitResult::TimedOut:
      broken_ = true;
      record_timeout();
      throw_collective_timeout(current(), timeout);
    case WaitResult::Cancelled:
      DDP_THROW(current() << " cancelled: an earlier collective was lost");
  }
}

void Lane::loop() {
  this_lanes_thread = this;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return !running_ && (stop_ || !queue_.empty()); });
    if (queue_.empty()) break;  // stop requested and nothing left to run
    run_front(lock);
  }
  exited_ = true;
  done_cv_.notify_all();
}

}  // namespace ddp
