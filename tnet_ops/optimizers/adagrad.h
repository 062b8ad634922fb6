// Adagrad, element-wise, the same float arithmetic as
// tf.raw_ops.ResourceSparseApplyAdagradV2 (update_slots=True):
//   acc += g^2;  w -= lr * g / (sqrt(acc) + epsilon)
// Slots: acc[dim], starting at initial_accumulator_value (times the
// batch's StartScale, rules.h, when start_reference_batch is set).
//
// accumulator_floor, a hyperparameter of tnet's own (no Keras optimizer has
// it; 0 by default, which is the update above exactly), makes a row's start
// depend on its own update count:
//   after each update of the row:  acc = max(acc, accumulator_floor)
// so a row's first update runs from initial_accumulator_value and every
// later one from at least the floor. Whether a row was updated before is
// read from acc itself (no slot of its own; checkpoints keep it). With a
// small start, a rare row's first step is large and its later steps are
// no larger than from a start at the floor: gradients much smaller than
// sqrt(floor) then move the row in proportion to their size instead of
// by about the learning rate.
// With start_reference_batch set, a push of a batch of B examples applies
// the floor times StartScale (rules.h), as the start: the same floor acts
// the same at every batch size.
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
      "initial_accumulator_value epsilon accumulator_floor "
      "start_reference_batch";
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
    if (c.accumulator_floor > 0.0f) {
      for (int j = 0; j < dim; ++j) {
        acc[j] = std::max(acc[j], c.accumulator_floor);
      }
    }
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
