// Row-wise Adagrad: one accumulator per row instead of one per weight (as
// TensorNet and FBGEMM do), fed with the mean squared gradient of the row:
//   acc += mean_j(g_j^2);  w -= lr * g / (sqrt(acc) + epsilon)
// A third less memory than Adagrad at dim 8 and nearly the same quality for
// embedding rows, whose coordinates see the same examples.
// accumulator_floor as in adagrad.h.
#ifndef TNET_OPS_OPTIMIZERS_ROWWISE_ADAGRAD_H_
#define TNET_OPS_OPTIMIZERS_ROWWISE_ADAGRAD_H_

#include <algorithm>
#include <cmath>
#include <string>

#include "tnet_ops/optimizers/adagrad.h"
#include "tnet_ops/optimizers/optimizer.h"

namespace tnet {

struct RowwiseAdagrad : RuleBase {
  static constexpr const char* kName = "rowwise_adagrad";
  static constexpr const char* kHparams = Adagrad::kHparams;
  static int NumSlots(int) { return 1; }
  template <typename Config>
  static std::string Check(const Config& c) {
    return Adagrad::Check(c);
  }
  template <typename Config>
  static void InitSlots(const Config& c, int, float* s) {
    s[0] = c.initial_accumulator_value;
  }
  template <typename Config>
  static void Apply(const Config& c, float lr, int dim, const float* g,
                    float* w, float* acc) {
    float sq = 0.0f;
    for (int j = 0; j < dim; ++j) sq += g[j] * g[j];
    acc[0] += sq / static_cast<float>(dim);
    const float scale = lr / (std::sqrt(acc[0]) + c.epsilon);
    for (int j = 0; j < dim; ++j) w[j] -= scale * g[j];
    if (c.accumulator_floor > 0.0f) {
      acc[0] = std::max(acc[0], c.accumulator_floor);
    }
  }
};

}  // namespace tnet

#endif  // TNET_OPS_OPTIMIZERS_ROWWISE_ADAGRAD_H_
