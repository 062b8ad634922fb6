// The one dispatch on a table row's width, shared by the update rules
// (optimizers/) and the combine kernels (kernels/row_math.h). No TF types.
#ifndef TNET_OPS_TABLE_ROW_WIDTH_H_
#define TNET_OPS_TABLE_ROW_WIDTH_H_

#include <cstdint>
#include <type_traits>

namespace tnet {

// fn(std::integral_constant<int, D>()) with D = dim for the usual row
// widths and D = 0 (any width) otherwise: a loop over a row written with
// `n = D > 0 ? D : dim` has a compile-time trip count for those widths and
// unrolls and vectorizes (same arithmetic per element, same results).
template <typename Fn>
inline void ForRowWidth(int64_t dim, Fn&& fn) {
  switch (dim) {
    case 1: return fn(std::integral_constant<int, 1>());
    case 4: return fn(std::integral_constant<int, 4>());
    case 8: return fn(std::integral_constant<int, 8>());
    case 16: return fn(std::integral_constant<int, 16>());
    case 32: return fn(std::integral_constant<int, 32>());
    case 64: return fn(std::integral_constant<int, 64>());
    default: return fn(std::integral_constant<int, 0>());
  }
}

}  // namespace tnet

#endif  // TNET_OPS_TABLE_ROW_WIDTH_H_
