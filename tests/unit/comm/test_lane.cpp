// The communication lane and the node barrier (src/comm/mpi/lane.h, shm_barrier.h) on threads of
// one process: order, visibility, deadlines (which mark the process as having lost a peer),
// cancellation, and that a waiter sleeps rather than spins (its CPU time while it waits for a
// late peer).
#include <catch2/catch.hpp>

#include <ctime>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/clock.h"
#include "comm/lost_peer.h"
#include "comm/mpi/lane.h"
#include "comm/mpi/shm_barrier.h"

namespace {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

TEST_CASE("node barrier: every round sees every participant's stores of that round", "[comm]") {
  constexpr int kThreads = 4, kRounds = 1000;
  ddp::ShmBarrierState state;
  ddp::ShmBarrier barrier(&state, kThreads);
  std::vector<int> slot(kThreads, -1);
  std::vector<int> errors(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ddp::SpinBudget spin[2];
      for (int r = 0; r < kRounds; ++r) {
        slot[static_cast<size_t>(t)] = r * kThreads + t;
        if (barrier.arrive_and_wait(30, nullptr, spin[0]) != ddp::WaitResult::Done) ++errors[t];
        for (int q = 0; q < kThreads; ++q)
          if (slot[static_cast<size_t>(q)] != r * kThreads + q) ++errors[t];
        if (barrier.arrive_and_wait(30, nullptr, spin[1]) != ddp::WaitResult::Done) ++errors[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) CHECK(errors[static_cast<size_t>(t)] == 0);
  CHECK(state.generation.load() == 2u * kRounds);
  CHECK(state.sleepers.load() == 0u);
}

TEST_CASE("node barrier: a peer that never arrives ends the wait at the deadline", "[comm]") {
  ddp::ShmBarrierState state;
  ddp::ShmBarrier barrier(&state, 2);
  ddp::SpinBudget spin;
  const double start = ddp::seconds_now();
  CHECK(barrier.arrive_and_wait(0.3, nullptr, spin) == ddp::WaitResult::TimedOut);
  const double took = ddp::seconds_now() - start;
  CHECK(took >= 0.3);
  CHECK(took < 5.0);
}

TEST_CASE("node barrier: cancelling ends a wait at once", "[comm]") {
  ddp::ShmBarrierState state;
  ddp::ShmBarrier barrier(&state, 2);
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    cancel = true;
  });
  ddp::SpinBudget spin;
  const double start = ddp::seconds_now();
  CHECK(barrier.arrive_and_wait(60, &cancel, spin) == ddp::WaitResult::Cancelled);
  CHECK(ddp::seconds_now() - start < 5.0);
  canceller.join();
}

TEST_CASE("node barrier: waiting for a late peer costs (almost) no CPU", "[comm]") {
  ddp::ShmBarrierState state;
  ddp::ShmBarrier barrier(&state, 2);
  double late_arrived = 0;  // written before the barrier, read after it
  std::thread late([&] {
    ddp::SpinBudget spin;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    late_arrived = ddp::seconds_now();
    barrier.arrive_and_wait(30, nullptr, spin);
  });
  ddp::SpinBudget spin;
  const double cpu0 = thread_cpu_seconds(), wall0 = ddp::seconds_now();
  CHECK(barrier.arrive_and_wait(30, nullptr, spin) == ddp::WaitResult::Done);
  const double cpu = thread_cpu_seconds() - cpu0, returned = ddp::seconds_now();
  late.join();
  INFO("waited " << returned - wall0 << " s using " << cpu << " s of CPU");
  CHECK(returned >= late_arrived);  // did not return before the late peer arrived
  CHECK(cpu < 0.1);  // a spinning wait would use ~all of it
  // A wait far past any spin halves the spin budget: the next wait spins less.
  CHECK(spin.seconds() < 200e-6);
}

TEST_CASE("spin budget: grows to catch short waits, halves on long ones, stays bounded",
          "[comm]") {
  ddp::SpinBudget b;
  const double start = b.seconds();
  b.learn(500e-6, true);
  CHECK(b.seconds() >= 750e-6);
  for (int i = 0; i < 20; ++i) b.learn(1e-3, true);
  CHECK(b.seconds() <= 2e-3);
  for (int i = 0; i < 40; ++i) b.learn(0.05, true);
  CHECK(b.seconds() > 0);
  CHECK(b.seconds() < start / 10);
  const double before = b.seconds();
  b.learn(1e-6, false);  // caught while spinning: nothing to learn
  CHECK(b.seconds() == before);
}

TEST_CASE("poll_until: done, deadline, cancel; a long wait sleeps", "[comm]") {
  int calls = 0;
  CHECK(ddp::poll_until([&] { return ++calls >= 3; }, 10, nullptr) == ddp::WaitResult::Done);
  CHECK(calls == 3);
  const double t0 = ddp::seconds_now(), cpu0 = thread_cpu_seconds();
  CHECK(ddp::poll_until([] { return false; }, 0.5, nullptr) == ddp::WaitResult::TimedOut);
  const double wall = ddp::seconds_now() - t0, cpu = thread_cpu_seconds() - cpu0;
  INFO("timed out after " << wall << " s using " << cpu << " s of CPU");
  CHECK(wall >= 0.5);
  CHECK(cpu < 0.2);
  std::atomic<bool> cancel{true};
  CHECK(ddp::poll_until([] { return false; }, 60, &cancel) == ddp::WaitResult::Cancelled);
}

TEST_CASE("lane: collectives run one at a time in submission order, errors reach wait()",
          "[comm]") {
  ddp::Lane lane;
  std::vector<int> order;
  std::atomic<int> running{0};
  int overlaps = 0;
  std::vector<std::shared_ptr<ddp::Work>> work;
  for (int i = 0; i < 200; ++i) {
    work.push_back(lane.submit("task " + std::to_string(i), [&, i] {
      if (running.fetch_add(1) != 0) ++overlaps;
      order.push_back(i);
      running.fetch_sub(1);
      if (i == 7) DDP_THROW("task 7 failed");
    }, nullptr, /*any_thread=*/i % 3 != 0));
  }
  for (int i = 199; i >= 0; --i) {  // waiting for the last first: the waiter drives the queue
    if (i == 7) {
      CHECK_THROWS_WITH(work[7]->wait(), Catch::Contains("task 7 failed"));
    } else {
      work[static_cast<size_t>(i)]->wait();
    }
  }
  CHECK(overlaps == 0);
  REQUIRE(order.size() == 200);
  for (int i = 0; i < 200; ++i) CHECK(order[static_cast<size_t>(i)] == i);
}

TEST_CASE("lane: a collective that never ends times out, names itself, and breaks the lane",
          "[comm]") {
  auto lane = std::make_unique<ddp::Lane>();
  lane->set_timeout(0.3);
  // Stands for a blocking MPI call a peer never joins: only the lane's thread may run it.
  auto release = std::make_shared<std::atomic<bool>>(false);
  auto stuck = lane->submit("allreduce of 5 floats", [release] {
    while (!*release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }, nullptr, /*any_thread=*/false);
  auto behind = lane->submit("barrier", [] {});
  CHECK_THROWS_WITH(behind->wait(),
                    Catch::Contains("barrier did not complete within 0.3 s (distributed.timeout_s)"));
  CHECK(lane->broken());
  CHECK(ddp::collective_timed_out());  // main() then exits kExitPeerLost (76), not 1
  CHECK_THROWS_WITH(lane->submit("broadcast of 4 bytes from rank 0", [] {}),
                    Catch::Contains("refused: an earlier collective timed out"));
  // Once the stuck call returns, stopping the broken lane joins its thread (had it stayed stuck,
  // stop_broken() would detach it after a second and the lane would be leaked).
  *release = true;
  CHECK_FALSE(lane->stop_broken());
  lane.reset();
}

TEST_CASE("lane: a polled wait inside a collective ends at the deadline with its name",
          "[comm]") {
  ddp::Lane lane;
  lane.set_timeout(0.3);
  auto w = lane.submit("allreduce of 3 double(s)",
                       [&] { lane.wait_until([] { return false; }); });
  CHECK_THROWS_WITH(w->wait(), Catch::Contains("allreduce of 3 double(s) did not complete within "
                                               "0.3 s"));
  CHECK(lane.broken());
  CHECK_FALSE(lane.stop_broken());  // nothing is stuck: the thread ends and is joined
}

TEST_CASE("lane: on a core shared with the training thread, the lane's thread spins only while "
          "the training thread waits", "[comm]") {
  ddp::Lane lane(/*spin=*/false);  // as for a rank bound to one core: no spare core
  CHECK(lane.may_spin_here());     // the training thread itself has nothing else to run
  bool while_computing = true, while_waiting = false;
  auto probe = lane.submit("allreduce of 1 floats", [&] {
    while_computing = lane.may_spin_here();
    // Until the submitting thread sleeps in wait() (a generous bound: it starts in 50 ms).
    const double start = ddp::seconds_now();
    while (!lane.may_spin_here() && ddp::seconds_now() - start < 30)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    while_waiting = lane.may_spin_here();
  }, nullptr, /*any_thread=*/false);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // "backward"
  probe->wait();
  CHECK_FALSE(while_computing);
  CHECK(while_waiting);
}
