// GradScaler's scale schedule (loss_scaler.h); the arithmetic follows ATen's
// _amp_update_scale_ and GradScaler.unscale_ in float32.
#include "train/loss_scaler.h"

#include <sstream>

#include "core/check.h"
#include "ddp/errors.h"

namespace ddp {

LossScaler::LossScaler(bool enabled, double init, int64_t growth_interval)
    : enabled_(enabled),
      scale_(enabled ? static_cast<float>(init) : 1.0f),
      interval_(growth_interval) {
  DDP_CHECK(!enabled || (scale_ >= kMinScale && scale_ <= kMaxScale),
            "training.loss_scale_init: " << init << " is outside [2^-126, 2^126]");
  DDP_CHECK(interval_ >= 1, "training.loss_scale_growth_interval: must be >= 1");
}

float LossScaler::inv_scale() const {
  return static_cast<float>(1.0 / static_cast<double>(scale_));
}

float LossScaler::loss_coefficient(int64_t samples) const {
  return scale_ / static_cast<float>(samples);
}

void LossScaler::update(bool found_inf) {
  if (!enabled_) return;
  if (found_inf) {
    scale_ *= kBackoffFactor;
    tracker_ = 0;
    if (scale_ >= kMinScale) return;
    std::ostringstream msg;
    msg << "the loss scale fell below 2^-126 after halving on every overflow: the averaged "
           "gradient is non-finite at any scale (a non-finite loss under training.nan_policy: "
           "skip_step? lower optimizer.lr?)";
    throw CollectiveError(msg.str());
  }
  if (++tracker_ < interval_) return;
  const float grown = scale_ * kGrowthFactor;
  if (grown <= kMaxScale) scale_ = grown;  // torch: while finite
  tracker_ = 0;
}

void LossScaler::restore(float scale, int64_t growth_tracker) {
  if (!enabled_) return;
  DDP_CHECK(scale >= kMinScale && scale <= kMaxScale && growth_tracker >= 0,
            "a loss scale of " << scale << " (growth tracker " << growth_tracker
                               << ") is outside [2^-126, 2^126]");
  scale_ = scale;
  tracker_ = growth_tracker;
}

}  // namespace ddp
