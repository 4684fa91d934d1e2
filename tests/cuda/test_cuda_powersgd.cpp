// PowerSGD's device kernels (kernels/cuda/powersgd_kernels.h) against double-precision loops on
// ragged shapes: several matrices in one list (rows and columns not multiples of a warp or a
// block, one taller than a Gram-Schmidt block, one whose factors are as wide as it), so every
// kernel's search for its matrix and every grid-stride loop is crossed. Run under the
// emulation's adversarial thread orders too (ctest cuda_emu_serial), where a missing barrier in
// Gram-Schmidt shows.
#include <cmath>
#include <vector>

#include "cuda_test_support.h"
#include "kernels/cuda/powersgd_kernels.h"

namespace {

using ddp::DeviceArray;
using ddp::cuda::FactoredMatrices;
using ddp::cuda::FactoredMatrix;

struct Shape {
  int64_t rows, cols, rank;
};
// 70 x 33 rank 3; 5 x 130 rank 5 (full: its Q's later columns are rounding); 300 x 40 rank 4
// (300 rows: more than a block of 128 threads in Gram-Schmidt).
const Shape kShapes[] = {{70, 33, 3}, {5, 130, 5}, {300, 40, 4}};

// The matrices one after another in a bucket (with a gap of 3 floats before each), their P and
// Q one after another, and the running totals the kernels search by.
std::vector<FactoredMatrix> layout(int64_t& numel, int64_t& p_size, int64_t& q_size) {
  std::vector<FactoredMatrix> list;
  numel = p_size = q_size = 0;
  int64_t rows = 0, cols = 0, values = 0;
  for (const Shape& s : kShapes) {
    FactoredMatrix f;
    f.offset = numel + 3;
    f.rows = s.rows, f.cols = s.cols, f.rank = s.rank;
    f.p_at = p_size, f.q_at = q_size;
    f.first_row = rows, f.first_col = cols, f.first_value = values;
    numel = f.offset + s.rows * s.cols;
    p_size += s.rows * s.rank;
    q_size += s.cols * s.rank;
    rows += s.rows, cols += s.cols, values += s.rows * s.cols;
    list.push_back(f);
  }
  return list;
}

FactoredMatrices on_device(const std::vector<FactoredMatrix>& list,
                           DeviceArray<FactoredMatrix>& memory) {
  memory = DeviceArray<FactoredMatrix>(list.size());
  memory.upload(list.data(), list.size());
  FactoredMatrices m;
  m.list = memory.data();
  m.count = static_cast<int>(list.size());
  for (const FactoredMatrix& f : list)
    m.rows += f.rows, m.cols += f.cols, m.values += f.rows * f.cols;
  return m;
}

std::vector<float> download(const DeviceArray<float>& d) {
  std::vector<float> h(d.size());
  d.download(h.data(), h.size());
  return h;
}

// max |a - b| / max |b| over [at, at + n).
double gap(const std::vector<float>& a, const std::vector<double>& b, int64_t at, int64_t n) {
  double worst = 0.0, scale = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(a[at + i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? worst / scale : worst;
}

}  // namespace

TEST_CASE("cuda PowerSGD kernels: Q's start, Gram-Schmidt, P, Q and P Q^T against double loops",
          DDP_CUDA_TAGS "[powersgd]") {
  int64_t numel = 0, p_size = 0, q_size = 0;
  const std::vector<FactoredMatrix> list = layout(numel, p_size, q_size);
  DeviceArray<FactoredMatrix> list_memory;
  const FactoredMatrices m = on_device(list, list_memory);
  const std::vector<float> bucket = ddp_kernel_test::random_floats(numel, 11, -1.0f, 1.0f);
  DeviceArray<float> d_bucket(numel), d_p(p_size), d_q(q_size);
  d_bucket.upload(bucket.data(), bucket.size());
  DeviceArray<ddp::cuda::PowerSgdFlags> flags(1);
  const ddp::cuda::PowerSgdFlags none;
  flags.upload(&none, 1);
  const int sms = ddp::cuda_device_info(0).sm_count;

  // Q's start: the host's Rng stream, value for value.
  ddp::cuda::powersgd_start_q(d_q.data(), q_size, 5, false, flags.data(), nullptr);
  const std::vector<float> q0 = download(d_q);
  ddp::Rng rng(5);
  long draws_differ = 0;
  for (int64_t i = 0; i < q_size; ++i) draws_differ += q0[i] != static_cast<float>(rng.normal());
  CHECK(draws_differ == 0);

  ddp::cuda::powersgd_orthogonalize(d_q.data(), m, true, nullptr);
  ddp::cuda::powersgd_compute_p(d_bucket.data(), d_q.data(), d_p.data(), m, nullptr);
  const std::vector<float> q = download(d_q), p_raw = download(d_p);
  ddp::cuda::powersgd_orthogonalize(d_p.data(), m, false, nullptr);
  ddp::cuda::powersgd_compute_q(d_bucket.data(), d_p.data(), d_q.data(), m, nullptr);
  const std::vector<float> p = download(d_p), q_new = download(d_q);
  std::vector<float> result = bucket;
  DeviceArray<float> d_result(numel);
  d_result.upload(result.data(), result.size());
  ddp::cuda::powersgd_decompress(d_p.data(), d_q.data(), d_result.data(), m, sms, nullptr);
  result = download(d_result);

  for (const FactoredMatrix& f : list) {
    INFO(f.rows << " x " << f.cols << " at rank " << f.rank);
    // Each step from the kernel's own input (in double), so a gap is that step's alone.
    std::vector<double> qd(q0.begin() + f.q_at, q0.begin() + f.q_at + f.cols * f.rank);
    ddp_kernel_test::orthogonalize_columns(qd, f.cols, f.rank);
    CHECK(gap(q, qd, f.q_at, f.cols * f.rank) < 1e-6);
    std::vector<double> pd(f.rows * f.rank, 0.0);
    for (int64_t i = 0; i < f.rows; ++i)
      for (int64_t k = 0; k < f.rank; ++k)
        for (int64_t j = 0; j < f.cols; ++j)
          pd[i * f.rank + k] +=
              double{bucket[f.offset + i * f.cols + j]} * q[f.q_at + j * f.rank + k];
    CHECK(gap(p_raw, pd, f.p_at, f.rows * f.rank) < 1e-6);
    std::vector<double> po(p_raw.begin() + f.p_at, p_raw.begin() + f.p_at + f.rows * f.rank);
    ddp_kernel_test::orthogonalize_columns(po, f.rows, f.rank);
    CHECK(gap(p, po, f.p_at, f.rows * f.rank) < 1e-6);
    std::vector<double> qn(f.cols * f.rank, 0.0);
    for (int64_t j = 0; j < f.cols; ++j)
      for (int64_t k = 0; k < f.rank; ++k)
        for (int64_t i = 0; i < f.rows; ++i)
          qn[j * f.rank + k] +=
              double{bucket[f.offset + i * f.cols + j]} * p[f.p_at + i * f.rank + k];
    CHECK(gap(q_new, qn, f.q_at, f.cols * f.rank) < 1e-6);
    std::vector<double> md(f.rows * f.cols, 0.0);
    for (int64_t i = 0; i < f.rows; ++i)
      for (int64_t j = 0; j < f.cols; ++j)
        for (int64_t k = 0; k < f.rank; ++k)
          md[i * f.cols + j] += double{p[f.p_at + i * f.rank + k]} * q_new[f.q_at + j * f.rank + k];
    CHECK(gap(result, md, f.offset, f.rows * f.cols) < 1e-6);
    // The gaps between matrices are no matrix's: left as they were.
    for (int64_t i = f.offset - 3; i < f.offset; ++i) CHECK(result[i] == bucket[i]);
  }
}

TEST_CASE("cuda PowerSGD kernels: error feedback, the finiteness flag and the new error",
          DDP_CUDA_TAGS "[powersgd]") {
  const int64_t n = 1000;
  const int sms = ddp::cuda_device_info(0).sm_count;
  const std::vector<float> g = ddp_kernel_test::random_floats(n, 3, -1.0f, 1.0f);
  const std::vector<float> e = ddp_kernel_test::random_floats(n, 4, -0.1f, 0.1f);
  DeviceArray<float> d_g(n), d_e(n);
  DeviceArray<ddp::cuda::PowerSgdFlags> flags(1);
  const auto set_flags = [&](int has_error, int has_q) {
    ddp::cuda::PowerSgdFlags f;
    f.has_error = has_error, f.has_q = has_q;
    flags.upload(&f, 1);
  };
  const auto read_flags = [&] {
    ddp::cuda::PowerSgdFlags f;
    flags.download(&f, 1);
    return f;
  };
  // With an error: the share is g + e, in both arrays; without one, g alone.
  for (const int has : {1, 0}) {
    d_g.upload(g.data(), n);
    d_e.upload(e.data(), n);
    set_flags(has, 1);
    ddp::cuda::powersgd_add_error(d_g.data(), d_e.data(), n, flags.data(), sms, nullptr);
    const std::vector<float> share = download(d_g), kept = download(d_e);
    long wrong = 0;
    for (int64_t i = 0; i < n; ++i)
      wrong += share[i] != (has ? g[i] + e[i] : g[i]) || kept[i] != share[i];
    CHECK(wrong == 0);
  }
  // A finite result: error = share - result / world, the result averaged; the flags keep both.
  d_e.upload(e.data(), n);  // stands for the share
  d_g.upload(g.data(), n);  // stands for the result
  set_flags(0, 0);
  ddp::cuda::powersgd_check_finite(d_g.data(), n, flags.data(), sms, nullptr);
  ddp::cuda::powersgd_finish(d_g.data(), d_e.data(), n, 0.25f, true, true, flags.data(), sms,
                             nullptr);
  std::vector<float> error = download(d_e), averaged = download(d_g);
  long wrong = 0;
  for (int64_t i = 0; i < n; ++i)
    wrong += error[i] != e[i] - g[i] * 0.25f || averaged[i] != g[i] * 0.25f;
  CHECK(wrong == 0);
  CHECK(read_flags().nonfinite == 0);
  CHECK(read_flags().has_error == 1);
  CHECK(read_flags().has_q == 1);
  // One NaN anywhere: the error untouched, no state kept (the averaging still happens).
  std::vector<float> bad = g;
  bad[n - 1] = std::numeric_limits<float>::quiet_NaN();
  d_g.upload(bad.data(), n);
  d_e.upload(e.data(), n);
  ddp::cuda::powersgd_check_finite(d_g.data(), n, flags.data(), sms, nullptr);
  ddp::cuda::powersgd_finish(d_g.data(), d_e.data(), n, 0.25f, true, false, flags.data(), sms,
                             nullptr);
  CHECK(download(d_e) == e);
  CHECK(read_flags().nonfinite == 1);
  CHECK(read_flags().has_error == 0);
  CHECK(read_flags().has_q == 0);
  // And the start of Q then draws afresh, where with a Q kept it would not.
  DeviceArray<float> d_q(7);
  const std::vector<float> kept_q(7, 0.5f);
  d_q.upload(kept_q.data(), 7);
  set_flags(1, 1);
  ddp::cuda::powersgd_start_q(d_q.data(), 7, 9, false, flags.data(), nullptr);
  CHECK(download(d_q) == kept_q);
  set_flags(1, 0);
  ddp::cuda::powersgd_start_q(d_q.data(), 7, 9, false, flags.data(), nullptr);
  CHECK(download(d_q) != kept_q);
}
