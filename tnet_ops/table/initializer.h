// Initial weights of a new row, seeded by its key.
#ifndef TNET_OPS_TABLE_INITIALIZER_H_
#define TNET_OPS_TABLE_INITIALIZER_H_

#include <cmath>
#include <cstdint>
#include <string>

#include "tnet_ops/table/hash.h"

namespace tnet {

enum class InitKind { kZeros, kConstant, kUniform, kNormal, kTruncatedNormal };

struct InitializerConfig {
  InitKind kind = InitKind::kTruncatedNormal;
  // kConstant: value = a. kUniform: [a, b). kNormal / kTruncatedNormal:
  // mean a, stddev b (truncated at two standard deviations, as Keras does).
  float a = 0.0f;
  float b = 0.05f;
  uint64_t seed = 0;
};

// Parses "zeros" | "constant" | "uniform" | "normal" | "truncated_normal".
inline bool ParseInitKind(const std::string& name, InitKind* kind) {
  if (name == "zeros") *kind = InitKind::kZeros;
  else if (name == "constant") *kind = InitKind::kConstant;
  else if (name == "uniform") *kind = InitKind::kUniform;
  else if (name == "normal") *kind = InitKind::kNormal;
  else if (name == "truncated_normal") *kind = InitKind::kTruncatedNormal;
  else return false;
  return true;
}

// Standard normals by the ziggurat method (Marsaglia and Tsang): the area
// under f(x) = exp(-x^2 / 2), x >= 0, is cut into 128 layers of equal area
// v; layer 0 is the base strip (a rectangle up to r plus the tail beyond
// it), layer i >= 1 the rectangle of width x[i] between heights f(x[i]) and
// f(x[i + 1]). A draw picks a layer and a signed point u * x[i] in it: it
// lies under the curve for sure when |u| < x[i + 1] / x[i] (~99% of draws:
// one hash and two multiplies, no log, no sin), else it is tested against
// f itself (the wedge) or, in layer 0, replaced by a draw from the tail.
struct ZigguratTables {
  static constexpr int kLayers = 128;
  float x[kLayers + 1];  // x[0] = v / f(r) (the base strip's width), x[1] = r
  float ratio[kLayers];  // x[i + 1] / x[i]
  float f[kLayers + 1];  // f(x[i])
  float r;

  ZigguratTables() {
    const double kR = 3.442619855896652;  // where 128 layers close at the top
    auto fn = [](double t) { return std::exp(-0.5 * t * t); };
    const double v = kR * fn(kR) +
                     std::sqrt(std::acos(-1.0) / 2) * std::erfc(kR / std::sqrt(2.0));
    double xs[kLayers + 1];
    xs[0] = v / fn(kR);
    xs[1] = kR;
    for (int i = 2; i < kLayers; ++i) {
      xs[i] = std::sqrt(-2.0 * std::log(v / xs[i - 1] + fn(xs[i - 1])));
    }
    xs[kLayers] = 0.0;
    for (int i = 0; i <= kLayers; ++i) {
      x[i] = static_cast<float>(xs[i]);
      f[i] = static_cast<float>(fn(xs[i]));
    }
    for (int i = 0; i < kLayers; ++i) {
      ratio[i] = static_cast<float>(xs[i + 1] / xs[i]);
    }
    r = static_cast<float>(kR);
  }
};

inline const ZigguratTables& Ziggurat() {
  static const ZigguratTables tables;
  return tables;
}

// How many draws one weight may take (its stream); a weight whose draws
// are all rejected is the mean (a draw is rejected with p ~0.012, or ~0.06
// when truncated: 64 in a row happen with p < 1e-75).
constexpr uint64_t kDrawsPerWeight = 64;

// A standard normal from the draws n0, n0 + 1, ... of a row (at most
// kDrawsPerWeight), or with kTruncated one in [-2, 2] (beyond-2 values are
// drawn again, as Keras's TruncatedNormal does); 0 if the stream runs out.
// Draw d: layer = its low 7 bits, u = its high 32 bits as
// a signed fraction, the wedge's height its bits 8..31.
// Draw d's layer, its signed fraction u and the point z = u * x[layer].
struct ZigguratPoint {
  int layer;
  float u;
  float z;
};

inline ZigguratPoint PointOf(const ZigguratTables& t, uint64_t d) {
  const int i = static_cast<int>(d & (ZigguratTables::kLayers - 1));
  const float u = static_cast<float>(static_cast<int32_t>(d >> 32)) *
                  (1.0f / 2147483648.0f);
  return {i, u, u * t.x[i]};
}

template <bool kTruncated>
inline float KeyedNormal(uint64_t base, uint64_t n0) {
  const ZigguratTables& t = Ziggurat();
  const uint64_t end = n0 + kDrawsPerWeight;
  for (uint64_t n = n0; n < end; ++n) {
    const uint64_t d = KeyedDraw(base, n);
    const auto [i, u, z] = PointOf(t, d);
    if (std::fabs(u) < t.ratio[i]) {
      if (!kTruncated || std::fabs(z) <= 2.0f) return z;
      continue;
    }
    if (i == 0) {  // beyond r (> 2: never kept when truncated)
      if (kTruncated) continue;
      // The tail: a = -log(U1) / r, accepted when -2 log(U2) > a^2
      // (an exponential proposal), on the next draws of the stream.
      while (++n < end) {
        const uint64_t e = KeyedDraw(base, n);
        const float a = -std::log(UniformHi(e)) / t.r;
        const float b = -std::log(UniformLo(e));
        if (2.0f * b > a * a) return u < 0.0f ? -(t.r + a) : t.r + a;
      }
      break;
    }
    // The wedge: a height uniform between f(x[i]) and f(x[i + 1]) is kept
    // under the curve at z.
    const float y = t.f[i] + UniformLo(d) * (t.f[i + 1] - t.f[i]);
    if (y < std::exp(-0.5f * z * z)) {
      if (!kTruncated || std::fabs(z) <= 2.0f) return z;
    }
  }
  return 0.0f;
}

// Writes the dim initial weights of `key` into `out`. Every value is a pure
// function of (seed, key, j): weights 2p and 2p+1 come from the cos and sin
// outputs of the pairs of stream p.
inline void InitializeRow(const InitializerConfig& c, int64_t key, int dim,
                          float* out) {
  switch (c.kind) {
    case InitKind::kZeros:
      for (int j = 0; j < dim; ++j) out[j] = 0.0f;
      return;
    case InitKind::kConstant:
      for (int j = 0; j < dim; ++j) out[j] = c.a;
      return;
    case InitKind::kUniform: {
      const uint64_t base = KeyedBase(c.seed, key);
      for (int j = 0; j < dim; j += 2) {
        const uint64_t d = KeyedDraw(base, static_cast<uint64_t>(j / 2));
        out[j] = c.a + (c.b - c.a) * UniformHi(d);
        if (j + 1 < dim) out[j + 1] = c.a + (c.b - c.a) * UniformLo(d);
      }
      return;
    }
    case InitKind::kNormal:
    case InitKind::kTruncatedNormal: {
      // Weight j is the first kept normal of its own stream, draws
      // j * 64 ... j * 64 + 63 of the row. First every weight's first draw
      // with no branch (independent: the core overlaps them), then the
      // few whose first draw is not a sure hit take the whole method.
      const uint64_t base = KeyedBase(c.seed, key);
      const bool truncated = c.kind == InitKind::kTruncatedNormal;
      const ZigguratTables& t = Ziggurat();
      for (int j0 = 0; j0 < dim; j0 += 32) {
        const int j1 = dim - j0 < 32 ? dim : j0 + 32;
        uint32_t again = 0;  // the block's weights to draw in full
        for (int j = j0; j < j1; ++j) {
          const auto [i, u, z] = PointOf(
              t, KeyedDraw(base, static_cast<uint64_t>(j) * kDrawsPerWeight));
          const bool hit = (std::fabs(u) < t.ratio[i]) &
                           (!truncated | (std::fabs(z) <= 2.0f));
          out[j] = c.a + c.b * z;
          again |= static_cast<uint32_t>(!hit) << (j - j0);
        }
        while (again != 0) {
          const int j = j0 + __builtin_ctz(again);
          again &= again - 1;
          const uint64_t n0 = static_cast<uint64_t>(j) * kDrawsPerWeight;
          const float z = truncated ? KeyedNormal<true>(base, n0)
                                    : KeyedNormal<false>(base, n0);
          out[j] = c.a + c.b * z;
        }
      }
      return;
    }
  }
}

}  // namespace tnet

#endif  // TNET_OPS_TABLE_INITIALIZER_H_
