// Launch checks and audits: a kernel's name, the launch's dimensions and, for the kernels ptxas
// reported on, every target architecture's limits (launch_limits.h); AuditLaunches; and
// run_launch, which runs a checked launch at once or queues it on its stream.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cuda_emu_internal.h"

namespace ddp_emu {
namespace {

constexpr unsigned kMaxBlockThreads = 1024;

}  // namespace

namespace detail {
namespace {

// The kernel's mangled name, or "" when the dynamic symbol table does not have it.
std::string kernel_symbol(void (*kernel_id)()) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(kernel_id), &info) && info.dli_sname) return info.dli_sname;
  return "";
}

std::string kernel_display_name(const std::string& symbol, void (*kernel_id)()) {
  if (!symbol.empty()) return demangle(symbol.c_str());
  char buf[32];
  std::snprintf(buf, sizeof buf, "at %p", reinterpret_cast<void*>(kernel_id));
  return buf;
}

// Throws KernelFault (recording the launch error) if a device would refuse the launch: its
// dimensions, and for a kernel with known usage the limits of every target architecture.
void check_launch(const std::string& symbol, const std::string& kernel_name, dim3 grid,
                  dim3 block) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  std::string bad;
  cudaError_t error = cudaErrorInvalidConfiguration;
  if (block.x == 0 || block.y == 0 || block.z == 0 || threads > kMaxBlockThreads) {
    bad = "a block has " + std::to_string(threads) + " threads (1 to 1024 allowed)";
  } else if (block.x > 1024 || block.y > 1024 || block.z > 64) {
    bad = "block dimensions exceed (1024,1024,64)";
  } else if (grid.x == 0 || grid.y == 0 || grid.z == 0) {
    bad = "the grid is empty";
  } else if (grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
    bad = "grid dimensions exceed (2147483647,65535,65535)";
  } else if (!symbol.empty()) {
    const UsageTable& usage = kernel_usage();
    const auto it = usage.find(symbol);
    if (it != usage.end()) {
      for (const KernelUsage& u : it->second) {
        const ArchLimits* arch = find_arch(u.sm);
        if (arch == nullptr) continue;
        bad = launch_refusal(*arch, u, static_cast<unsigned>(threads));
        if (!bad.empty()) {
          if (block_registers(*arch, u, static_cast<unsigned>(threads)) > arch->regs_per_block)
            error = cudaErrorLaunchOutOfResources;
          break;
        }
      }
    }
  }
  if (bad.empty()) return;
  record(error);
  throw KernelFault("kernel " + kernel_name + ": " +
                    (error == cudaErrorLaunchOutOfResources ? "launch out of resources"
                                                            : "invalid launch configuration") +
                    ", grid " + triple(grid.x, grid.y, grid.z) + " block " +
                    triple(block.x, block.y, block.z) + ": " + bad);
}

// ----- kernel usage and launch audits ------------------------------------------------------------

struct UsageState {
  std::mutex mu;
  bool loaded = false;
  bool from_reports = false;
  UsageTable table;
};

UsageState& usage_state() {
  static UsageState* state = new UsageState;  // never destroyed: launches may outlive main
  return *state;
}

struct AuditState {
  std::mutex mu;
  bool active = false;
  std::vector<AuditedLaunch> launches;
};

AuditState& audit_state() {
  static AuditState* state = new AuditState;
  return *state;
}

// Records the launch and returns true when an AuditLaunches scope is open (it then never runs).
bool audit_launch(const std::string& symbol, const std::string& kernel_name, dim3 grid,
                  dim3 block) {
  AuditState& a = audit_state();
  std::lock_guard<std::mutex> lk(a.mu);
  if (!a.active) return false;
  a.launches.push_back(AuditedLaunch{symbol, kernel_name, grid, block});
  return true;
}

// Why a stream refused a launch, for the KernelFault message.
std::string stream_refusal(cudaError_t e) {
  switch (e) {
    case cudaErrorInvalidResourceHandle:
      return "launched on a stream that does not exist";
    case cudaErrorStreamCaptureImplicit:
      return "launched on the legacy stream while a blocking stream captures "
             "(cudaErrorStreamCaptureImplicit)";
    default:
      return "launched on a stream whose capture was invalidated by a prohibited call "
             "(cudaErrorStreamCaptureInvalidated)";
  }
}

}  // namespace

std::function<void()> launch_op(std::shared_ptr<const LaunchArgs> args, std::string name, dim3 grid,
                                dim3 block) {
  return [args = std::move(args), name = std::move(name), grid, block] {
    try {
      execute_launch(*args, name, grid, block);
    } catch (const std::exception& e) {
      async_fault(cudaErrorLaunchFailure, e.what());
    }
  };
}

void run_launch(void (*kernel_id)(), const char* name, dim3 grid, dim3 block, cudaStream_t stream,
                std::unique_ptr<const LaunchArgs> args) {
  count_kernel_launch();
  if (g_ctx) {
    throw KernelFault(where(*g_ctx->launch) +
                      ": launched a kernel (dynamic parallelism is not emulated)");
  }
  const std::string symbol = kernel_symbol(kernel_id);
  const std::string kernel_name = name ? std::string(name) : kernel_display_name(symbol, kernel_id);
  check_launch(symbol, kernel_name, grid, block);
  if (audit_launch(symbol, kernel_name, grid, block)) return;
  {
    Registry& r = registry();
    std::unique_lock<std::mutex> lk(r.mu);
    cudaError_t refused = cudaSuccess;
    if (!stream_valid_locked(r, stream)) {
      refused = cudaErrorInvalidResourceHandle;
    } else if (stream == nullptr) {
      refused = legacy_stream_use_locked(r);
    } else if (stream->capture) {
      // Captured: the arguments as they are now, for every launch of the graph.
      refused = capture_locked(stream, "kernel " + kernel_name,
                               launch_op(std::move(args), kernel_name, grid, block));
      if (refused == cudaSuccess) return;
    } else if (deferred()) {
      enqueue_locked(stream, launch_op(std::move(args), kernel_name, grid, block));
      return;
    }
    if (refused != cudaSuccess) {
      lk.unlock();
      record(refused);
      throw KernelFault("kernel " + kernel_name + ": " + stream_refusal(refused));
    }
  }
  before_legacy_op();
  execute_launch(*args, kernel_name, grid, block);
}

}  // namespace detail

const UsageTable& kernel_usage() {
  detail::UsageState& u = detail::usage_state();
  std::lock_guard<std::mutex> lk(u.mu);
  if (!u.loaded) {
    u.loaded = true;
    const char* dir = std::getenv("DDP_EMU_KERNEL_RESOURCES");
    if (dir != nullptr && *dir != '\0') {
      u.table = load_usage_reports(dir);
      u.from_reports = !u.table.empty();
    }
  }
  return u.table;
}

bool have_kernel_usage() {
  kernel_usage();
  detail::UsageState& u = detail::usage_state();
  std::lock_guard<std::mutex> lk(u.mu);
  return u.from_reports;
}

void set_kernel_usage(UsageTable table) {
  detail::UsageState& u = detail::usage_state();
  std::lock_guard<std::mutex> lk(u.mu);
  u.table = std::move(table);
  u.loaded = true;
  u.from_reports = false;
}

AuditLaunches::AuditLaunches() {
  detail::AuditState& a = detail::audit_state();
  std::lock_guard<std::mutex> lk(a.mu);
  if (a.active) throw std::logic_error("AuditLaunches scopes do not nest");
  a.active = true;
  a.launches.clear();
}

AuditLaunches::~AuditLaunches() {
  detail::AuditState& a = detail::audit_state();
  std::lock_guard<std::mutex> lk(a.mu);
  a.active = false;
}

std::vector<AuditedLaunch> AuditLaunches::launches() const {
  detail::AuditState& a = detail::audit_state();
  std::lock_guard<std::mutex> lk(a.mu);
  return a.launches;
}

}  // namespace ddp_emu
