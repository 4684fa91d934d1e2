// The communication lane of a rank: collectives run one at a time, in submission order, on
// whichever thread of the rank gets to them first — the lane's own thread while the training
// thread computes, or the training thread itself once it waits for one of them. Every wait the
// lane makes is bounded (distributed.timeout_s) and gives the core away after a short spin, so
// no collective's progress depends on a thread's priority or on a spinning thread getting CPU.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/flight_recorder.h"
#include "comm/gradient_communicator.h"

namespace ddp {

/// How a bounded wait ended.
enum class WaitResult { Done, TimedOut, Cancelled };

/// Waits until done() returns true: a spin of a few microseconds (a peer on another core is
/// usually about to arrive), then polls that yield the core to any other runnable thread, then
/// polls between sleeps of up to a millisecond (a peer that is late by a lot costs no CPU).
/// Gives up after timeout_s, or soon after *cancel becomes true.
WaitResult poll_until(const std::function<bool()>& done, double timeout_s,
                      const std::atomic<bool>* cancel);

/// The error of a collective that did not complete in time (one wording for every backend).
[[noreturn]] void throw_collective_timeout(const std::string& what, double timeout_s);

/// How long a caller spins before it sleeps, learnt from its own past waits: a spin that would
/// have caught the last wait grows to catch it again; a wait far longer than any spin (the peer
/// was descheduled, the machine is busy) halves it. On an idle machine, where waking a sleeper
/// can cost more than the wait (a virtual CPU halts), it settles near the usual wait; on a busy
/// one it falls towards nothing, so waiting costs no CPU.
/// A disabled budget never spins: for ranks that outnumber their node's cores, where the peer
/// being waited for is usually waiting for this very core.
class SpinBudget {
 public:
  explicit SpinBudget(bool enabled = true) : enabled_(enabled) {}
  double seconds() const { return enabled_ ? seconds_ : 0.0; }
  void learn(double waited, bool slept);

 private:
  bool enabled_;
  double seconds_ = 200e-6;
};

/// Spins until done() (or the budget is spent); says whether done() became true.
bool spin_until(const std::function<bool()>& done, double seconds);

class Lane;

/// A collective as errors and the flight recorder name it: what it is, the bytes this rank
/// contributes and the type they travel as ("" where neither applies).
struct Collective {
  Collective(std::string what) : what(std::move(what)) {}  // NOLINT: a name alone
  Collective(const char* what) : what(what) {}             // NOLINT
  Collective(std::string what, size_t bytes, std::string wire)
      : what(std::move(what)), bytes(bytes), wire(std::move(wire)) {}
  std::string what;
  size_t bytes = 0;
  std::string wire;
};

/// One collective on a lane; wait() may run it (and those queued before it) on the caller.
class LaneWork final : public Work {
 public:
  LaneWork(Lane& lane, std::string what, std::function<void()> fn, LaneHooks hooks,
           bool any_thread, std::shared_ptr<FlightRecorder> recorder, uint64_t seq);
  void wait() override;
  double start_time() const override { return start_; }
  double end_time() const override { return end_; }

 private:
  friend class Lane;
  void run(bool cancelled);

  Lane& lane_;
  std::string what_;
  std::function<void()> fn_;
  LaneHooks hooks_;
  bool any_thread_;  // false: it blocks inside MPI without a deadline, only the lane's thread runs it
  std::atomic<bool> done_{false};  // written under the lane's mutex
  std::exception_ptr error_;
  double start_ = 0.0, end_ = 0.0;
  std::shared_ptr<FlightRecorder> recorder_;  // where it is recorded (null: nowhere), as seq_
  uint64_t seq_ = 0;
};

class Lane {
 public:
  /// Starts the lane's thread. spin = false: waits never spin (see SpinBudget).
  explicit Lane(bool spin = true);
  /// Runs what is queued and joins the thread (after stop_broken(): nothing more to do).
  ~Lane();

  /// Queues `fn` (with `hooks` around it); `any_thread` = false keeps it on the lane's thread.
  /// wake = false (for a caller that waits for it at once, with any_thread) leaves the lane's
  /// thread asleep if it is idle: the waiter runs the collective itself, and a rank whose
  /// threads share one core saves two context switches.
  std::shared_ptr<Work> submit(Collective what, std::function<void()> fn,
                               const LaneHooks* hooks = nullptr, bool any_thread = true,
                               bool wake = true);

  /// For the collective running now: waits until done() with the lane's timeout; throws the
  /// timeout error naming the collective (and breaks the lane) or a cancellation error.
  void wait_until(const std::function<bool()>& done);
  /// The timeout of wait_until(), in seconds, and the name of the collective running now.
  double timeout() const { return timeout_s_.load(); }
  const std::string& current() const { return current_->what_; }
  /// The running collective's wait gave up (for the flight recorder); on its own thread.
  void record_timeout();
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  /// Records every collective submitted from now on (null: none).
  void set_recorder(std::shared_ptr<FlightRecorder> recorder);

  /// A wait gave up: a collective is lost, later ones are refused.
  bool broken() const { return broken_.load(); }
  void set_broken() { broken_ = true; }
  /// Raised when a broken lane is stopped: a collective's own waits then end at once.
  const std::atomic<bool>* cancel_flag() const { return &cancel_; }

  /// Whether a wait inside a collective may spin on the calling thread. Not on the lane's own
  /// thread while it shares the rank's only core with a training thread that is computing: a
  /// spin there takes the core from backward (and, beside another program, from the rank's
  /// share of it). Always on a thread that waits for the lane, or once one sleeps waiting.
  bool may_spin_here() const;

  /// After a broken lane: cancels what is queued or polling and stops the thread if it can
  /// within a second, else detaches it. Returns true when the thread had to be left running
  /// (inside a blocking MPI call): the lane must then be leaked, not destroyed.
  bool stop_broken();

 private:
  friend class LaneWork;
  void wait_for(LaneWork& work);
  void run_front(std::unique_lock<std::mutex>& lock);
  void loop();

  std::atomic<double> timeout_s_{600.0};
  std::atomic<bool> broken_{false};
  std::atomic<bool> cancel_{false};
  LaneWork* current_ = nullptr;  // the running collective (mutex)
  std::shared_ptr<FlightRecorder> recorder_;  // (mutex)

  std::mutex mutex_;
  std::condition_variable work_cv_;  // the lane's thread: work queued, or stop
  std::condition_variable done_cv_;  // waiters: a collective finished
  std::deque<std::shared_ptr<LaneWork>> queue_;
  std::atomic<bool> running_{false};  // some thread is executing the front collective (mutex)
  SpinBudget wait_spin_;  // for waiting on a collective another thread runs
  std::atomic<int> sleeping_waiters_{0};  // threads asleep in wait_for()
  const bool spare_core_;  // the lane's thread can run beside the waiter
  bool stop_ = false;
  bool exited_ = false;
  bool stopped_ = false;
  std::thread thread_;
};

}  // namespace ddp
