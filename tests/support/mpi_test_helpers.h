// MPI test helpers. A REQUIRE that fails on one rank only would send that rank out of the test
// case while the others wait in the next collective: a hang instead of a failure. So ranks check
// locally, then agree (nccl-tests' way: error counts reduced across ranks), and every rank fails
// at the same point.
#pragma once

#include <catch2/catch.hpp>
#include <string>

#include "ddp/comm.h"

namespace ddp_test {

/// REQUIREs on every rank that no rank counted an error.
inline void require_on_all_ranks(ddp::Communicator& comm, long local_errors,
                                 const std::string& what) {
  double errors = static_cast<double>(local_errors);
  comm.allreduce(&errors, 1, ddp::ReduceOp::Sum);
  INFO(what << ": " << local_errors << " error(s) on rank " << comm.rank() << ", " << errors
            << " on all ranks");
  REQUIRE(errors == 0);
}

/// The largest of `value` over all ranks.
inline double max_over_ranks(ddp::Communicator& comm, double value) {
  comm.allreduce(&value, 1, ddp::ReduceOp::Max);
  return value;
}

}  // namespace ddp_test
