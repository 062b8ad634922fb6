// Adam with bias correction by each row's own update count.
//
// Keras Adam corrects its moments with the global step. In a sparse table a
// row is updated only on the steps where its key appears, so the global step
// would over-correct rare rows (their moments have seen far fewer updates).
// Each row keeps its own count t in a slot instead:
//   t += 1
//   m = beta_1 * m + (1 - beta_1) * g
//   v = beta_2 * v + (1 - beta_2) * g^2
//   alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)
//   w -= alpha * m / (sqrt(v) + epsilon)
// which is exactly Keras Adam for a row that is updated at every step.
// Slots: m[dim], v[dim], t (a float, exact up to 2^24 updates of one row;
// beyond that the correction factor is 1 to float precision anyway).
#ifndef TNET_OPS_OPTIMIZERS_ADAM_H_
#define TNET_OPS_OPTIMIZERS_ADAM_H_

#include <cmath>

#include "tnet_ops/optimizers/optimizer.h"

namespace tnet {

struct Adam : RuleBase {
  static constexpr const char* kName = "adam";
  static constexpr const char* kHparams = "beta_1 beta_2 epsilon";
  static int NumSlots(int dim) { return 2 * dim + 1; }
  template <typename Config>
  static void InitSlots(const Config&, int dim, float* s) {
    for (int j = 0; j < 2 * dim + 1; ++j) s[j] = 0.0f;
  }
  template <typename Config>
  static void Apply(const Config& c, float lr, int dim, const float* g,
                    float* w, float* s) {
    float* m = s;
    float* v = s + dim;
    float& t = s[2 * dim];
    t += 1.0f;
    const float b1p = std::pow(c.beta_1, t);
    const float b2p = std::pow(c.beta_2, t);
    const float alpha = lr * std::sqrt(1.0f - b2p) / (1.0f - b1p);
    ForRowWidth(dim, [&](auto width) {
      Row<decltype(width)::value>(c.beta_1, c.beta_2, c.epsilon, alpha, dim,
                                  g, w, m, v);
    });
  }

 private:
  template <int D>
  static void Row(float beta_1, float beta_2, float epsilon, float alpha,
                  int dim, const float* __restrict g, float* __restrict w,
                  float* __restrict m, float* __restrict v) {
    const int n = D > 0 ? D : dim;
    for (int j = 0; j < n; ++j) {
      m[j] = beta_1 * m[j] + (1.0f - beta_1) * g[j];
      v[j] = beta_2 * v[j] + (1.0f - beta_2) * g[j] * g[j];
      w[j] -= alpha * m[j] / (std::sqrt(v[j]) + epsilon);
    }
  }
};

}  // namespace tnet

#endif  // TNET_OPS_OPTIMIZERS_ADAM_H_
