// The text of an MPI error code, for DDP_MPI_CHECK (kept out of check.cpp so the error type
// itself needs no MPI).
#include <mpi.h>

#include "core/check.h"

namespace ddp {

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, static_cast<size_t>(len));
}

}  // namespace ddp
