// The runtime-call counts (ddp_emu::runtime_calls): one counter per runtime function, a static
// in that function listed here when first reached, and the kernel and graph launches; how many
// host calls a training step makes, eager or as a graph, is a test's bound.
#include <atomic>
#include <mutex>
#include <vector>

#include "cuda_emu_internal.h"

namespace ddp_emu {
namespace {

struct Counters {
  std::mutex mu;
  std::vector<ApiCounter*> apis;  // function-local statics: they live until exit
  std::atomic<int64_t> kernel_launches{0};
  std::atomic<int64_t> graph_launches{0};
};

Counters& counters() {
  static Counters* c = new Counters;  // never destroyed: calls may come during exit
  return *c;
}

}  // namespace

namespace detail {

ApiCounter::ApiCounter(const char* api) : api_(api) {
  Counters& c = counters();
  std::lock_guard<std::mutex> lk(c.mu);
  c.apis.push_back(this);
}

void count_kernel_launch() { counters().kernel_launches.fetch_add(1, std::memory_order_relaxed); }

void count_graph_launch() { counters().graph_launches.fetch_add(1, std::memory_order_relaxed); }

}  // namespace detail

RuntimeCalls runtime_calls() {
  Counters& c = counters();
  RuntimeCalls out;
  std::lock_guard<std::mutex> lk(c.mu);
  for (const ApiCounter* a : c.apis) {
    if (a->calls() > 0) out.api[a->api()] += a->calls();
  }
  out.kernel_launches = c.kernel_launches.load(std::memory_order_relaxed);
  out.graph_launches = c.graph_launches.load(std::memory_order_relaxed);
  return out;
}

void reset_runtime_calls() {
  Counters& c = counters();
  std::lock_guard<std::mutex> lk(c.mu);
  for (ApiCounter* a : c.apis) a->reset();
  c.kernel_launches.store(0, std::memory_order_relaxed);
  c.graph_launches.store(0, std::memory_order_relaxed);
}

}  // namespace ddp_emu
