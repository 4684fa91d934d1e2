// ddp::Error and the rank it reports.
#include "ddp/check.h"

#include <mpi.h>

#include <atomic>

namespace ddp {

namespace {
std::atomic<int> g_error_rank{-1};

std::string format_error(const std::string& message, const char* file, int line) {
  std::ostringstream oss;
  int rank = g_error_rank.load();
  if (rank >= 0) oss << "rank " << rank << ": ";
  oss << message << " (" << file << ":" << line << ")";
  return oss.str();
}
}  // namespace

Error::Error(const std::string& message, const char* file, int line)
    : std::runtime_error(format_error(message, file, line)), message_(message) {}

void set_error_rank(int rank) { g_error_rank.store(rank); }
int error_rank() { return g_error_rank.load(); }

void throw_error(const std::string& message, const char* file, int line) {
  throw Error(message, file, line);
}

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, static_cast<size_t>(len));
}

}  // namespace ddp
