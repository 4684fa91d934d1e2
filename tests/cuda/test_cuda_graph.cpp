// A training step's kernels (two linear layers forward, softmax cross-entropy, the last
// layer's backward) captured into a CUDA graph on the backend's stream and replayed: a replay
// must write exactly the bytes eager execution wrote, on a device and in the emulation. Only
// the runtime's real names and signatures are used, so the same code compiles under nvcc.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_backend.h"

namespace {

using ddp_cuda_test::DeviceTensor;
using ddp_cuda_test::random_floats;
using ddp_cuda_test::random_labels;
using ddp_cuda_test::require_bitwise_equal;
using ddp_cuda_test::require_guards_intact;

constexpr int64_t kRows = 6, kIn = 20, kHidden = 16, kClasses = 10;

// The tensors of the step: inputs and parameters, then everything the step writes.
struct StepTensors {
  DeviceTensor x{random_floats(kRows * kIn, 9101), kRows, kIn};
  DeviceTensor w1{random_floats(kHidden * kIn, 9102, -0.5, 0.5), kHidden, kIn};
  DeviceTensor b1{random_floats(kHidden, 9103), 1, kHidden};
  DeviceTensor w2{random_floats(kClasses * kHidden, 9104, -0.5, 0.5), kClasses, kHidden};
  DeviceTensor b2{random_floats(kClasses, 9105), 1, kClasses};
  ddp::DeviceArray<int32_t> labels{static_cast<size_t>(kRows)};
  DeviceTensor h{kRows, kHidden}, logits{kRows, kClasses}, dlogits{kRows, kClasses};
  DeviceTensor dh{kRows, kHidden}, dw2{kClasses, kHidden}, db2{1, kClasses};

  StepTensors() {
    const std::vector<int32_t> l = random_labels(kRows, kClasses, 9106);
    labels.upload(l.data(), l.size());
  }
  std::vector<DeviceTensor*> outputs() { return {&h, &logits, &dlogits, &dh, &dw2, &db2}; }
};

const char* const kOutputNames[] = {"h", "logits", "dlogits", "dh", "dw2", "db2"};

// Queues the step on the backend's stream; the loss totals stay on the device (slot 0).
void queue_step(ddp::Backend& be, StepTensors& t) {
  be.linear_forward(t.x.view(), t.w1.view(), t.b1.view(), true, t.h.view());
  be.linear_forward(t.h.view(), t.w2.view(), t.b2.view(), false, t.logits.view());
  be.softmax_xent_deferred(t.logits.view(), t.labels.data(), 1.0f / kRows, &t.dlogits.view(), 0);
  be.linear_backward_input(t.dlogits.view(), t.w2.view(), &t.h.view(), t.dh.view());
  be.linear_backward_params(t.dlogits.view(), t.h.view(), false, t.dw2.view(), t.db2.view());
}

// NaN in every output, so a replay must write each one.
void poison_outputs(ddp::Backend& be, StepTensors& t) {
  for (DeviceTensor* d : t.outputs()) be.fill(d->view(), std::numeric_limits<float>::quiet_NaN());
  be.synchronize();
}

void require_outputs(StepTensors& t, const std::vector<std::vector<float>>& want,
                     const std::string& when) {
  const std::vector<DeviceTensor*> outs = t.outputs();
  for (size_t i = 0; i < outs.size(); ++i) {
    require_bitwise_equal(outs[i]->download(), want[i], when + ": " + kOutputNames[i]);
    require_guards_intact(*outs[i], when + ": " + kOutputNames[i]);
  }
}

}  // namespace

TEST_CASE("cuda graph: a captured forward, loss and backward replays eager execution bitwise",
          DDP_CUDA_TAGS) {
  auto backend = ddp::make_cuda_backend(0);
  auto& cuda = dynamic_cast<ddp::cuda::CudaBackend&>(*backend);
  StepTensors t;
  // Eager first: the backend's scratch grows to the step's size, so the capture allocates
  // nothing (cudaMalloc is prohibited while a stream captures).
  queue_step(*backend, t);
  backend->synchronize();
  (void)backend->take_xent_totals(0);
  std::vector<std::vector<float>> eager;
  for (DeviceTensor* d : t.outputs()) eager.push_back(d->download());

  poison_outputs(*backend, t);
  cudaStream_t stream = cuda.stream();
  DDP_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  queue_step(*backend, t);
  cudaGraph_t graph = nullptr;
  DDP_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  REQUIRE(graph != nullptr);
  // Captured, not run: the outputs still hold the poison.
  REQUIRE(std::isnan(t.h.download()[0]));
  cudaGraphExec_t exec = nullptr;
  DDP_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    poison_outputs(*backend, t);
    DDP_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream));
    require_outputs(t, eager, "replay " + std::to_string(replay));
  }
#if defined(DDP_CUDA_EMULATION)
  // What the graph saves the host: the eager step's runtime calls against the replay's two.
  ddp_emu::reset_runtime_calls();
  queue_step(*backend, t);
  const ddp_emu::RuntimeCalls eager_calls = ddp_emu::runtime_calls();
  backend->synchronize();
  ddp_emu::reset_runtime_calls();
  DDP_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  const ddp_emu::RuntimeCalls graph_calls = ddp_emu::runtime_calls();
  backend->synchronize();
  // Eager: every launch and its cudaGetLastError, the totals' copy and its event (7 kernels,
  // 16 calls at these shapes); the graph: one call.
  CHECK(eager_calls.kernel_launches >= 5);
  CHECK(eager_calls.of("cudaGetLastError") == eager_calls.kernel_launches);
  CHECK(eager_calls.of("cudaMemcpyAsync") == 1);
  CHECK(eager_calls.of("cudaEventRecord") == 1);
  CHECK(eager_calls.total() == 2 * eager_calls.kernel_launches + 2);
  CHECK(graph_calls.total() == 1);
  CHECK(graph_calls.graph_launches == 1);
#endif
  DDP_CUDA_CHECK(cudaGraphExecDestroy(exec));
  DDP_CUDA_CHECK(cudaGraphDestroy(graph));
}

TEST_CASE("cuda graph: Backend::launch_graph fills the deferred slot, and refuses a stale graph",
          DDP_CUDA_TAGS) {
  auto backend = ddp::make_cuda_backend(0);
  REQUIRE(backend->captures_graphs());
  StepTensors t;
  queue_step(*backend, t);  // eager: the scratch grows to the step's size
  const ddp::XentResult eager = backend->take_xent_totals(0);
  REQUIRE(eager.loss_sum > 0);

  backend->begin_graph();
  queue_step(*backend, t);
  std::unique_ptr<ddp::DeviceGraph> graph = backend->end_graph();
  REQUIRE(graph != nullptr);
  // Captured, not run: the slot holds nothing to take.
  CHECK(backend->take_xent_totals(0).loss_sum == 0.0);
  for (int replay = 0; replay < 2; ++replay) {
    REQUIRE(backend->launch_graph(*graph));
    const ddp::XentResult r = backend->take_xent_totals(0);
    CHECK(r.loss_sum == eager.loss_sum);
    CHECK(r.correct == eager.correct);
  }

  // The graph starts slot 0 over: with a batch still untaken there it does not launch.
  queue_step(*backend, t);
  CHECK_FALSE(backend->launch_graph(*graph));
  CHECK(backend->take_xent_totals(0).loss_sum == eager.loss_sum);
  REQUIRE(backend->launch_graph(*graph));
  CHECK(backend->take_xent_totals(0).loss_sum == eager.loss_sum);

  // A larger batch moves the loss's scratch memory: the graph is stale.
  DeviceTensor logits{random_floats(4 * kRows * kClasses, 9107), 4 * kRows, kClasses};
  ddp::DeviceArray<int32_t> labels{static_cast<size_t>(4 * kRows)};
  const std::vector<int32_t> l = random_labels(4 * kRows, kClasses, 9108);
  labels.upload(l.data(), l.size());
  (void)backend->softmax_xent(logits.view(), labels.data(), 1.0f, nullptr);
  CHECK_FALSE(backend->launch_graph(*graph));

  // Misuse: a second capture, a launch inside one, an end without one.
  backend->begin_graph();
  CHECK_THROWS_WITH(backend->begin_graph(), Catch::Contains("a capture is already open"));
  CHECK_THROWS_WITH(backend->launch_graph(*graph), Catch::Contains("a capture is open"));
  CHECK(backend->end_graph(/*discard=*/true) == nullptr);
  CHECK_THROWS_WITH(backend->end_graph(), Catch::Contains("no capture is open"));

  // A call that waits for the device inside a capture fails; the capture ends, discarded, and
  // the backend works on as before.
  backend->begin_graph();
  CHECK_THROWS(backend->l2_norm(t.h.view()));
  CHECK(backend->end_graph(/*discard=*/true) == nullptr);
  queue_step(*backend, t);
  CHECK(backend->take_xent_totals(0).loss_sum == eager.loss_sum);
}
