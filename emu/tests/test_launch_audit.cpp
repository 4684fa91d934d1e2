// The launch audit: every kernel and launch configuration the CUDA backend can choose, at the
// largest shapes it accepts, checked against the limits of every architecture the build
// targets. The launch code runs inside an AuditLaunches scope, where the emulation checks each
// launch as a device would (grid and block dimensions; registers and shared memory from
// ptxas's report of the real build when it has one) without running it. Also: every kernel the
// report lists is covered here, the report reader reads what ptxas writes, and the check
// refuses what a device refuses. The only translation unit besides the backend that includes
// the kernel headers, so it is a program of its own (ddp_launch_audit_tests).
#include <dlfcn.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_emu.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/float16_casts.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/gemm16.cuh"
#include "kernels/cuda/powersgd_kernels.h"
#include "kernels/cuda/reductions.cuh"

namespace {

using ddp_emu::ArchLimits;
using ddp_emu::AuditedLaunch;
using ddp_emu::KernelUsage;

// The backend's shape limit (cuda_backend.cu: as_int) and the most multiprocessors a target
// device has (H200: 132); grids sized by SM count are audited at that count.
constexpr int kMaxDim = INT_MAX;
constexpr int kMaxSms = 132;
// The architectures the build compiles machine code for (CMAKE_CUDA_ARCHITECTURES, from
// emu/CMakeLists.txt): each must have a ptxas report for every kernel. None without CUDA.
#if defined(DDP_CUDA_TARGET_SMS)
const std::set<int> kTargetSms{DDP_CUDA_TARGET_SMS};
#else
const std::set<int> kTargetSms;
#endif

// Drives every launcher of the kernel headers through each choice it can make.
void launch_every_gemm() {
  using ddp::cuda::GemmArgs;
  const struct { bool a_kc, b_kc; } layouts[] = {{true, true}, {true, false}, {false, false}};
  // The largest accepted extent in each dimension in turn (the others small, as any product
  // that fits in memory has them), and all three small.
  const struct {
    int m, n, k;
  } shapes[] = {{kMaxDim, 16, 16}, {16, kMaxDim, 16}, {16, 16, kMaxDim}, {100, 100, 100}};
  for (const auto& layout : layouts) {
    for (const auto& shape : shapes) {
      for (int tile = 0; tile < 3; ++tile) {
        for (int splits : {1, 16}) {
          for (bool vec : {false, true}) {
            GemmArgs p;
            p.m = shape.m;
            p.n = shape.n;
            p.k = shape.k;
            ddp::GemmPlan plan;
            plan.tile = tile;
            plan.splits = splits;
            plan.vectorized = vec;
            ddp::cuda::launch_gemm(p, plan, layout.a_kc, layout.b_kc, nullptr, nullptr);
          }
        }
      }
    }
  }
}

// The mixed-precision GEMM: both formats, the three layouts, 16-byte loads or not, at the
// largest extents; and its bias gradient's column sums.
void launch_every_gemm16() {
  using ddp::cuda::Float16Type;
  const struct { bool a_kc, b_kc; } layouts[] = {{true, true}, {true, false}, {false, false}};
  const struct {
    int m, n, k;
  } shapes[] = {{kMaxDim, 16, 16}, {16, kMaxDim, 16}, {16, 16, kMaxDim}, {100, 100, 100}};
  for (Float16Type type : {Float16Type::Bf16, Float16Type::Fp16}) {
    for (const auto& layout : layouts) {
      for (const auto& shape : shapes) {
        for (bool vec : {false, true}) {
          ddp::cuda::Gemm16Args p;
          p.m = shape.m;
          p.n = shape.n;
          p.k = shape.k;
          ddp::cuda::launch_gemm16(type, p, layout.a_kc, layout.b_kc, vec, nullptr);
        }
      }
    }
    ddp::cuda::launch_column_sums16(type, nullptr, kMaxDim, kMaxDim, false, nullptr, nullptr);
  }
}

void launch_every_reduction() {
  // Column sums in one pass, and over the most row chunks (grid.y) with the finishing pass.
  ddp::cuda::launch_column_sums(nullptr, kMaxDim, kMaxDim, false, nullptr, nullptr, nullptr);
  ddp::cuda::launch_column_sums(nullptr, 1, 1, true, nullptr, nullptr, nullptr);
  ddp::cuda::launch_column_sums(nullptr, kMaxDim, 1, true, nullptr, nullptr, nullptr);
  ddp::cuda::launch_column_sums(nullptr, kMaxDim, 159 * 32, false, nullptr, nullptr, nullptr);
  // Each row kernel the class count selects: values per lane 1, 2, 4, 8, 16, 32, and more;
  // the totals over the most first-pass blocks with the finishing block, and in one block.
  for (int classes : {1, 33, 65, 129, 257, 513, 1025, kMaxDim}) {
    ddp::cuda::launch_softmax_xent(nullptr, nullptr, kMaxDim, classes, 1.0f, nullptr,
                                   ddp::cuda::XentRowOut{nullptr, nullptr, nullptr}, false, nullptr,
                                   nullptr);
  }
  ddp::cuda::launch_softmax_xent(nullptr, nullptr, 1024, 10, 1.0f, nullptr,
                                 ddp::cuda::XentRowOut{nullptr, nullptr, nullptr}, true, nullptr,
                                 nullptr);
  // The norm's first pass at its capped grid and at one block (an empty tensor too), with and
  // without the clip factor; its grid does not depend on the SM count.
  for (int64_t n : {int64_t{kMaxDim} * 64, int64_t{0}}) {
    for (bool clip : {false, true}) {
      ddp::cuda::launch_l2_norm(nullptr, n, clip, nullptr, clip, 1.0f, nullptr, nullptr);
    }
  }
}

template <typename Op>
void launch_both_ways(const Op& op) {
  for (bool vec : {false, true}) {
    ddp::cuda::launch_elementwise(op, int64_t{kMaxDim} * 64, vec, kMaxSms, nullptr);
  }
}

void launch_every_elementwise() {
  launch_both_ways(ddp::cuda::ReluForwardOp{});
  launch_both_ways(ddp::cuda::ReluBackwardOp{});
  launch_both_ways(ddp::cuda::FillOp{});
  launch_both_ways(ddp::cuda::ScaleOp{});
  launch_both_ways(ddp::cuda::SgdOp{});
  launch_both_ways(ddp::cuda::AdamOp{});
  for (bool vec : {false, true}) {
    ddp::cuda::launch_scale_by_device(nullptr, nullptr, int64_t{kMaxDim} * 64, vec, kMaxSms,
                                      nullptr);
  }
  ddp::cuda::launch_count_nonfinite(nullptr, int64_t{kMaxDim} * 64, nullptr, kMaxSms, nullptr);
}

// Both 16-bit types, both directions, four at a time (aligned pointers: null) and one by one
// (pointers 4 bytes off alignment; nothing runs in an audit).
void launch_every_cast() {
  using ddp::cuda::Float16Type;
  const int64_t n = int64_t{kMaxDim} * 64;
  for (Float16Type type : {Float16Type::Bf16, Float16Type::Fp16}) {
    for (uintptr_t offset : {uintptr_t{0}, uintptr_t{4}}) {
      auto* floats = reinterpret_cast<float*>(offset);
      auto* halves = reinterpret_cast<uint16_t*>(offset);
      ddp::cuda::launch_cast_to_16bit(type, floats, n, halves, kMaxSms, nullptr);
      ddp::cuda::launch_cast_from_16bit(type, halves, n, floats, kMaxSms, nullptr);
    }
  }
}

// PowerSGD's kernels over the most values, rows, columns and matrices a bucket can have (the
// flags in real memory: the finiteness check clears them with a memset, which an audit runs).
void launch_every_powersgd() {
  using namespace ddp::cuda;
  const int64_t n = int64_t{kMaxDim} * 64;
  PowerSgdFlags* flags = nullptr;
  REQUIRE(cudaMalloc(&flags, sizeof(PowerSgdFlags)) == cudaSuccess);
  FactoredMatrices m;
  m.count = 65535;
  m.rows = kMaxDim;
  m.cols = kMaxDim;
  m.values = n;
  powersgd_add_error(nullptr, nullptr, n, flags, kMaxSms, nullptr);
  powersgd_start_q(nullptr, n, 1, true, flags, nullptr);
  for (bool q_side : {false, true}) powersgd_orthogonalize(nullptr, m, q_side, nullptr);
  powersgd_compute_p(nullptr, nullptr, nullptr, m, nullptr);
  powersgd_compute_q(nullptr, nullptr, nullptr, m, nullptr);
  powersgd_decompress(nullptr, nullptr, nullptr, m, kMaxSms, nullptr);
  powersgd_check_finite(nullptr, n, flags, kMaxSms, nullptr);
  powersgd_finish(nullptr, nullptr, n, 0.5f, true, true, flags, kMaxSms, nullptr);
  REQUIRE(cudaFree(flags) == cudaSuccess);
}

std::vector<AuditedLaunch> audit_everything() {
  ddp_emu::AuditLaunches audit;
  launch_every_gemm();
  launch_every_gemm16();
  launch_every_reduction();
  launch_every_elementwise();
  launch_every_cast();
  launch_every_powersgd();
  return audit.launches();
}

// A table of what the audit saw: per kernel, its block, the largest grid, and per target
// architecture registers, shared memory and resident blocks per multiprocessor.
std::string usage_table(const std::vector<AuditedLaunch>& launches) {
  struct Row {
    std::string name;
    unsigned threads = 0;
    dim3 grid{1, 1, 1};
  };
  std::map<std::string, Row> rows;
  for (const AuditedLaunch& l : launches) {
    Row& r = rows[l.symbol.empty() ? l.name : l.symbol];
    r.name = l.name;
    r.threads = l.block.x * l.block.y * l.block.z;
    r.grid.x = std::max(r.grid.x, l.grid.x);
    r.grid.y = std::max(r.grid.y, l.grid.y);
    r.grid.z = std::max(r.grid.z, l.grid.z);
  }
  std::ostringstream os;
  const ddp_emu::UsageTable& usage = ddp_emu::kernel_usage();
  for (const auto& [symbol, r] : rows) {
    os << r.name << ": " << r.threads << " threads, largest grid (" << r.grid.x << "," << r.grid.y
       << "," << r.grid.z << ")";
    const auto it = usage.find(symbol);
    if (it != usage.end()) {
      for (const KernelUsage& u : it->second) {
        const ArchLimits* arch = ddp_emu::find_arch(u.sm);
        os << "\n    sm_" << u.sm << ": " << u.registers << " registers, " << u.static_smem
           << " B smem, " << u.stack << " B stack";
        if (arch != nullptr)
          os << ", " << ddp_emu::resident_blocks(*arch, u, r.threads) << " block(s) per SM";
      }
    }
    os << "\n";
  }
  return os.str();
}

// ---- GEMM plans at the shapes that matter ------------------------------------------------

// One GEMM the trainer runs: the Fashion-MNIST MLP (784-256-256-10) at batch 64 and 1024, each
// layer's three products, and the 4096^3 benchmark product.
struct PlannedGemm {
  std::string name;
  int m, n, k;
  bool a_kc, b_kc;  // the product's layout (cuda_backend.cu)
};

std::vector<PlannedGemm> fashion_mnist_gemms() {
  std::vector<PlannedGemm> gemms;
  const int layers[3][2] = {{784, 256}, {256, 256}, {256, 10}};
  for (int batch : {64, 1024}) {
    for (const auto& l : layers) {
      const std::string at =
          " b" + std::to_string(batch) + " " + std::to_string(l[0]) + "->" + std::to_string(l[1]);
      gemms.push_back({"forward" + at, batch, l[1], l[0], true, true});
      gemms.push_back({"backward_input" + at, batch, l[0], l[1], true, false});
      gemms.push_back({"backward_params" + at, l[1], l[0], batch, false, false});
    }
  }
  gemms.push_back({"forward 4096^3", 4096, 4096, 4096, true, true});
  return gemms;
}

// Blocks of the GEMM kernel's grid when `plan` runs `g` (audited, not run): what the launch
// code really makes of the plan, the split-K pass left out.
int64_t gemm_blocks(const PlannedGemm& g, const ddp::GemmPlan& plan) {
  ddp::cuda::GemmArgs p;
  p.m = g.m;
  p.n = g.n;
  p.k = g.k;
  ddp_emu::AuditLaunches audit;
  ddp::cuda::launch_gemm(p, plan, g.a_kc, g.b_kc, nullptr, nullptr);
  const std::vector<AuditedLaunch> launches = audit.launches();
  REQUIRE(!launches.empty());
  const dim3 grid = launches.front().grid;
  return int64_t{grid.x} * grid.y * grid.z;
}

// The most blocks any plan within plan_gemm's limits gives (every tile; 1 to 16 K slices of at
// least 256).
int64_t most_gemm_blocks(const PlannedGemm& g) {
  int64_t most = 0;
  for (int tile = 0; tile < 3; ++tile) {
    for (int splits = 1; splits <= 16 && (splits == 1 || splits <= g.k / 256); ++splits) {
      ddp::GemmPlan plan;
      plan.tile = tile;
      plan.splits = splits;
      most = std::max(most, gemm_blocks(g, plan));
    }
  }
  return most;
}

}  // namespace

TEST_CASE("launch audit: the GEMM plans fill 132 SMs wherever a plan within the limits can",
          "[emu][audit][gemm]") {
  // A wave: a block on every multiprocessor (blocks >= SMs). The launch bounds promise more
  // resident blocks only for the 128x128 tile (two), so counting a block per SM is the measure
  // every tile shares.
  std::ostringstream table;
  char line[160];
  std::snprintf(line, sizeof line, "%-30s %4s %4s %4s  %4s %6s %6s %5s", "product", "m", "n", "k",
                "tile", "slices", "blocks", "waves");
  table << line << "\n";
  for (const PlannedGemm& g : fashion_mnist_gemms()) {
    const ddp::GemmPlan plan = ddp::plan_gemm(g.m, g.n, g.k, kMaxSms, false);
    const int64_t blocks = gemm_blocks(g, plan);
    const int64_t most = most_gemm_blocks(g);
    const int edge = plan.tile == 0 ? 128 : plan.tile == 1 ? 64 : 32;
    std::snprintf(line, sizeof line, "%-30s %4d %4d %4d  %4d %6d %6lld %5.2f", g.name.c_str(), g.m,
                  g.n, g.k, edge, plan.splits, static_cast<long long>(blocks),
                  static_cast<double>(blocks) / kMaxSms);
    table << line << "\n";
    if (most < kMaxSms) {
      table << "    cannot fill: at most " << most
            << " blocks; m*n*k = " << int64_t{g.m} * g.n * g.k << "\n";
    }
    INFO(line << "; the most any plan gives: " << most);
    CHECK((blocks >= kMaxSms || most < kMaxSms));
    // A shape that cannot fill the device gets the most blocks a plan gives it.
    if (most < kMaxSms) CHECK(blocks == most);
  }
  WARN("GEMM plans on " << kMaxSms << " SMs:\n" << table.str());
}

TEST_CASE("launch audit: every launch configuration fits every target architecture",
          "[emu][audit]") {
  std::vector<AuditedLaunch> launches;
  try {
    launches = audit_everything();
  } catch (const ddp_emu::KernelFault& e) {
    FAIL("a device would refuse a launch the backend can make: " << e.what());
  }
  // 18 GEMM variants (3 tiles x 3 layouts x vectorized or not), the split-K pass, column sums
  // and their finishing pass, 7 cross-entropy row kernels and its totals' two passes, the
  // norm's two passes, 6 elementwise ops x 2, the scale by a device factor x 2,
  // count_nonfinite, the 16-bit casts (2 types x 2 directions x 2); the 16-bit GEMM (2 formats
  // x 3 layouts x 16-byte loads or not) and its column sums (2 formats); PowerSGD's 8.
  std::set<std::string> kernels;
  for (const AuditedLaunch& l : launches) kernels.insert(l.name);
  CHECK(kernels.size() == 77);
  // A target whose limits the emulation does not know would pass unchecked.
  for (int sm : kTargetSms) {
    INFO("target architecture sm_" << sm);
    CHECK(ddp_emu::find_arch(sm) != nullptr);
  }
  if (ddp_emu::have_kernel_usage()) {
    // Every kernel the build compiled is one the audit launched: a new kernel must be added
    // here, so its launches are checked too.
    std::set<std::string> launched;
    for (const AuditedLaunch& l : launches) launched.insert(l.symbol);
    for (const auto& [symbol, per_arch] : ddp_emu::kernel_usage()) {
      INFO("compiled kernel " << symbol);
      CHECK(launched.count(symbol) == 1);
      std::set<int> archs;
      for (const KernelUsage& u : per_arch) archs.insert(u.sm);
      CHECK(archs == kTargetSms);
    }
    // A spill is local-memory traffic in the inner loop: the kernels are sized to keep their
    // working set in registers on every target.
    const std::string spills = ddp_emu::spill_report(ddp_emu::kernel_usage());
    if (!spills.empty()) FAIL_CHECK("kernels spill registers to local memory:\n" << spills);
    WARN("kernels and their resources per architecture:\n" << usage_table(launches));
  } else {
    WARN(
        "no ptxas report (DDP_EMU_KERNEL_RESOURCES; a build without nvcc): launch dimensions "
        "audited, registers and shared memory not");
  }
}

TEST_CASE("launch check: the limits a device enforces", "[emu][audit]") {
  const ArchLimits& turing = *ddp_emu::find_arch(75);
  const ArchLimits& hopper = *ddp_emu::find_arch(90);
  KernelUsage u;
  u.sm = 75;
  u.registers = 64;
  // 1024 threads x 64 registers is exactly a block's 65536; one register more is 9 units of 256
  // per warp: 73728.
  CHECK(ddp_emu::launch_refusal(turing, u, 1024).empty());
  u.registers = 65;
  CHECK(ddp_emu::block_registers(turing, u, 1024) == 73728);
  CHECK_THAT(ddp_emu::launch_refusal(turing, u, 1024),
             Catch::Contains("too many resources requested for launch"));
  CHECK(ddp_emu::launch_refusal(turing, u, 512).empty());
  u.registers = 32;
  CHECK_THAT(ddp_emu::launch_refusal(turing, u, 1025), Catch::Contains("1025 threads"));
  // Shared memory: 48 KiB without the opt-in attribute everywhere; with it 64 KiB on Turing,
  // 227 KiB on Hopper.
  u.static_smem = 16 * 1024;
  CHECK(ddp_emu::launch_refusal(turing, u, 256, 32 * 1024).empty());
  CHECK_THAT(ddp_emu::launch_refusal(turing, u, 256, 40 * 1024),
             Catch::Contains("without cudaFuncAttributeMaxDynamicSharedMemorySize"));
  CHECK(ddp_emu::launch_refusal(turing, u, 256, 40 * 1024, true).empty());
  CHECK_THAT(ddp_emu::launch_refusal(turing, u, 256, 60 * 1024, true),
             Catch::Contains("even with the opt-in attribute"));
  CHECK(ddp_emu::launch_refusal(hopper, u, 256, 200 * 1024, true).empty());
  // Residency: 256 threads x 128 registers = 32768 per block: two per SM.
  u.registers = 128;
  u.static_smem = 16896;
  CHECK(ddp_emu::resident_blocks(turing, u, 256) == 2);
  CHECK(ddp_emu::resident_blocks(hopper, u, 256) == 2);
}

// A kernel for the refusal test: what it does does not matter, its usage table entry does.
// External linkage, so dladdr finds its name as it finds the real kernels'.
namespace audit_test {
__global__ void audit_probe_kernel(float* out) {
  if (out != nullptr) out[threadIdx.x] = 1.0f;
}
}  // namespace audit_test
using audit_test::audit_probe_kernel;

TEST_CASE("launch check: the emulation refuses a launch a device would refuse", "[emu][audit]") {
  // Grid dimensions, whatever the kernel: grid.y of 65536 is one too many.
  try {
    ddp_emu::AuditLaunches audit;
    ddp_emu::launch(audit_probe_kernel, dim3(1, 65536), dim3(32), nullptr, nullptr);
    FAIL("grid.y = 65536 was accepted");
  } catch (const ddp_emu::KernelFault& e) {
    CHECK_THAT(e.what(), Catch::Contains("grid dimensions exceed"));
  }
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  // Registers: the kernel as if ptxas had given it 72 registers on sm_86.
  Dl_info info{};
  REQUIRE(dladdr(reinterpret_cast<void*>(&audit_probe_kernel), &info) != 0);
  REQUIRE(info.dli_sname != nullptr);
  const ddp_emu::UsageTable saved = ddp_emu::kernel_usage();
  ddp_emu::UsageTable table = saved;
  KernelUsage u;
  u.sm = 86;
  u.registers = 72;
  table[info.dli_sname] = {u};
  ddp_emu::set_kernel_usage(table);
  try {
    ddp_emu::AuditLaunches audit;
    ddp_emu::launch(audit_probe_kernel, dim3(1), dim3(512), nullptr, nullptr);
    CHECK(audit.launches().size() == 1);
    ddp_emu::launch(audit_probe_kernel, dim3(1), dim3(1024), nullptr, nullptr);
    FAIL("1024 threads x 72 registers was accepted");
  } catch (const ddp_emu::KernelFault& e) {
    CHECK_THAT(e.what(), Catch::Contains("launch out of resources"));
    CHECK_THAT(e.what(), Catch::Contains("on sm_86"));
  }
  CHECK(cudaGetLastError() == cudaErrorLaunchOutOfResources);
  ddp_emu::set_kernel_usage(saved);
}

TEST_CASE("ptxas report: entries per kernel and architecture", "[emu][audit]") {
  std::istringstream report(
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function '_ZN3ddp4kernILi64EEEvv' for 'sm_75'\n"
      "ptxas info    : Function properties for _ZN3ddp4kernILi64EEEvv\n"
      "    16 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n"
      "ptxas info    : Used 10 registers, used 1 barriers, 256 bytes smem, 368 bytes cmem[0]\n"
      "ptxas info    : Compile time = 36.859 ms\n"
      "ptxas info    : Compiling entry function '_ZN3ddp4kernILi64EEEvv' for 'sm_90'\n"
      "ptxas info    : Function properties for _ZN3ddp4kernILi64EEEvv\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 12 registers, used 0 barriers\n");
  ddp_emu::UsageTable table;
  CHECK(ddp_emu::parse_ptxas_report(report, table) == 2);
  REQUIRE(table.size() == 1);
  const std::vector<KernelUsage>& u = table.begin()->second;
  REQUIRE(u.size() == 2);
  CHECK(u[0].sm == 75);
  CHECK(u[0].registers == 10);
  CHECK(u[0].static_smem == 256);
  CHECK(u[0].stack == 16);
  CHECK(u[0].spill == 8);
  CHECK(u[0].spill_loads == 8);
  CHECK(u[1].sm == 90);
  CHECK(u[1].registers == 12);
  CHECK(u[1].static_smem == 0);
}

TEST_CASE(
    "ptxas report: a spill is reported by kernel, architecture and bytes; a stack frame "
    "alone is not",
    "[emu][audit]") {
  std::istringstream report(
      "ptxas info    : Compiling entry function "
      "'_ZN3ddp4cuda11gemm_kernelILi128ELi128ELi8ELi8ELi8ELb0ELb0ELb1EEEvNS0_8GemmArgsE' for "
      "'sm_90'\n"
      "ptxas info    : Function properties for "
      "_ZN3ddp4cuda11gemm_kernelILi128ELi128ELi8ELi8ELi8ELb0ELb0ELb1EEEvNS0_8GemmArgsE\n"
      "    32 bytes stack frame, 48 bytes spill stores, 52 bytes spill loads\n"
      "ptxas info    : Used 128 registers, used 1 barriers, 16896 bytes smem, 400 bytes cmem[0]\n"
      "ptxas info    : Compiling entry function "
      "'_ZN3ddp4cuda18elementwise_kernelINS0_6AdamOpELb0EEEvT_l' for 'sm_90'\n"
      "ptxas info    : Function properties for "
      "_ZN3ddp4cuda18elementwise_kernelINS0_6AdamOpELb0EEEvT_l\n"
      "    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 22 registers, used 0 barriers, 8 bytes cumulative stack size\n");
  ddp_emu::UsageTable table;
  REQUIRE(ddp_emu::parse_ptxas_report(report, table) == 2);
  const std::string spills = ddp_emu::spill_report(table);
  CHECK(spills ==
        "void ddp::cuda::gemm_kernel<128, 128, 8, 8, 8, false, false, true>(ddp::cuda::GemmArgs) "
        "on sm_90: 48 bytes spill stores, 52 bytes spill loads (128 registers, 32 bytes stack "
        "frame)\n");
  table.erase(table.find(
      "_ZN3ddp4cuda11gemm_kernelILi128ELi128ELi8ELi8ELi8ELb0ELb0ELb1EEEvNS0_8GemmArgsE"));
  CHECK(ddp_emu::spill_report(table).empty());
}

TEST_CASE("every shared array of the kernels is poisoned between blocks in the emulation",
          "[emu][audit]") {
  // A __shared__ array without DDP_EMU_SHARED keeps the previous block's data in the
  // emulation, so a read of what the block never wrote would go unnoticed.
  static const std::regex shared(
      R"(^\s*(alignas\([0-9]+\)\s*)?__shared__\s+[\w:<> ]+?\s(\w+)\s*\[)");
  static const std::regex registered(R"(^\s*DDP_EMU_SHARED\((\w+)\);)");
  int arrays = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(
           std::string(DDP_SOURCE_DIR) + "/src/kernels/cuda")) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".cu" && ext != ".cuh") continue;
    std::ifstream in(entry.path());
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    for (size_t i = 0; i < lines.size(); ++i) {
      std::smatch m;
      if (!std::regex_search(lines[i], m, shared)) continue;
      ++arrays;
      const std::string name = m[2].str();
      INFO(entry.path().string() << ":" << i + 1 << ": " << lines[i]);
      std::smatch r;
      const bool next = i + 1 < lines.size() && std::regex_search(lines[i + 1], r, registered);
      CHECK(next);
      if (next) CHECK(r[1].str() == name);
    }
  }
  // The GEMM's two tiles, column sums, the cross-entropy totals' two passes (three each), the
  // norm's two passes, the 16-bit GEMM's three tiles, the 16-bit column sums' chunk sums,
  // PowerSGD's Gram-Schmidt sums.
  CHECK(arrays == 16);
}

TEST_CASE("a GEMM with more tiles than a grid holds is refused with a clear error",
          "[emu][audit]") {
  ddp::cuda::GemmArgs p;
  p.m = kMaxDim;  // 2^26 x 2^26 tiles of 32 x 32: far more than 2^31 - 1 blocks
  p.n = kMaxDim;
  p.k = 16;
  ddp::GemmPlan plan;
  plan.tile = 2;
  ddp_emu::AuditLaunches audit;
  CHECK_THROWS_WITH(ddp::cuda::launch_gemm(p, plan, true, true, nullptr, nullptr),
                    Catch::Contains("more blocks than a grid holds (2147483647)"));
  CHECK(audit.launches().empty());
}
