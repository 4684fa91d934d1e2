// Feature normalisation (data.normalize): x' = (x - mean[j]) / std[j] for every feature j, in
// float32, on both splits as their rows are read (Dataset::transform). `standardize` takes each
// feature's mean and population std over the training split (computed in double in row order, so
// every rank, which reads the whole training split, gets the same values); a fixed [mean, std]
// applies to every feature. The transform a model was trained with travels in its model.safetensors
// metadata, so that evaluation and prediction feed it what training fed it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "ddp/config.h"

namespace ddp {

/// The transform `n` asks for, fitted on `train` (standardize) or filled in (fixed). A feature
/// that is constant over the training split keeps std 1 (it becomes 0 everywhere). Throws
/// ddp::Error naming the sample and the feature when standardize meets a NaN or an infinity.
FeatureTransform fit_normalization(const Normalization& n, const Dataset& train);

/// Makes `t` the transform `ds`'s rows are read through (Dataset::read_rows). Throws ddp::Error
/// when the feature counts differ.
void apply_normalization(const FeatureTransform& t, Dataset& ds);

/// The metadata entries that carry `t` ("ddp.normalize.mean" and "ddp.normalize.std", JSON
/// lists with 9 significant digits, which give each float back exactly); none for the identity.
std::map<std::string, std::string> normalization_metadata(const FeatureTransform& t);

/// The transform stored in `metadata` (the identity when it has none). Throws ddp::Error naming
/// `where`, the key and the entry when the entries are malformed, do not have `features` values,
/// or hold a value that is not a finite float (a std must be a normal float > 0).
FeatureTransform normalization_from_metadata(const std::map<std::string, std::string>& metadata,
                                             const std::string& where, int64_t features);

}  // namespace ddp
