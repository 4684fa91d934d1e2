// Reading the flight records a job's ranks leave in <output.dir>/flight/ (the last collectives
// each rank issued, one JSON file per rank) and the verdict on a hang drawn from them: which
// collective did not complete, which ranks were inside it and which never came.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ddp {

/// <dir>/flight/rank-<rank>.json
std::string flight_record_path(const std::string& output_dir, int rank);

struct FlightRecords {
  std::string run;  // the job whose records these are
  int world_size = 0;
  std::vector<nlohmann::json> records;  // one per rank found, ordered by rank
  std::vector<std::string> notes;       // e.g. "ignored 2 records of an earlier run ..."
};

/// Reads <output_dir>/flight/rank-*.json. run == "": the newest job's records (by the newest
/// written_at), others ignored with a note; else only that run's. Refuses (ddp::Error naming the
/// file) a file that is not JSON, has another format/version, lacks a field or has a field of
/// the wrong type, or is not a regular file (a link or a FIFO is never followed or opened).
/// Throws when the folder holds no record (naming the folder). Ranks must be in
/// [0, world_size) with one world_size across the records of the run; a duplicate rank throws.
FlightRecords read_flight_records(const std::string& output_dir, const std::string& run = "");

struct HangVerdict {
  uint64_t stuck_seq = 0;          // the collective that did not complete (0: none pending)
  std::vector<int> entered;        // ranks inside it (issued it, not completed)
  std::vector<int> never_entered;  // ranks with a record that never issued it
  std::vector<int> missing;        // ranks with no record
  std::vector<int> culprits;       // never_entered, else missing, else the desync ranks
  std::string message;             // several lines for a person, the verdict first
};

/// Pure: the analysis of one run's records, as read_flight_records returns them.
HangVerdict analyze_hang(const FlightRecords& records);

/// <dir>/flight/verdict.txt: the verdict the job printed when it hung, as given then (a stopped
/// rank that the launcher continues to end it writes its record later, and a record read
/// afterwards shows it inside the collective it was stopped in).
std::string flight_verdict_path(const std::string& output_dir);
/// Writes it: "run <id>", "by rank <r>", then the message.
void write_flight_verdict(const std::string& output_dir, const std::string& run, int rank,
                          const std::string& message);
/// The message written for `run`, or "" when there is none for that job (or the file is not
/// a regular file).
std::string read_flight_verdict(const std::string& output_dir, const std::string& run,
                                int* rank);

/// "0-3, 5": ranks ascending, runs of three or more as a range.
std::string compact_ranks(const std::vector<int>& ranks);

}  // namespace ddp
