// ddp_bench_allreduce: MPI_Allreduce (float sum, in place, the trainer's call across nodes) over
// a range of message sizes; rank 0 prints the median time per size, the algorithm bandwidth
// (bytes / time) and the bus bandwidth (algbw · 2(n-1)/n, the nccl-tests convention). Its
// table is what docs/scaling.md fits the α-β model of a link to.
//   mpirun -n N ddp_bench_allreduce [--min-bytes B] [--max-bytes B] [--reps R]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

struct Options {
  long min_bytes = 4096;
  long max_bytes = 16L << 20;
  int reps = 20;
};

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return false;
    if (a == "--min-bytes") {
      o.min_bytes = std::atol(argv[++i]);
    } else if (a == "--max-bytes") {
      o.max_bytes = std::atol(argv[++i]);
    } else if (a == "--reps") {
      o.reps = std::atoi(argv[++i]);
    } else {
      return false;
    }
  }
  return o.min_bytes >= 4 && o.max_bytes >= o.min_bytes && o.reps >= 1;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  Options o;
  if (!parse(argc, argv, o)) {
    if (rank == 0)
      std::fprintf(stderr,
                   "usage: ddp_bench_allreduce [--min-bytes B] [--max-bytes B] [--reps R]\n");
    MPI_Finalize();
    return 2;
  }
  if (rank == 0) {
    std::printf("MPI_Allreduce (float sum, in place), %d ranks, median of %d\n\n", world, o.reps);
    std::printf("| bytes | median us | algbw GB/s | busbw GB/s |\n|---:|---:|---:|---:|\n");
  }
  for (long bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
    const int count = static_cast<int>(bytes / 4);
    std::vector<float> data(static_cast<size_t>(count), 1.0f);
    std::vector<double> times;
    for (int r = -2; r < o.reps; ++r) {  // two untimed warm-ups
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, data.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double t = MPI_Wtime() - t0;
      // The slowest rank's time is the collective's time.
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (r >= 0) times.push_back(t);
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const double algbw = static_cast<double>(bytes) / median / 1e9;
    if (rank == 0)
      std::printf("| %ld | %.1f | %.3f | %.3f |\n", bytes, median * 1e6, algbw,
                  algbw * 2.0 * (world - 1) / world);
  }
  MPI_Finalize();
  return 0;
}
