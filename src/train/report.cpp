// Progress lines, metrics records and the timeline (report.h).
#include "train/report.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "comm/agreement.h"
#include "core/atomic_file.h"
#include "core/check.h"
#include "core/clock.h"
#include "train/device_context.h"
#include "train/run_directory.h"

namespace ddp {

void Tally::add(const XentResult& r, int64_t rows) {
  loss_sum += r.loss_sum;
  correct += static_cast<double>(r.correct);
  count += static_cast<double>(rows);
}

Tally Tally::reduced(ProcessGroup& comm) const {
  double v[3] = {loss_sum, correct, count};
  comm.allreduce(v, 3, ReduceOp::Sum);
  return Tally{v[0], v[1], v[2]};
}

std::string format_rate(double samples_per_sec) {
  std::ostringstream oss;
  oss << std::fixed << std::setprecision(0) << samples_per_sec << " samples/s";
  return oss.str();
}

// The metrics a resumed run continues: a regular file's contents ("" when there is none); a
// link or other special file in its place is refused, not followed.
std::string earlier_metrics(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) return "";
  const int err = errno;
  DDP_CHECK(fd >= 0, "output.dir: cannot read "
                         << path << ": "
                         << (err == ELOOP ? "it is a symbolic link" : std::strerror(err)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  DDP_CHECK(::fstat(fd, &st) == 0 && S_ISREG(st.st_mode),
            "output.dir: " << path << " is not a regular file");
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, &text[got], text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    DDP_CHECK(n >= 0, "output.dir: cannot read " << path << ": " << std::strerror(errno));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  return text;
}

std::string percent(double fraction) {
  std::ostringstream oss;
  oss << std::fixed << std::setprecision(1) << 100.0 * fraction << "%";
  return oss.str();
}

Reporter::Reporter(const TrainConfig& cfg, ProcessGroup& comm, std::ostream* log)
    : cfg_(cfg), comm_(comm), log_(log) {}

void Reporter::open_outputs() {
  if (comm_.rank() != 0) return;
  const std::string path = RunFiles::in(cfg_, RunFiles::kMetrics);
  metrics_ = std::make_unique<AtomicFile>(path, "metrics");
  // A resumed run continues the metrics of the run it resumes: they are copied into the new
  // file, which then replaces the old one and grows in place.
  if (!cfg_.training.resume.empty()) metrics_->write(earlier_metrics(path));
  metrics_->publish();
  AtomicFile config(RunFiles::in(cfg_, RunFiles::kConfig), "config");
  config.write(to_yaml(cfg_));
  config.commit();
}

void Reporter::say(const std::string& line) const {
  if (comm_.rank() == 0 && log_ != nullptr) *log_ << line << std::endl;
}

void Reporter::record(const nlohmann::json& j) {
  // Paths are bytes, not always UTF-8: an invalid sequence becomes U+FFFD instead of an error.
  if (metrics_)
    metrics_->write(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

void Reporter::say_each_rank(const std::string& mine) {
  for (const std::string& line : all_gather_strings(comm_, mine)) say(line);
}

void Reporter::print_shapes(int64_t rows, int64_t features, int64_t classes) {
  std::ostringstream mine;
  mine << "  rank " << comm_.rank() << " replica: input " << shape_string(rows, features)
       << " -> output " << shape_string(rows, classes);
  say("global batch: input " + shape_string(rows * comm_.size(), features) + " -> output " +
      shape_string(rows * comm_.size(), classes) + " split over " + std::to_string(comm_.size()) +
      " replicas:");
  say_each_rank(mine.str());
}

namespace {
// The per-rank report's fields of the summary record; none when output.straggler_threshold
// turned it off, null ones when no rank was a persistent straggler.
void add_straggler_fields(const TrainSummary& sum, nlohmann::json& rec) {
  if (sum.straggler_threshold <= 0) return;
  const bool named = sum.straggler_rank >= 0;
  const nlohmann::json none;
  rec["straggler_threshold"] = sum.straggler_threshold;
  rec["logged_intervals"] = sum.logged_intervals;
  rec["straggler_flagged_intervals"] = sum.straggler_flagged;
  rec["straggler_rank"] = named ? nlohmann::json(sum.straggler_rank) : none;
  rec["straggler_slowest_at"] = named ? nlohmann::json(sum.straggler_slowest_at) : none;
  rec["straggler_skew"] = named ? nlohmann::json(sum.straggler_skew) : none;
}
}  // namespace

void Reporter::summary(const TrainSummary& sum, double overlap, const std::string& device) {
  std::ostringstream line;
  line << (sum.interrupted ? "interrupted: " : "done: ") << sum.epochs << " epoch(s), " << sum.steps
       << " steps, " << sum.samples << " samples in " << std::fixed
       << std::setprecision(sum.seconds < 1 ? 4 : 2) << sum.seconds << " s ("
       << format_rate(sum.samples_per_sec) << ", " << comm_.size() << " rank(s))";
  if (sum.evaluated) line << "; test accuracy " << percent(sum.test_accuracy);
  line << "; allreduce " << std::setprecision(3) << sum.comm_seconds << " s on rank 0, "
       << percent(overlap) << " hidden behind backward; data wait " << sum.data_wait_seconds
       << " s";
  if (sum.skipped_steps > 0) line << "; " << sum.skipped_steps << " step(s) skipped (non-finite)";
  if (sum.graph_steps > 0) line << "; " << sum.graph_steps << " step(s) as CUDA graphs";
  if (sum.loss_scale > 0)
    line << "; loss scale " << std::defaultfloat << std::setprecision(9) << sum.loss_scale << ", "
         << sum.scaler_skipped_steps << " step(s) skipped on overflow";
  line << "; " << describe_mfu(sum);
  if (sum.straggler_rank >= 0) line << "; " << describe_straggler(sum);
  say(line.str());
  const nlohmann::json none;
  nlohmann::json rec = {
      {"type", "summary"},
      {"epochs", sum.epochs},
      {"steps", sum.steps},
      {"samples", sum.samples},
      {"seconds", sum.seconds},
      {"samples_per_sec", sum.samples_per_sec},
      {"world_size", comm_.size()},
      {"device", device},
      {"test_accuracy", sum.evaluated ? nlohmann::json(sum.test_accuracy) : none},
      {"test_loss", sum.evaluated ? nlohmann::json(sum.test_loss) : none},
      {"allreduce_seconds", sum.comm_seconds},
      {"allreduce_hidden_fraction", overlap},
      {"allreduce_wait_seconds", sum.wait_seconds},
      {"data_wait_seconds", sum.data_wait_seconds},
      {"skipped_steps", sum.skipped_steps},
      {"scaler_skipped_steps", sum.scaler_skipped_steps},
      {"graph_steps", sum.graph_steps},
      {"loss_scale", sum.loss_scale > 0 ? nlohmann::json(sum.loss_scale) : none},
      {"resumed", sum.resumed},
      {"interrupted", sum.interrupted},
      {"flops_per_sample", sum.flops_per_sample},
      {"peak_flops_per_rank", sum.peak_flops > 0 ? nlohmann::json(sum.peak_flops) : none},
      {"peak_source", sum.peak_source},
      {"mfu", sum.peak_flops > 0 ? nlohmann::json(sum.mfu) : none}};
  add_straggler_fields(sum, rec);
  record(rec);
}

std::string describe_mfu(const TrainSummary& sum) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1);
  if (sum.peak_flops <= 0) {
    out << "MFU unknown (" << sum.peak_source << "; output.peak_tflops sets it)";
  } else {
    out << "MFU " << 100.0 * sum.mfu << "% of " << std::setprecision(2) << sum.peak_flops / 1e12
        << " TFLOP/s per rank (" << sum.peak_source << ")";
  }
  return out.str();
}

std::string describe_straggler(const TrainSummary& sum) {
  std::ostringstream out;
  out << "straggler: rank " << sum.straggler_rank << " was slowest at " << sum.straggler_slowest_at
      << " of " << sum.straggler_flagged << " logged steps past " << std::defaultfloat
      << sum.straggler_threshold << "x (compute+data " << std::fixed << std::setprecision(1)
      << sum.straggler_skew << "x the median)";
  return out.str();
}

void Reporter::start_trace(const DeviceContext& ctx) {
  if (!cfg_.output.trace) return;
  comm_.barrier();  // time 0 of every rank's track is (nearly) the same moment
  const double origin = seconds_now();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  tracer_ = std::make_unique<Tracer>(comm_.rank(),
                                     std::string(host) + ", " + ctx.placement().describe(), origin);
  track_compute_ = tracer_->track(ctx.compute_track_name());
  track_comm_ = tracer_->track(ctx.comm_track_name());
  track_data_ = tracer_->track("data (host)");
}

void Reporter::write_trace(const std::string& device) {
  if (!cfg_.output.trace) return;
  const std::vector<std::string> all = all_gather_strings(comm_, tracer_->events_json());
  run_agreed(comm_, [&] {
    if (comm_.rank() != 0) return;
    write_trace_file(RunFiles::in(cfg_, RunFiles::kTrace), all,
                     {{"config", cfg_.source},
                      {"world_size", std::to_string(comm_.size())},
                      {"device", device}});
  });
  say("trace: " + RunFiles::in(cfg_, RunFiles::kTrace) +
      " (open in ui.perfetto.dev or chrome://tracing)");
}

}  // namespace ddp
