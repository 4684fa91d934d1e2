// What a rank does with its flight recorder (comm/flight_recorder.h): writes it as
// <output.dir>/flight/rank-<R>.json when training fails (a timeout or any other error), on
// SIGUSR2 while the job runs (a thread waits for the signal, so a hung training thread still
// gets its record written), on the first stop signal (SIGTERM, SIGINT: also how a launcher
// ends the survivors of a dead rank) and at exit when output.flight_record_at_exit asks; after a
// collective timed out, waits a little for the other ranks' records and, on the lowest rank
// that has one, prints which rank never joined which collective (io/flight_analysis.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/flight_recorder.h"

namespace ddp {

/// Makes SIGUSR2 ask every FlightLog of the process to write its record (idempotent).
void install_flight_dump_handler();

class FlightLog {
 public:
  struct Identity {
    std::string output_dir;
    std::string run;  ///< the job's id, the same on every rank
    int rank = 0;
    int world_size = 1;
    double timeout_s = 600;  ///< distributed.timeout_s: bounds the wait for the peers' records
  };

  /// Watches for SIGUSR2 (each one writes the record) and a stop signal (the first writes it)
  /// until destroyed.
  FlightLog(std::shared_ptr<FlightRecorder> recorder, Identity id);
  ~FlightLog();
  FlightLog(const FlightLog&) = delete;
  FlightLog& operator=(const FlightLog&) = delete;

  /// Writes the record with `reason` ("timeout", "error", "signal", "exit") and the error's
  /// message ("" for none), `reported` once this rank printed the hang's verdict; returns the
  /// path, or "" when it could not be written (the reason is printed: a failing job's own
  /// error must not be hidden by this one's).
  std::string write(const std::string& reason, const std::string& error,
                    bool reported = false) const;

  /// Training failed with `error`: writes the record and, when a collective of this rank timed
  /// out, runs the hang analysis over every rank's record (waiting up to min(timeout_s, 10 s)
  /// for them). The lowest rank with a record prints the verdict to stderr; the others give it
  /// a moment to do so before they return (their caller ends the job).
  void on_failure(const std::string& error) const;

 private:
  void watch();
  void analyze_hang_after_timeout(const std::string& error) const;
  void wait_for_reporter(double grace) const;

  std::shared_ptr<FlightRecorder> recorder_;
  Identity id_;
  std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread watcher_;
};

}  // namespace ddp
