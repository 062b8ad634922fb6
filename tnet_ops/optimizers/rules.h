// The registration table of the sparse update rules: the ops, the kernels
// and Python read every rule and every hyperparameter from here.
//
// A rule is three pieces: its header (tnet_ops/optimizers/<rule>.h, see
// optimizer.h), its lines below (an #include, its hyperparameters in
// TNET_SPARSE_HPARAMS if new ones, its struct in SparseRules), and its
// Python class in tnet/optimizer/sparse.py with the same `name`. Derived
// from this file: OptimizerConfig (one field per hyperparameter), the
// SparseTableHandle attrs (ops/table_ops.cc), the handle kernel's parsing
// and range checks (kernels/handle_kernel.cc), the push dispatch, slot
// counts, and the TnetSparseRules op through which Python learns each
// rule's hyperparameters and their defaults (nothing in Python lists them).
#ifndef TNET_OPS_OPTIMIZERS_RULES_H_
#define TNET_OPS_OPTIMIZERS_RULES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tnet_ops/optimizers/optimizer.h"
// One line per rule.
#include "tnet_ops/optimizers/adagrad.h"
#include "tnet_ops/optimizers/adam.h"
#include "tnet_ops/optimizers/ftrl.h"
#include "tnet_ops/optimizers/rowwise_adagrad.h"
#include "tnet_ops/optimizers/sgd.h"

// Every hyperparameter a rule may read: X(Keras name, default, range).
// The default is the SparseTableHandle attr's and the Python class's
// (written as a literal: Python reads its text, so 1e-7 stays 1e-7); the
// range is checked when a table is created. An attr's name and default
// are part of every graph that holds a table: never rename or change one,
// add a new one instead.
#define TNET_SPARSE_HPARAMS(X)                                   \
  X(initial_accumulator_value, 0.1, kNonNegative)                \
  X(epsilon, 1e-7, kNonNegative)                                 \
  X(beta_1, 0.9, kUnitInterval)                                  \
  X(beta_2, 0.999, kUnitInterval)                                \
  X(learning_rate_power, -0.5, kNonPositive)                     \
  X(l1_regularization_strength, 0.0, kNonNegative)               \
  X(l2_regularization_strength, 0.0, kNonNegative)               \
  X(l2_shrinkage_regularization_strength, 0.0, kNonNegative)     \
  X(beta, 0.0, kNonNegative)                                     \
  X(accumulator_floor, 0.0, kNonNegative)                       \
  X(start_reference_batch, 0.0, kNonNegative)

namespace tnet {

// The rules, in the order of OptimizerConfig::rule (0 is SGD). A rule's
// index is not stored anywhere (checkpoints and graphs name the rule).
template <typename... Rules>
struct RuleList {};

using SparseRules = RuleList<Sgd, Adagrad, RowwiseAdagrad, Adam, Ftrl>;

// A table's rule and its hyperparameters.
struct OptimizerConfig {
  int rule = 0;  // index into SparseRules
#define TNET_HPARAM_FIELD(name, value, range) float name = value;
  TNET_SPARSE_HPARAMS(TNET_HPARAM_FIELD)
#undef TNET_HPARAM_FIELD
};

// One hyperparameter: its name, default (as written above), range, and
// its field in OptimizerConfig.
struct HparamSpec {
  const char* name;
  const char* default_text;
  HparamRange range;
  float OptimizerConfig::*field;
};

inline constexpr HparamSpec kSparseHparams[] = {
#define TNET_HPARAM_SPEC(name, value, range) \
  {#name, #value, HparamRange::range, &OptimizerConfig::name},
    TNET_SPARSE_HPARAMS(TNET_HPARAM_SPEC)
#undef TNET_HPARAM_SPEC
};

namespace rules_internal {

template <typename F, typename First, typename... Rest>
decltype(auto) Dispatch(int rule, F&& f, RuleList<First, Rest...>) {
  if constexpr (sizeof...(Rest) == 0) {
    return f(First{});  // callers validate `rule` (FindRule) first
  } else {
    if (rule <= 0) return f(First{});
    return Dispatch(rule - 1, std::forward<F>(f), RuleList<Rest...>{});
  }
}

template <typename... Rules>
bool Find(const std::string& name, int* rule, RuleList<Rules...>) {
  int i = 0;
  bool found = false;
  ((found || (name == Rules::kName ? (found = true) : (++i, false))), ...);
  if (found) *rule = i;
  return found;
}

template <typename... Rules>
std::vector<std::pair<const char*, const char*>> List(RuleList<Rules...>) {
  return {{Rules::kName, Rules::kHparams}...};
}

// Whether the space-separated `names` are all in kSparseHparams (checked
// at compile time for every rule below: a misspelt name fails the build).
constexpr bool SameName(const char* a, size_t n, const char* b) {
  for (size_t i = 0; i < n; ++i) {
    if (b[i] != a[i]) return false;
  }
  return b[n] == '\0';
}

constexpr bool KnownHparams(const char* names) {
  size_t i = 0;
  while (names[i] != '\0') {
    while (names[i] == ' ') ++i;
    if (names[i] == '\0') break;
    size_t n = 0;
    while (names[i + n] != '\0' && names[i + n] != ' ') ++n;
    bool known = false;
    for (const HparamSpec& h : kSparseHparams) {
      known = known || SameName(names + i, n, h.name);
    }
    if (!known) return false;
    i += n;
  }
  return true;
}

template <typename... Rules>
constexpr bool AllKnown(RuleList<Rules...>) {
  return (KnownHparams(Rules::kHparams) && ...);
}

}  // namespace rules_internal

static_assert(rules_internal::AllKnown(SparseRules{}),
              "a rule's kHparams names a hyperparameter that is not in "
              "TNET_SPARSE_HPARAMS");

// Calls f(Rule{}) for the rule with index `rule`; f is usually a generic
// lambda that instantiates a template with decltype(rule).
template <typename F>
decltype(auto) DispatchRule(int rule, F&& f) {
  return rules_internal::Dispatch(rule, std::forward<F>(f), SparseRules{});
}

// Looks a rule up by its Python name; false if there is none.
inline bool FindRule(const std::string& name, int* rule) {
  return rules_internal::Find(name, rule, SparseRules{});
}

// Every rule's name and its hyperparameters (kHparams), in rule order.
inline std::vector<std::pair<const char*, const char*>> RuleHparams() {
  return rules_internal::List(SparseRules{});
}

// "sgd, adagrad, ..." for error messages.
inline std::string RuleNames() {
  std::string out;
  for (const auto& r : RuleHparams()) {
    if (!out.empty()) out += ", ";
    out += r.first;
  }
  return out;
}

// The factor a new row's accumulator start (initial_accumulator_value) is
// multiplied by when the row is inserted by a pull or push of a batch of
// `batch_size` examples: (start_reference_batch / batch_size)^2. The start
// is in squared-gradient units and a batch-mean loss scales each row's
// gradient by 1 / batch_size, so a start chosen at the reference batch
// gives a row the same first step at any batch size. 1 (the start as
// given) when start_reference_batch is 0 (off) or the batch is unknown
// (batch_size <= 0: a pull or push that does not say). Only the value
// stored at insert changes: accumulators stay plain numbers.
inline float StartScale(const OptimizerConfig& c, int64_t batch_size) {
  if (c.start_reference_batch <= 0.0f || batch_size <= 0) return 1.0f;
  const double r = static_cast<double>(c.start_reference_batch) /
                   static_cast<double>(batch_size);
  return static_cast<float>(r * r);
}

// A new row's slots: the rule's InitSlots with the accumulator start
// multiplied by start_scale (StartScale).
inline void InitSlotsScaled(const OptimizerConfig& c, int dim,
                            float start_scale, float* slots) {
  OptimizerConfig scaled = c;
  scaled.initial_accumulator_value *= start_scale;
  DispatchRule(c.rule, [&](auto r) {
    decltype(r)::InitSlots(scaled, dim, slots);
  });
}

// The rule's config for a push of a batch StartScale(c, B) = start_scale:
// the accumulator floor (Adagrad, RowwiseAdagrad) is in the start's units,
// so it is scaled the same way, at every update (nothing stored changes).
inline OptimizerConfig ConfigForPush(const OptimizerConfig& c,
                                     float start_scale) {
  OptimizerConfig scaled = c;
  scaled.accumulator_floor *= start_scale;
  return scaled;
}

inline int NumSlotsFor(int rule, int dim) {
  return DispatchRule(rule, [dim](auto r) { return decltype(r)::NumSlots(dim); });
}

inline std::string CheckRule(const OptimizerConfig& c) {
  return DispatchRule(c.rule, [&c](auto r) { return decltype(r)::Check(c); });
}

inline bool RuleNeedsPositiveLearningRate(int rule) {
  return DispatchRule(
      rule, [](auto r) { return decltype(r)::kNeedsPositiveLearningRate; });
}

inline const char* RuleName(int rule) {
  return DispatchRule(rule, [](auto r) { return decltype(r)::kName; });
}

}  // namespace tnet

#endif  // TNET_OPS_OPTIMIZERS_RULES_H_
