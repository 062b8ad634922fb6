// Sparse optimizer configuration shared by the update rules.
//
// Each rule lives in its own header (sgd.h, adagrad.h, ...) as a struct
// deriving from RuleBase with
//   static constexpr const char* kName;              // the Python name
//   static int NumSlots(int dim);
//   static void InitSlots(const OptimizerConfig&, int dim, float* slots);
//   static void Apply(const OptimizerConfig&, float lr, int dim,
//                     const float* grad, float* weights, float* slots);
// and optionally Check (hyperparameter rules beyond the common ones) and
// kNeedsPositiveLearningRate. rules.h lists the rules; everything else (the
// name parser, slot counts, the push dispatch, the slot-count op Python
// reads) is derived from that list.
// The table stores the slots inside each row, right after the weights.
// Hyperparameter names are the Keras ones.
#ifndef TNET_OPS_OPTIMIZERS_OPTIMIZER_H_
#define TNET_OPS_OPTIMIZERS_OPTIMIZER_H_

#include <string>

#include "tnet_ops/table/row_width.h"

namespace tnet {

struct OptimizerConfig {
  int rule = 0;  // index into SparseRules (rules.h); 0 is SGD
  float initial_accumulator_value = 0.1f;  // Adagrad, row-wise Adagrad, FTRL
  float epsilon = 1e-7f;                   // Adagrad, Adam
  float beta_1 = 0.9f;                     // Adam
  float beta_2 = 0.999f;                   // Adam
  float learning_rate_power = -0.5f;       // FTRL
  float l1_regularization_strength = 0.0f;  // FTRL
  float l2_regularization_strength = 0.0f;  // FTRL
  float l2_shrinkage_regularization_strength = 0.0f;  // FTRL
  float beta = 0.0f;                                  // FTRL
};

// Defaults a rule inherits: no extra hyperparameter check, lr >= 0 allowed.
struct RuleBase {
  static constexpr bool kNeedsPositiveLearningRate = false;
  // Returns an error message, or "" when the config suits the rule.
  static std::string Check(const OptimizerConfig&) { return ""; }
};

}  // namespace tnet

#endif  // TNET_OPS_OPTIMIZERS_OPTIMIZER_H_
