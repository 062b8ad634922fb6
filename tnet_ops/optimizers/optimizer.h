// The interface of a sparse update rule (one header per rule, listed in
// rules.h, the registration table).
//
// A rule is a struct deriving from RuleBase with
//   static constexpr const char* kName;     // its Python class's `name`
//   static constexpr const char* kHparams;  // the hyperparameters it reads,
//       // space-separated Keras names from rules.h's TNET_SPARSE_HPARAMS,
//       // in the order of its Python class's positional arguments
//   static int NumSlots(int dim);
//   template <typename Config>
//   static void InitSlots(const Config&, int dim, float* slots);
//   template <typename Config>
//   static void Apply(const Config&, float lr, int dim,
//                     const float* grad, float* weights, float* slots);
// and optionally Check (hyperparameter rules beyond each one's range) and
// kNeedsPositiveLearningRate. Config is OptimizerConfig (rules.h: one float
// field per hyperparameter, by its Keras name); a template parameter so that
// a rule's header needs nothing from the table that lists it.
// The table stores the slots inside each row, right after the weights.
#ifndef TNET_OPS_OPTIMIZERS_OPTIMIZER_H_
#define TNET_OPS_OPTIMIZERS_OPTIMIZER_H_

#include <cmath>
#include <string>

#include "tnet_ops/table/row_width.h"

namespace tnet {

// The values a hyperparameter accepts (checked when a table is created).
enum class HparamRange {
  kNonNegative,   // finite and >= 0
  kNonPositive,   // finite and <= 0
  kUnitInterval,  // in [0, 1)
};

inline bool HparamInRange(HparamRange range, float x) {
  switch (range) {
    case HparamRange::kNonNegative: return std::isfinite(x) && x >= 0.0f;
    case HparamRange::kNonPositive: return std::isfinite(x) && x <= 0.0f;
    case HparamRange::kUnitInterval: return x >= 0.0f && x < 1.0f;
  }
  return false;
}

inline const char* HparamRangeText(HparamRange range) {
  switch (range) {
    case HparamRange::kNonNegative: return "finite and >= 0";
    case HparamRange::kNonPositive: return "finite and <= 0";
    case HparamRange::kUnitInterval: return "in [0, 1)";
  }
  return "";
}

// Defaults a rule inherits: no hyperparameters, no extra check, lr >= 0
// allowed.
struct RuleBase {
  static constexpr const char* kHparams = "";
  static constexpr bool kNeedsPositiveLearningRate = false;
  // Returns an error message, or "" when the config suits the rule.
  template <typename Config>
  static std::string Check(const Config&) { return ""; }
};

}  // namespace tnet

#endif  // TNET_OPS_OPTIMIZERS_OPTIMIZER_H_
