// Progress lines, metrics records and the timeline (report.h).
#include "train/report.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "core/check.h"
#include "core/clock.h"
#include "dist/agreement.h"
#include "train/device_context.h"

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

std::string percent(double fraction) {
  std::ostringstream oss;
  oss << std::fixed << std::setprecision(1) << 100.0 * fraction << "%";
  return oss.str();
}

Reporter::Reporter(const TrainConfig& cfg, ProcessGroup& comm, std::ostream* log)
    : cfg_(cfg), comm_(comm), log_(log) {}

void Reporter::open_outputs() {
  if (comm_.rank() != 0) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(cfg_.output.dir, ec);
  DDP_CHECK(!ec, "output.dir: cannot create " << cfg_.output.dir << ": " << ec.message());
  const std::string path = cfg_.output.dir + "/metrics.jsonl";
  // A resumed run continues the metrics of the run it resumes.
  metrics_.open(path,
                std::ios::out | (cfg_.training.resume.empty() ? std::ios::trunc : std::ios::app));
  DDP_CHECK(metrics_.is_open(),
            "output.dir: cannot write " << path << ": " << std::strerror(errno));
  std::ofstream(cfg_.output.dir + "/config.yaml") << to_yaml(cfg_);
}

void Reporter::say(const std::string& line) const {
  if (comm_.rank() == 0 && log_ != nullptr) *log_ << line << std::endl;
}

void Reporter::record(const nlohmann::json& j) {
  if (metrics_.is_open()) metrics_ << j.dump() << "\n" << std::flush;
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
  say(line.str());
  const nlohmann::json none;
  record({{"type", "summary"},
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
          {"resumed", sum.resumed},
          {"interrupted", sum.interrupted}});
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
    write_trace_file(cfg_.output.dir + "/trace.json", all,
                     {{"config", cfg_.source},
                      {"world_size", std::to_string(comm_.size())},
                      {"device", device}});
  });
  say("trace: " + cfg_.output.dir + "/trace.json (open in ui.perfetto.dev or chrome://tracing)");
}

}  // namespace ddp
