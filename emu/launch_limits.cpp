// The per-architecture limits, the ptxas report reader and the launch check of launch_limits.h.
#include "launch_limits.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>

namespace ddp_emu {

namespace {

ArchLimits arch(int sm, size_t optin_kib, size_t per_sm_kib, size_t reserved, unsigned threads,
                unsigned blocks) {
  ArchLimits a;
  a.sm = sm;
  a.optin_smem_per_block = optin_kib * 1024;
  a.smem_per_sm = per_sm_kib * 1024;
  a.reserved_smem_per_block = reserved;
  a.max_threads_per_sm = threads;
  a.max_blocks_per_sm = blocks;
  return a;
}

size_t ceil_to(size_t v, size_t unit) { return (v + unit - 1) / unit * unit; }

std::string demangle(const std::string& symbol) {
  int status = 0;
  const std::unique_ptr<char, void (*)(void*)> name(
      abi::__cxa_demangle(symbol.c_str(), nullptr, nullptr, &status), std::free);
  return status == 0 && name ? std::string(name.get()) : symbol;
}

}  // namespace

const std::vector<ArchLimits>& target_archs() {
  // Turing, Ampere (A100; consumer), Ada, Hopper. Opt-in and per-SM shared memory in KiB.
  static const std::vector<ArchLimits> archs = {
      arch(75, 64, 64, 0, 1024, 16),      arch(80, 163, 164, 1024, 2048, 32),
      arch(86, 99, 100, 1024, 1536, 16),  arch(89, 99, 100, 1024, 1536, 24),
      arch(90, 227, 228, 1024, 2048, 32),
  };
  return archs;
}

const ArchLimits* find_arch(int sm) {
  for (const ArchLimits& a : target_archs())
    if (a.sm == sm) return &a;
  return nullptr;
}

size_t parse_ptxas_report(std::istream& in, UsageTable& table) {
  static const std::regex entry(R"(Compiling entry function '([^']+)' for 'sm_([0-9]+)a?')");
  static const std::regex frame(
      R"(([0-9]+) bytes stack frame, ([0-9]+) bytes spill stores, ([0-9]+) bytes spill loads)");
  static const std::regex used(R"(Used ([0-9]+) registers)");
  static const std::regex smem(R"(([0-9]+) bytes smem)");
  size_t entries = 0;
  KernelUsage* current = nullptr;
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, entry)) {
      auto& per_arch = table[m[1].str()];
      const int sm = std::stoi(m[2].str());
      auto it = std::find_if(per_arch.begin(), per_arch.end(),
                             [&](const KernelUsage& u) { return u.sm == sm; });
      if (it == per_arch.end()) it = per_arch.insert(per_arch.end(), KernelUsage{});
      *it = KernelUsage{};
      it->sm = sm;
      current = &*it;
      ++entries;
    } else if (current != nullptr && std::regex_search(line, m, frame)) {
      current->stack = std::stoul(m[1].str());
      current->spill = std::stoul(m[2].str());
      current->spill_loads = std::stoul(m[3].str());
    } else if (current != nullptr && std::regex_search(line, m, used)) {
      current->registers = static_cast<unsigned>(std::stoul(m[1].str()));
      if (std::regex_search(line, m, smem)) current->static_smem = std::stoul(m[1].str());
      current = nullptr;  // the usage line ends the entry
    }
  }
  return entries;
}

UsageTable load_usage_reports(const std::string& dir) {
  UsageTable table;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file() && it->path().extension() == ".resources") {
      std::ifstream in(it->path());
      parse_ptxas_report(in, table);
    }
  }
  return table;
}

std::string spill_report(const UsageTable& table) {
  std::ostringstream os;
  for (const auto& [symbol, per_arch] : table) {
    for (const KernelUsage& u : per_arch) {
      if (u.spill == 0 && u.spill_loads == 0) continue;
      os << demangle(symbol) << " on sm_" << u.sm << ": " << u.spill << " bytes spill stores, "
         << u.spill_loads << " bytes spill loads (" << u.registers << " registers, " << u.stack
         << " bytes stack frame)\n";
    }
  }
  return os.str();
}

unsigned block_registers(const ArchLimits& arch, const KernelUsage& usage, unsigned threads) {
  const size_t warps = (threads + 31) / 32;
  const size_t per_warp = ceil_to(size_t{usage.registers} * 32, arch.reg_alloc_unit);
  return static_cast<unsigned>(warps * per_warp);
}

std::string launch_refusal(const ArchLimits& arch, const KernelUsage& usage, unsigned threads,
                           size_t dynamic_smem, bool smem_opt_in) {
  const std::string on = "on sm_" + std::to_string(arch.sm) + ": ";
  if (threads == 0 || threads > arch.max_threads_per_block) {
    return on + std::to_string(threads) + " threads per block (at most " +
           std::to_string(arch.max_threads_per_block) + ")";
  }
  if (usage.registers > arch.max_regs_per_thread) {
    return on + std::to_string(usage.registers) + " registers per thread (at most " +
           std::to_string(arch.max_regs_per_thread) + ")";
  }
  const unsigned regs = block_registers(arch, usage, threads);
  if (regs > arch.regs_per_block) {
    return on + std::to_string(threads) + " threads x " + std::to_string(usage.registers) +
           " registers need " + std::to_string(regs) +
           " registers (allocated per warp in units of " + std::to_string(arch.reg_alloc_unit) +
           "), a block may hold " + std::to_string(arch.regs_per_block) +
           " (too many resources requested for launch)";
  }
  if (usage.static_smem > arch.static_smem_per_block) {
    return on + std::to_string(usage.static_smem) + " bytes of static shared memory (at most " +
           std::to_string(arch.static_smem_per_block) + ")";
  }
  const size_t smem = usage.static_smem + dynamic_smem;
  const size_t limit = smem_opt_in ? arch.optin_smem_per_block : arch.static_smem_per_block;
  if (smem > limit) {
    return on + std::to_string(smem) + " bytes of shared memory per block, at most " +
           std::to_string(limit) +
           (smem_opt_in ? std::string(" even with the opt-in attribute")
                        : " without cudaFuncAttributeMaxDynamicSharedMemorySize (" +
                              std::to_string(arch.optin_smem_per_block) + " with it)");
  }
  return "";
}

unsigned resident_blocks(const ArchLimits& arch, const KernelUsage& usage, unsigned threads,
                         size_t dynamic_smem) {
  if (!launch_refusal(arch, usage, threads, dynamic_smem, true).empty()) return 0;
  const size_t warp_threads = ceil_to(threads, 32);
  size_t n = std::min<size_t>(arch.max_blocks_per_sm, arch.max_threads_per_sm / warp_threads);
  n = std::min<size_t>(n, arch.regs_per_sm / std::max(1u, block_registers(arch, usage, threads)));
  const size_t smem = usage.static_smem + dynamic_smem + arch.reserved_smem_per_block;
  if (smem > 0) n = std::min(n, arch.smem_per_sm / smem);
  return static_cast<unsigned>(n);
}

}  // namespace ddp_emu
