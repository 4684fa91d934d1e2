// What a GPU of each architecture the build targets lets one kernel launch use, the kernels'
// real resource usage as ptxas reported it when the build compiled them, and the check a
// launch must pass on every architecture. The emulation applies the check to every launch of a
// kernel the report knows (cuda_emu_launch.cpp), so a launch a device would refuse ("too many
// resources requested", "invalid configuration") fails a test on a machine without one.
#pragma once

#include <cstddef>
#include <istream>
#include <map>
#include <string>
#include <vector>

namespace ddp_emu {

/// Per-block and per-multiprocessor limits of one compute capability (CUDA C++ Programming
/// Guide, "Technical Specifications per Compute Capability").
struct ArchLimits {
  int sm = 0;  ///< 75 for sm_75
  unsigned max_threads_per_block = 1024;
  unsigned max_block[3] = {1024, 1024, 64};
  unsigned max_grid[3] = {0x7fffffffu, 65535, 65535};
  unsigned regs_per_block = 65536;  ///< 32-bit registers one block may hold
  unsigned regs_per_sm = 65536;
  unsigned max_regs_per_thread = 255;
  unsigned reg_alloc_unit = 256;  ///< registers are allocated per warp in these units
  size_t static_smem_per_block = 48 * 1024;
  size_t optin_smem_per_block = 0;  ///< dynamic + static with cudaFuncAttributeMax...
  size_t smem_per_sm = 0;
  size_t reserved_smem_per_block = 0;  ///< what the system keeps per resident block
  unsigned max_threads_per_sm = 0;
  unsigned max_blocks_per_sm = 0;
};

/// The architectures whose limits the emulation knows: sm_75, 80, 86, 89, 90 (what the root
/// CMakeLists.txt compiles machine code for unless CMAKE_CUDA_ARCHITECTURES says otherwise).
const std::vector<ArchLimits>& target_archs();
/// The limits of sm_`sm`, or nullptr when it is not a target.
const ArchLimits* find_arch(int sm);

/// One kernel's usage on one architecture, from ptxas.
struct KernelUsage {
  int sm = 0;
  unsigned registers = 0;
  size_t static_smem = 0;  ///< bytes of __shared__ arrays
  size_t stack = 0;        ///< bytes of stack frame per thread
  size_t spill = 0;        ///< bytes of spill stores per thread
  size_t spill_loads = 0;  ///< bytes of spill loads per thread
};

/// Usage per architecture, by mangled kernel name.
using UsageTable = std::map<std::string, std::vector<KernelUsage>>;

/// Adds what a ptxas report (`nvcc --resource-usage` output) says to `table`: for every
/// "Compiling entry function 'NAME' for 'sm_NN'" the "Used R registers, ... S bytes smem" and
/// stack lines that follow. Returns the number of entries read.
size_t parse_ptxas_report(std::istream& in, UsageTable& table);

/// Reads every *.resources file under `dir` (recursively) into a table.
UsageTable load_usage_reports(const std::string& dir);

/// One line per kernel and architecture whose registers spill to local memory, naming the
/// kernel (demangled), the architecture and the bytes; "" when none does. A stack frame
/// without spills (a local array) is not one.
std::string spill_report(const UsageTable& table);

/// "" when one block of `threads` threads (with `dynamic_smem` bytes of dynamic shared
/// memory, opted in with cudaFuncAttributeMaxDynamicSharedMemorySize when `smem_opt_in`) of a
/// kernel with `usage` can be launched on `arch`; otherwise the reason a device gives none.
std::string launch_refusal(const ArchLimits& arch, const KernelUsage& usage, unsigned threads,
                           size_t dynamic_smem = 0, bool smem_opt_in = false);

/// Registers one block holds: per warp, rounded up to the allocation unit.
unsigned block_registers(const ArchLimits& arch, const KernelUsage& usage, unsigned threads);

/// How many blocks of the kernel one multiprocessor holds at once (0: not even one).
unsigned resident_blocks(const ArchLimits& arch, const KernelUsage& usage, unsigned threads,
                         size_t dynamic_smem = 0);

}  // namespace ddp_emu
