// Adagrad, element-wise, the same float arithmetic as
// tf.raw_ops.ResourceSparseApplyAdagradV2 (update_slots=True):
//   acc += g^2;  w -= lr * g / (sqrt(acc) + epsilon)
// Slots: acc[dim], starting at initial_accumulator_value.
//
// Two hyperparameters of tnet's own (no Keras optimizer has them; both 0 by
// default, which is the update above exactly) make a row's start depend on
// its own update count n, kept inside acc itself (no slot of its own):
//   after each update of the row:
//     acc = max(acc + accumulator_increment + accumulator_repeat_weight * g^2,
//               accumulator_floor)
// so the k-th update of a row (k = 1, 2, ...) sees a start of
//   initial_accumulator_value + (k - 1) * accumulator_increment
//   + accumulator_repeat_weight * (the squared gradients of updates 1..k-1),
// raised to accumulator_floor from the second update on. A row's first
// steps can be large (a small initial_accumulator_value) and its later ones
// as small as from a larger start; the repeat weight does it in the scale
// of the row's own gradients.
#ifndef TNET_OPS_OPTIMIZERS_ADAGRAD_H_
#define TNET_OPS_OPTIMIZERS_ADAGRAD_H_

#include <algorithm>
#include <cmath>
#include <string>

#include "tnet_ops/optimizers/optimizer.h"

namespace tnet {

struct Adagrad : RuleBase {
  static constexpr const char* kName = "adagrad";
  static constexpr const char* kHparams =
      "initial_accumulator_value epsilon accumulator_increment "
      "accumulator_floor accumulator_repeat_weight";
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
    if (c.accumulator_increment > 0.0f || c.accumulator_floor > 0.0f ||
        c.accumulator_repeat_weight > 0.0f) {
      for (int j = 0; j < dim; ++j) {
        acc[j] = AfterUpdate(c, acc[j], g[j] * g[j]);
      }
    }
  }
  // The accumulator after an update of its row whose squared gradient
  // was g2 (see the top of this file).
  template <typename Config>
  static float AfterUpdate(const Config& c, float acc, float g2) {
    return std::max(acc + c.accumulator_increment +
                        c.accumulator_repeat_weight * g2,
                    c.accumulator_floor);
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
