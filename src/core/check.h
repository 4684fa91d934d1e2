// Check macros over ddp::Error (include/ddp/errors.h): one macro family for every kind of check
// (plain conditions, MPI; the CUDA and NCCL ones build on DDP_THROW).
#pragma once

#include <sstream>
#include <string>

#include "ddp/errors.h"

namespace ddp {

/// The MPI rank this process reports in errors; -1 before MPI is initialised. Set once by
/// the environment setup, read by Error.
void set_error_rank(int rank);
int error_rank();

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
