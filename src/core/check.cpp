// ddp::Error and the rank it reports.
#include "core/check.h"

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

}  // namespace ddp
