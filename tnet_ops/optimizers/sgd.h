// Plain SGD: w -= lr * g. No slots.
#ifndef TNET_OPS_OPTIMIZERS_SGD_H_
#define TNET_OPS_OPTIMIZERS_SGD_H_

#include "tnet_ops/optimizers/optimizer.h"

namespace tnet {

struct Sgd : RuleBase {
  static constexpr const char* kName = "sgd";
  static int NumSlots(int) { return 0; }
  template <typename Config>
  static void InitSlots(const Config&, int, float*) {}
  template <typename Config>
  static void Apply(const Config&, float lr, int dim, const float* g,
                    float* w, float*) {
    ForRowWidth(dim, [&](auto width) {
      Row<decltype(width)::value>(lr, dim, g, w);
    });
  }

 private:
  template <int D>
  static void Row(float lr, int dim, const float* __restrict g,
                  float* __restrict w) {
    const int n = D > 0 ? D : dim;
    for (int j = 0; j < n; ++j) w[j] -= lr * g[j];
  }
};

}  // namespace tnet

#endif  // TNET_OPS_OPTIMIZERS_SGD_H_
