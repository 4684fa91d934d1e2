// Errors and check macros. Library code throws ddp::Error (message, file:line, rank); only
// main() decides to end the job. One macro family for every kind of check (MPI, CUDA later).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ddp {

/// The error every library failure becomes. what() reads "rank R: message (file:line)".
class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const char* file, int line);
  /// The message alone, without rank or source location (for tests and re-wrapping).
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

/// The MPI rank this process reports in errors; -1 before MPI is initialised. Set once by
/// the environment setup, read by Error.
void set_error_rank(int rank);
int error_rank();

/// An error every rank raised together (they agreed on it through a collective), carrying the
/// message of the lowest failing rank. The job can end cleanly: rank 0 reports it once and
/// every rank exits non-zero without MPI_Abort.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_error(const std::string& message, const char* file, int line);

}  // namespace ddp

#define DDP_THROW(msg_expr)                                 \
  do {                                                      \
    std::ostringstream ddp_oss_;                            \
    ddp_oss_ << msg_expr;                                   \
    ::ddp::throw_error(ddp_oss_.str(), __FILE__, __LINE__); \
  } while (0)

/// DDP_CHECK(cond, "message " << value): throws ddp::Error when cond is false.
#define DDP_CHECK(cond, msg_expr)     \
  do {                                \
    if (!(cond)) DDP_THROW(msg_expr); \
  } while (0)

/// DDP_MPI_CHECK(MPI_Allreduce(...)): throws with the MPI error string on failure.
#define DDP_MPI_CHECK(call)                                                                        \
  do {                                                                                             \
    int ddp_mpi_rc_ = (call);                                                                      \
    if (ddp_mpi_rc_ != 0) DDP_THROW(#call << " failed: " << ::ddp::mpi_error_string(ddp_mpi_rc_)); \
  } while (0)

namespace ddp {
std::string mpi_error_string(int code);
}
