// Dynamic loss scaling with torch.cuda.amp.GradScaler's semantics: the loss gradient is
// multiplied by a float32 scale, the averaged gradient by its inverse before the non-finite
// check, clipping and the update; a step whose gradient overflowed is skipped and halves the
// scale, growth_interval clean steps in a row double it. The same decisions on every rank: they
// follow from the averaged gradient, which every rank holds alike.
#pragma once

#include <cstdint>

namespace ddp {

class LossScaler {
 public:
  static constexpr float kGrowthFactor = 2.0f;   ///< GradScaler's growth_factor
  static constexpr float kBackoffFactor = 0.5f;  ///< GradScaler's backoff_factor
  /// The scale stays in [2^-126, 2^126], where it and its inverse are normal float32 values:
  /// the compute thread flushes denormals (FTZ/DAZ), so a subnormal 1/scale would unscale every
  /// gradient to 0 and a subnormal scale would become 0. (GradScaler stops only at inf.)
  static constexpr float kMinScale = 0x1p-126f;
  static constexpr float kMaxScale = 0x1p126f;

  /// Off: the scale is 1 and update() never changes it. `init` is rounded to float32 (torch
  /// keeps the scale in a float32 tensor) and must be in [kMinScale, kMaxScale].
  LossScaler(bool enabled, double init, int64_t growth_interval);

  bool enabled() const { return enabled_; }
  float scale() const { return scale_; }
  /// Clean steps since the scale last changed (GradScaler's _growth_tracker).
  int64_t growth_tracker() const { return tracker_; }
  /// The unscale factor as torch computes it: scale.double().reciprocal().float().
  float inv_scale() const;
  /// The coefficient of the loss gradient of a mean over `samples`: torch's
  /// (loss * scale).backward() hands the mean's backward grad_output = scale, which divides it
  /// by the count in float32: fl(scale / samples). With a power-of-two scale this is exactly
  /// scale * fl(1 / samples), the unscaled coefficient times the scale.
  float loss_coefficient(int64_t samples) const;
  /// GradScaler.update() after a step: an overflow (`found_inf`) halves the scale and resets
  /// the tracker; a clean step counts, and growth_interval of them double the scale (unless
  /// that passes kMaxScale; torch: inf) and reset it. Throws ddp::CollectiveError when the
  /// scale falls below kMinScale (every step overflows at any scale).
  void update(bool found_inf);
  /// A checkpoint's scale and tracker (a resumed run continues the schedule).
  void restore(float scale, int64_t growth_tracker);

 private:
  bool enabled_;
  float scale_;
  int64_t interval_;
  int64_t tracker_ = 0;
};

}  // namespace ddp
