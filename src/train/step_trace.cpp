// The timeline of the traced steps (step_trace.h).
#include "train/step_trace.h"

namespace ddp {

StepTrace::StepTrace(DeviceContext& ctx, Reporter& report, Sequential& model, std::string optimizer)
    : ctx_(ctx), report_(report), model_(model), optimizer_(std::move(optimizer)) {}

StepTrace::~StepTrace() {
  if (observing_) model_.set_layer_observer(nullptr);
}

void StepTrace::begin_step(bool traced) {
  if (traced != observing_) {
    if (traced) {
      model_.set_layer_observer(
          [this](const std::string& name, bool begin) { observe_layer(name, begin); });
    } else {
      model_.set_layer_observer(nullptr);
    }
    observing_ = traced;
  }
  recording_ = traced;
  if (traced) step_begin_ = ctx_.mark();
}

void StepTrace::observe_layer(const std::string& name, bool begin) {
  if (!recording_) return;
  if (begin) {
    layer_begin_ = ctx_.mark();
  } else {
    current_.spans.push_back({name, layer_begin_, ctx_.mark()});
  }
}

void StepTrace::buckets_launched(size_t from, size_t to) {
  if (!recording_) return;
  for (size_t b = from; b < to; ++b)
    current_.instants.emplace_back("bucket " + std::to_string(b) + " ready", ctx_.mark());
}

void StepTrace::update_begins() {
  if (recording_) update_begin_ = ctx_.mark();
}

void StepTrace::update_ends() {
  if (recording_) update_end_ = ctx_.mark();
}

StepTrace::Recording StepTrace::end_step(int64_t global_step, bool sharded, bool fused) {
  if (!recording_) return {};
  recording_ = false;
  const Mark end = ctx_.mark();
  const std::string what = "optimizer (" + optimizer_ + (sharded ? ", this rank's shard)" : ")");
  if (!fused) current_.spans.push_back({what, update_begin_, update_end_});
  if (sharded) current_.spans.push_back({"parameter allgather", update_end_, end});
  current_.spans.push_back({"step " + std::to_string(global_step), step_begin_, end});
  return std::exchange(current_, Recording{});
}

void StepTrace::write(const Recording& recording, const std::vector<std::shared_ptr<Work>>& works,
                      const BucketPlan& plan, bool sharded, int64_t global_step) {
  if (recording.spans.empty()) return;
  Tracer& tracer = report_.tracer();
  for (size_t b = 0; b < works.size(); ++b) {
    tracer.span(report_.comm_track(),
                (sharded ? "reduce-scatter bucket " : "allreduce bucket ") + std::to_string(b),
                works[b]->start_time(), works[b]->end_time(),
                {{"floats", static_cast<double>(plan.buckets[b].numel)},
                 {"step", static_cast<double>(global_step)}});
  }
  for (const Recording::Span& span : recording.spans)
    tracer.span(report_.compute_track(), span.name, span.begin.time(), span.end.time());
  for (const auto& [name, mark] : recording.instants)
    tracer.instant(report_.compute_track(), name, mark.time());
}

}  // namespace ddp
