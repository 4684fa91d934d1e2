// The errors ddp raises. Library code throws ddp::Error (message, file:line, rank); only main()
// decides to end the job. An error every rank agreed on is a ddp::CollectiveError.
#pragma once

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

/// An error every rank raised together (they agreed on it through a collective), carrying the
/// message of the lowest failing rank. The job can end cleanly: rank 0 reports it once and
/// every rank exits non-zero without MPI_Abort.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace ddp
