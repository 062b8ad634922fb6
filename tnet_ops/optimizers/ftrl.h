// FTRL-proximal, the same float arithmetic as
// tf.raw_ops.ResourceSparseApplyFtrlV2 as Keras' Ftrl calls it (Keras folds
// `beta` into l2 as l2 + beta / (2 * lr)):
//   g' = g + 2 * l2_shrinkage * w
//   n' = n + g^2
//   z += g' - (n'^-p - n^-p) / lr * w            (p = learning_rate_power)
//   w  = (clip(z, -l1, l1) - z) / (n'^-p / lr + 2 * l2)
//   n  = n'
// Slots: n[dim] (starts at initial_accumulator_value), z[dim] (starts at 0).
#ifndef TNET_OPS_OPTIMIZERS_FTRL_H_
#define TNET_OPS_OPTIMIZERS_FTRL_H_

#include <algorithm>
#include <cmath>

#include "tnet_ops/optimizers/optimizer.h"

namespace tnet {

struct Ftrl : RuleBase {
  static constexpr const char* kName = "ftrl";
  static constexpr const char* kHparams =
      "learning_rate_power initial_accumulator_value "
      "l1_regularization_strength l2_regularization_strength "
      "l2_shrinkage_regularization_strength beta start_reference_batch";
  // Apply divides by lr.
  static constexpr bool kNeedsPositiveLearningRate = true;
  static int NumSlots(int dim) { return 2 * dim; }
  template <typename Config>
  static void InitSlots(const Config& c, int dim, float* s) {
    for (int j = 0; j < dim; ++j) s[j] = c.initial_accumulator_value;
    for (int j = dim; j < 2 * dim; ++j) s[j] = 0.0f;
  }
  template <typename Config>
  static void Apply(const Config& c, float lr, int dim, const float* g,
                    float* w, float* s) {
    float* n = s;
    float* z = s + dim;
    const float l1 = c.l1_regularization_strength;
    const float l2 = c.l2_regularization_strength + c.beta / (2.0f * lr);
    const float shrink = c.l2_shrinkage_regularization_strength;
    const float p = c.learning_rate_power;
    const bool sqrt_power = (p == -0.5f);
    for (int j = 0; j < dim; ++j) {
      const float gs = shrink > 0.0f ? g[j] + 2.0f * shrink * w[j] : g[j];
      const float n_new = n[j] + g[j] * g[j];
      const float pow_new = sqrt_power ? std::sqrt(n_new) : std::pow(n_new, -p);
      const float pow_old = sqrt_power ? std::sqrt(n[j]) : std::pow(n[j], -p);
      z[j] += gs - (pow_new - pow_old) / lr * w[j];
      const float x = std::min(std::max(z[j], -l1), l1) - z[j];
      const float y = pow_new / lr + 2.0f * l2;
      w[j] = x / y;
      n[j] = n_new;
    }
  }
};

}  // namespace tnet

#endif  // TNET_OPS_OPTIMIZERS_FTRL_H_
