// Adagrad, element-wise, the same float arithmetic as
// tf.raw_ops.ResourceSparseApplyAdagradV2 (update_slots=True):
//   acc += g^2;  w -= lr * g / (sqrt(acc) + epsilon)
// Slots: acc[dim], starting at initial_accumulator_value.
#ifndef TNET_OPS_OPTIMIZERS_ADAGRAD_H_
#define TNET_OPS_OPTIMIZERS_ADAGRAD_H_

#include <cmath>
#include <string>

#include "tnet_ops/optimizers/optimizer.h"

namespace tnet {

struct Adagrad : RuleBase {
  static constexpr const char* kName = "adagrad";
  static constexpr const char* kHparams = "initial_accumulator_value epsilon";
  static int NumSlots(int dim) { return dim; }
  template <typename Config>
  static std::string Check(const Config& c) {
    if (c.epsilon > 0.0f || c.initial_accumulator_value > 0.0f) return "";
    return "adagrad needs epsilon > 0 or initial_accumulator_value > 0 "
           "(otherwise the first update divides by zero)";
  }
  template <typename Config>
  static void InitSlots(const Config& c, int dim, float* s) {
    for (int j = 0; j < dim; ++j) s[j] = c.initial_accumulator_value;
  }
  template <typename Config>
  static void Apply(const Config& c, float lr, int dim, const float* g,
                    float* w, float* acc) {
    ForRowWidth(dim, [&](auto width) {
      Row<decltype(width)::value>(lr, c.epsilon, dim, g, w, acc);
    });
  }

 private:
  template <int D>
  static void Row(float lr, float epsilon, int dim, const float* __restrict g,
                  float* __restrict w, float* __restrict acc) {
    const int n = D > 0 ? D : dim;
    for (int j = 0; j < n; ++j) {
      acc[j] += g[j] * g[j];
      w[j] -= lr * g[j] / (std::sqrt(acc[j]) + epsilon);
    }
  }
};

}  // namespace tnet

#endif  // TNET_OPS_OPTIMIZERS_ADAGRAD_H_
