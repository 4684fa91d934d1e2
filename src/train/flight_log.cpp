// Writing and reading back the flight records of a run (flight_log.h).
#include "train/flight_log.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <sstream>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/clock.h"
#include "io/flight_analysis.h"
#include "train/stop_request.h"

namespace ddp {

namespace {

// SIGUSR2s received so far; the watchers compare it with what they have seen.
std::atomic<uint64_t> g_dump_requests{0};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "a signal handler increments it");

extern "C" void on_dump_signal(int) { g_dump_requests.fetch_add(1); }

// The longest the analysis waits for the other ranks' records: they time out at about the same
// moment as this rank, unless stopped (their record never comes).
constexpr double kMaxGraceSeconds = 10.0;
// What a rank that is not the reporter gives the reporter to print and exit, once the verdict is
// kept (and, beyond the grace, to keep it at all). The reporter's exit (MPI_Abort) ends this
// rank first unless the reporter is stuck, so a long wait costs nothing; a short one lost the
// race to a reporter whose lane took its second to stop.
constexpr double kReporterSeconds = 5.0;

// <output.dir>/flight, made if missing; a link or file planted under that name is refused.
void make_flight_directory(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)
    DDP_THROW("cannot make " << dir << ": " << std::strerror(errno));
  struct stat st {};
  DDP_CHECK(::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode),
            dir << " is not a directory (a link or a file is in its place)");
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

// "  " before every line of `text`.
std::string indented(const std::string& text) {
  std::istringstream in(text);
  std::string out;
  for (std::string line; std::getline(in, line);) out += "  " + line + "\n";
  return out;
}

}  // namespace

void install_flight_dump_handler() {
  static const bool installed = [] {
    struct sigaction action {};
    action.sa_handler = on_dump_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    return ::sigaction(SIGUSR2, &action, nullptr) == 0;
  }();
  (void)installed;
}

FlightLog::FlightLog(std::shared_ptr<FlightRecorder> recorder, Identity id)
    : recorder_(std::move(recorder)), id_(std::move(id)) {
  DDP_CHECK(recorder_ != nullptr, "FlightLog: no recorder");
  install_flight_dump_handler();
  watcher_ = std::thread([this] { watch(); });
}

FlightLog::~FlightLog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  watcher_.join();
}

// Polls for SIGUSR2 ten times a second: a wake-up costs nothing measurable, and the record is
// written on this thread whatever the training thread is stuck in. A stop signal writes it
// too, once and quietly: when a rank dies, the launcher ends the others with SIGTERM and a
// moment later SIGKILL, and these records are then all that says where the survivors were.
void FlightLog::watch() {
  uint64_t seen = g_dump_requests.load();
  bool stop_written = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    stop_cv_.wait_for(lock, std::chrono::milliseconds(100));
    const uint64_t requests = g_dump_requests.load();
    const bool stopping = !stop_written && stop_requested() != 0;
    if (stop_ || (requests == seen && !stopping)) continue;
    lock.unlock();
    const std::string path = write("signal", "");
    if (requests != seen && !path.empty())
      std::cerr << "ddp-train: rank " << id_.rank << ": flight record written to " << path
                << " (SIGUSR2)" << std::endl;
    seen = requests;
    stop_written = stop_written || stopping;
    lock.lock();
  }
}

std::string FlightLog::write(const std::string& reason, const std::string& error,
                             bool reported) const {
  try {
    make_flight_directory(id_.output_dir + "/flight");
    nlohmann::json record = recorder_->snapshot();
    record["format"] = "ddp flight record";
    record["version"] = 1;
    record["run"] = id_.run;
    record["rank"] = id_.rank;
    record["world_size"] = id_.world_size;
    record["host"] = host_name();
    record["pid"] = static_cast<int64_t>(::getpid());
    record["reason"] = reason;
    if (!error.empty()) record["error"] = error;
    if (reported) record["reported"] = true;
    record["written_at"] = unix_seconds();
    const std::string path = flight_record_path(id_.output_dir, id_.rank);
    AtomicFile file(path, "flight record");
    file.write(record.dump(1) + "\n");
    file.commit();
    return path;
  } catch (const std::exception& e) {
    std::cerr << "ddp-train: rank " << id_.rank << ": flight record not written: " << e.what()
              << std::endl;
    return "";
  }
}

void FlightLog::on_failure(const std::string& error) const {
  const bool timed_out = recorder_->saw_timeout();
  if (write(timed_out ? "timeout" : "error", error).empty() || !timed_out) return;
  analyze_hang_after_timeout(error);
}

// Every rank that timed out writes its record and comes here; the lowest rank whose record is
// there once all are (or the grace is over) prints the verdict, so it is printed once even when
// rank 0 is the one that stopped. A rank that times out after the reporter looked (a starved
// core; a stopped rank the launcher continues to end it) finds the verdict given (a record says
// "reported"): it prints nothing more, and waits for the reporter as the others do.
// Not the reporter: it prints the verdict and ends the job. This rank's own exit would have the
// launcher end the job at once, the reporter's message possibly unprinted: so it waits until the
// verdict is kept (the reporter writes it before printing), then long enough for the reporter
// to exit first (bounded: the reporter may itself be stuck).
void FlightLog::wait_for_reporter(double grace) const {
  const double deadline = seconds_now() + grace + kReporterSeconds;
  while (seconds_now() < deadline) {
    try {
      if (!read_flight_verdict(id_.output_dir, id_.run, nullptr).empty()) break;
    } catch (const std::exception&) {
      // unreadable for now: keep waiting
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(kReporterSeconds));
}

void FlightLog::analyze_hang_after_timeout(const std::string& error) const {
  const double grace = std::min(id_.timeout_s, kMaxGraceSeconds);
  const double deadline = seconds_now() + grace;
  FlightRecords records;
  for (;;) {
    try {
      records = read_flight_records(id_.output_dir, id_.run);
    } catch (const std::exception&) {
      records = FlightRecords{};  // a record of another job in the way: try again
    }
    if (static_cast<int>(records.records.size()) >= id_.world_size || seconds_now() > deadline)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (records.records.empty()) return;
  bool reported = false;  // a rank that timed out late: the reporter is printing, or has printed
  for (const nlohmann::json& r : records.records) reported = reported || r.value("reported", false);
  if (reported || records.records.front().value("rank", -1) != id_.rank) {
    wait_for_reporter(grace);
    return;
  }
  const HangVerdict verdict = analyze_hang(records);
  write("timeout", error, /*reported=*/true);
  try {
    write_flight_verdict(id_.output_dir, id_.run, id_.rank, verdict.message);
  } catch (const std::exception& e) {
    std::cerr << "ddp-train: rank " << id_.rank << ": hang verdict not written: " << e.what()
              << std::endl;
  }
  std::cerr << "ddp-train: hang analysis by rank " << id_.rank << " (from "
            << id_.output_dir << "/flight; offline: ddp-train analyze " << id_.output_dir
            << "):\n"
            << indented(verdict.message) << std::flush;
}

}  // namespace ddp
