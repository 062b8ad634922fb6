// The list of sparse update rules, and what is derived from it.
//
// Adding a rule: write its header (see optimizer.h for the interface), add it
// to SparseRules below, and add one Python class in tnet/optimizer/sparse.py
// with the same `name` (Python asks the TnetSparseRuleSlots op for its slot
// count). A rule's OptimizerConfig::rule is its index in SparseRules.
#ifndef TNET_OPS_OPTIMIZERS_RULES_H_
#define TNET_OPS_OPTIMIZERS_RULES_H_

#include <string>
#include <utility>

#include "tnet_ops/optimizers/adagrad.h"
#include "tnet_ops/optimizers/adam.h"
#include "tnet_ops/optimizers/ftrl.h"
#include "tnet_ops/optimizers/optimizer.h"
#include "tnet_ops/optimizers/rowwise_adagrad.h"
#include "tnet_ops/optimizers/sgd.h"

namespace tnet {

template <typename... Rules>
struct RuleList {};

using SparseRules = RuleList<Sgd, Adagrad, RowwiseAdagrad, Adam, Ftrl>;

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
std::string Names(RuleList<Rules...>) {
  std::string out;
  ((out += (out.empty() ? "" : ", "), out += Rules::kName), ...);
  return out;
}

}  // namespace rules_internal

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

// "sgd, adagrad, ..." for error messages.
inline std::string RuleNames() { return rules_internal::Names(SparseRules{}); }

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
