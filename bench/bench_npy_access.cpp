// ddp_bench_npy_access: how fast a memory-mapped .npy features file is read in the order
// training reads it, for each access pattern a loader could use. Rows are gathered in batches
// as the loader thread does (one rank's shard of the DistributedSampler's shuffled order, or
// sequential order for reference) and converted to float32. Patterns:
//   sequential       rows in file order, the kernel's default read-around
//   shuffled         the sampler's order, the kernel's default read-around (the device's
//                    read_ahead_kb per fault: 128 KiB by default)
//   shuffled+random  MADV_RANDOM: a fault reads its page only
//   shuffled+ahead   MADV_RANDOM, and each batch's rows are announced one batch ahead with
//                    MADV_WILLNEED (what data.format npy does), so their reads run in parallel
// Prints rows/s, major page faults and the bytes read from the disk per pattern, as a markdown
// table. Run it where the file does not fit in memory (bench/larger_than_memory_bench.sh puts
// it in a memory-limited cgroup); the page cache of the file is dropped before each pattern
// (--warm: kept, to measure the cost of the advice when the file is in memory). A pattern
// stops after --seconds with the rows it read by then.
//   ddp_bench_npy_access FILE.npy [--rows N] [--batch B] [--world W] [--seconds S] [--warm]
//                        [--patterns a,b,...]
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/features.h"
#include "data/npy.h"
#include "data/sampler.h"

namespace {

struct Options {
  std::string file;
  int64_t rows = 200000;  // rows read per pattern (a part of an epoch)
  int64_t batch = 64;
  int world = 2;        // the shard of rank 0 of this many ranks
  double seconds = 20;  // a pattern stops after this long, with the rows it read by then
  bool cold = true;     // the file's page cache dropped before each pattern
  std::vector<std::string> patterns = {"sequential", "shuffled", "shuffled+random",
                                       "shuffled+ahead"};
};

uint64_t disk_read_bytes() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value)
    if (key == "read_bytes:") return value;
  return 0;
}

long major_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_majflt;
}

// Evicts the file's clean pages from the page cache, so each pattern starts cold.
void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  DDP_CHECK(fd >= 0, "cannot open " << path);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// MADV_WILLNEED on the pages holding rows [i, i + 1) for each index.
void announce(const ddp::NpyFile& f, const int64_t* rows, int64_t n, size_t row_bytes) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto* base = static_cast<const char*>(f.data());
  for (int64_t r = 0; r < n; ++r) {
    const auto begin = reinterpret_cast<uintptr_t>(base + rows[r] * row_bytes) & ~(page - 1);
    const auto end = reinterpret_cast<uintptr_t>(base + (rows[r] + 1) * row_bytes);
    ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);
  }
}

struct Result {
  double rows_per_s = 0, disk_mib = 0;
  long faults = 0;
  int64_t rows = 0;
};

Result run(const Options& opt, const std::string& pattern) {
  if (opt.cold) drop_cache(opt.file);
  // This pattern's own mapping and advice.
  const bool random = pattern == "shuffled+random" || pattern == "shuffled+ahead";
  const ddp::NpyFile f =
      ddp::NpyFile::open(opt.file, random ? ddp::NpyAccess::Random : ddp::NpyAccess::Default);
  const int64_t features = f.row_elements();
  const size_t row_bytes = static_cast<size_t>(features) * ddp::npy_item_size(f.type());
  std::vector<int64_t> order;
  if (pattern == "sequential") {
    order.resize(static_cast<size_t>(f.rows() / opt.world));
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  } else {
    ddp::DistributedSampler sampler(f.rows(), opt.world, 0, true, 0, false);
    sampler.set_epoch(0);
    order = sampler.indices();
  }
  order.resize(std::min<size_t>(order.size(), static_cast<size_t>(opt.rows)));
  DDP_CHECK(f.type() == ddp::NpyType::U8 || f.type() == ddp::NpyType::F32,
            opt.file << ": features of uint8 or float32 expected");
  const auto type =
      f.type() == ddp::NpyType::U8 ? ddp::FeatureType::U8Over255 : ddp::FeatureType::F32;
  const ddp::FeatureStore store(type, f.data(), static_cast<size_t>(f.header().elements), nullptr);
  std::vector<float> batch(static_cast<size_t>(opt.batch * features));
  int64_t n = static_cast<int64_t>(order.size());
  const uint64_t read0 = disk_read_bytes();
  const long faults0 = major_faults();
  const auto t0 = std::chrono::steady_clock::now();
  if (pattern == "shuffled+ahead") announce(f, order.data(), std::min(opt.batch, n), row_bytes);
  for (int64_t b = 0; b < n; b += opt.batch) {
    const int64_t rows = std::min(opt.batch, n - b);
    if (pattern == "shuffled+ahead" && b + opt.batch < n)
      announce(f, order.data() + b + opt.batch, std::min(opt.batch, n - b - opt.batch), row_bytes);
    for (int64_t r = 0; r < rows; ++r) {
      store.to_float(static_cast<size_t>(order[b + r] * features), static_cast<size_t>(features),
                     batch.data() + r * features);
    }
    if (b % (64 * opt.batch) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >
            opt.seconds) {
      n = b + rows;
      break;
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Result out;
  out.rows = n;
  out.rows_per_s = static_cast<double>(n) / s;
  out.faults = major_faults() - faults0;
  out.disk_mib = static_cast<double>(disk_read_bytes() - read0) / (1024.0 * 1024.0);
  return out;
}

Options parse(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      DDP_CHECK(i + 1 < argc, a << " needs a value");
      return argv[++i];
    };
    if (a == "--rows") {
      opt.rows = std::stoll(value());
    } else if (a == "--batch") {
      opt.batch = std::stoll(value());
    } else if (a == "--world") {
      opt.world = std::stoi(value());
    } else if (a == "--seconds") {
      opt.seconds = std::stod(value());
    } else if (a == "--warm") {
      opt.cold = false;
    } else if (a == "--patterns") {
      std::istringstream list(value());
      opt.patterns.clear();
      for (std::string p; std::getline(list, p, ',');) opt.patterns.push_back(p);
    } else if (opt.file.empty() && a.rfind("--", 0) != 0) {
      opt.file = a;
    } else {
      DDP_THROW("unknown argument " << a);
    }
  }
  DDP_CHECK(!opt.file.empty(),
            "usage: ddp_bench_npy_access FILE.npy [--rows N] [--batch B] "
            "[--world W] [--seconds S] [--warm] [--patterns "
            "sequential,shuffled,...]");
  DDP_CHECK(opt.rows > 0 && opt.batch > 0 && opt.world > 0, "--rows, --batch, --world must be > 0");
  for (const auto& p : opt.patterns) {
    DDP_CHECK(
        p == "sequential" || p == "shuffled" || p == "shuffled+random" || p == "shuffled+ahead",
        "unknown pattern " << p);
  }
  return opt;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opt = parse(argc, argv);
    std::cout << "| pattern | rows/s | major faults / 1000 rows | MiB read from disk / 1000 rows "
                 "|\n|---|---:|---:|---:|\n";
    for (const auto& p : opt.patterns) {
      const Result r = run(opt, p);
      const double per = 1000.0 / static_cast<double>(r.rows);
      char line[256];
      std::snprintf(line, sizeof line, "| %s | %.0f | %.1f | %.2f |\n", p.c_str(), r.rows_per_s,
                    static_cast<double>(r.faults) * per, r.disk_mib * per);
      std::cout << line << std::flush;
    }
  } catch (const std::exception& e) {
    std::cerr << "ddp_bench_npy_access: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
