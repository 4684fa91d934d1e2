// The seed tutorial's random data (torch.randn(N, d) then torch.randint(0, C, (N,))), from our
// portable Rng so the same seed gives the same dataset on every machine and every rank.
#include "core/check.h"
#include "core/random.h"
#include "data/dataset.h"

namespace ddp {

Dataset make_synthetic(int64_t samples, int64_t features, int64_t classes, uint64_t seed) {
  DDP_CHECK(samples > 0 && features > 0 && classes > 0,
            "make_synthetic: samples (" << samples << "), features (" << features
                                        << ") and classes (" << classes << ") must be positive");
  Dataset ds;
  ds.size = samples;
  ds.features = features;
  ds.source = "synthetic(seed=" + std::to_string(seed) + ")";
  Rng rng(seed);
  // All features first, then all labels: the tutorial's draw order.
  std::vector<float> x(static_cast<size_t>(samples * features));
  for (auto& v : x) v = static_cast<float>(rng.normal());
  ds.x = FeatureStore(std::move(x));
  ds.y.resize(static_cast<size_t>(samples));
  for (auto& l : ds.y) l = static_cast<int32_t>(rng.below(static_cast<uint64_t>(classes)));
  return ds;
}

}  // namespace ddp
