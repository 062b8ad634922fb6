// SparseTableHandle: parses and validates the table's configuration, then
// finds or creates the table in the resource manager and returns its handle.
//
// Unlike ResourceOpKernel this kernel does not keep a reference to the
// table, so destroying the resource (DestroyResourceOp) really frees it even
// while eager mode caches the kernel.
#include <cmath>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tnet_ops/kernels/table_resource.h"
#include "tnet_ops/optimizers/rules.h"

namespace tnet {

namespace tf = ::tensorflow;

class SparseTableHandleOp : public tf::OpKernel {
 public:
  explicit SparseTableHandleOp(tf::OpKernelConstruction* ctx)
      : tf::OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("container", &container_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shared_name", &shared_name_));
    int64_t dim, num_stripes, seed;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_stripes", &num_stripes));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &seed));
    OP_REQUIRES(ctx, dim >= 1 && dim <= 65536,
                tf::errors::InvalidArgument("dim must be in [1, 65536], got ",
                                            dim));
    OP_REQUIRES(ctx,
                num_stripes >= 1 && num_stripes <= 65536 &&
                    (num_stripes & (num_stripes - 1)) == 0,
                tf::errors::InvalidArgument(
                    "num_stripes must be a power of two in [1, 65536], got ",
                    num_stripes));
    config_.dim = static_cast<int>(dim);
    config_.num_stripes = static_cast<int>(num_stripes);
    OP_REQUIRES_OK(ctx, ctx->GetAttr("min_count", &config_.min_count));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("admission_capacity",
                                     &config_.admission_capacity));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_rows", &config_.max_rows));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("memory_budget_bytes",
                                     &config_.memory_budget_bytes));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("storage_dir", &config_.storage_dir));
    OP_REQUIRES(ctx, config_.memory_budget_bytes >= 0,
                tf::errors::InvalidArgument(
                    "memory_budget_bytes must be >= 0 (0: every row in "
                    "memory), got ", config_.memory_budget_bytes));
    OP_REQUIRES(ctx,
                config_.memory_budget_bytes == 0 || !config_.storage_dir.empty(),
                tf::errors::InvalidArgument(
                    "memory_budget_bytes > 0 needs storage_dir, a writable "
                    "local directory for the rows that do not fit"));
    OP_REQUIRES(ctx, std::isfinite(config_.min_count) && config_.min_count >= 0,
                tf::errors::InvalidArgument(
                    "min_count must be finite and >= 0 (1 admits every key), "
                    "got ", config_.min_count));
    OP_REQUIRES(ctx, config_.admission_capacity >= 1,
                tf::errors::InvalidArgument(
                    "admission_capacity must be >= 1, got ",
                    config_.admission_capacity));
    OP_REQUIRES(ctx,
                config_.max_rows == 0 || config_.max_rows >= num_stripes,
                tf::errors::InvalidArgument(
                    "max_rows must be 0 (unbounded) or >= num_stripes (",
                    num_stripes, ") so every stripe can hold a row, got ",
                    config_.max_rows, "; lower num_stripes for tiny tables"));

    std::string opt;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("optimizer", &opt));
    OP_REQUIRES(ctx, FindRule(opt, &config_.optimizer.rule),
                tf::errors::InvalidArgument("unknown optimizer '", opt,
                                            "'; use one of ", RuleNames()));
    // Every hyperparameter of rules.h, whichever rule reads it: its attr,
    // in its range.
    OptimizerConfig& o = config_.optimizer;
    for (const HparamSpec& h : kSparseHparams) {
      float& value = o.*h.field;
      OP_REQUIRES_OK(ctx, ctx->GetAttr(h.name, &value));
      OP_REQUIRES(ctx, HparamInRange(h.range, value),
                  tf::errors::InvalidArgument(
                      h.name, " must be ", HparamRangeText(h.range), ", got ",
                      value));
    }
    const std::string rule_error = CheckRule(o);
    OP_REQUIRES(ctx, rule_error.empty(),
                tf::errors::InvalidArgument(rule_error));

    std::string init;
    std::vector<float> params;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initializer", &init));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initializer_params", &params));
    InitializerConfig& ic = config_.initializer;
    OP_REQUIRES(ctx, ParseInitKind(init, &ic.kind),
                tf::errors::InvalidArgument(
                    "unknown initializer '", init,
                    "'; use zeros, constant, uniform, normal or "
                    "truncated_normal"));
    for (float p : params) {
      OP_REQUIRES(ctx, std::isfinite(p),
                  tf::errors::InvalidArgument(
                      "initializer_params must be finite"));
    }
    size_t want = 2;
    if (ic.kind == InitKind::kZeros) want = 0;
    if (ic.kind == InitKind::kConstant) want = 1;
    OP_REQUIRES(ctx, params.size() == want || (want == 0),
                tf::errors::InvalidArgument(
                    "initializer '", init, "' takes ", want,
                    " initializer_params, got ", params.size()));
    if (want >= 1) ic.a = params[0];
    if (want >= 2) ic.b = params[1];
    OP_REQUIRES(ctx, ic.kind != InitKind::kUniform || ic.a <= ic.b,
                tf::errors::InvalidArgument(
                    "uniform initializer needs minval <= maxval, got ", ic.a,
                    " > ", ic.b));
    const bool gaussian = ic.kind == InitKind::kNormal ||
                          ic.kind == InitKind::kTruncatedNormal;
    OP_REQUIRES(ctx, !gaussian || ic.b >= 0.0f,
                tf::errors::InvalidArgument(
                    "initializer stddev must be >= 0, got ", ic.b));
    ic.seed = static_cast<uint64_t>(seed);
  }

  void Compute(tf::OpKernelContext* ctx) override {
    std::string name = shared_name_;
    if (name.empty()) name = this->name();
    const std::string container =
        container_.empty() ? ctx->resource_manager()->default_container()
                           : container_;
    TableResource* res = nullptr;
    OP_REQUIRES_OK(ctx, ctx->resource_manager()->LookupOrCreate<TableResource>(
                            container, name, &res,
                            [this](TableResource** out) {
                              auto* r = new TableResource(config_);
                              const std::string e = r->table()->TierError();
                              if (!e.empty()) {
                                r->Unref();
                                return tf::errors::InvalidArgument(e);
                              }
                              *out = r;
                              return tf::OkStatus();
                            }));
    tf::core::ScopedUnref unref(res);
    const TableConfig& have = res->table()->config();
    OP_REQUIRES(ctx,
                have.dim == config_.dim &&
                    have.optimizer.rule == config_.optimizer.rule,
                tf::errors::InvalidArgument(
                    "shared_name '", name, "' already holds a table with dim ",
                    have.dim, " and another configuration; use a different "
                    "shared_name"));
    OP_REQUIRES_OK(ctx, tf::MakeResourceHandleToOutput(
                            ctx, 0, container, name,
                            tf::TypeIndex::Make<TableResource>()));
  }

 private:
  std::string container_;
  std::string shared_name_;
  TableConfig config_;
};

REGISTER_KERNEL_BUILDER(Name("SparseTableHandle").Device(tf::DEVICE_CPU),
                        SparseTableHandleOp);

// The slot count of a rule at a dim, so Python never mirrors it.
class SparseRuleSlotsOp : public tf::OpKernel {
 public:
  explicit SparseRuleSlotsOp(tf::OpKernelConstruction* ctx)
      : tf::OpKernel(ctx) {
    std::string opt;
    int64_t dim = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("optimizer", &opt));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim));
    int rule = 0;
    OP_REQUIRES(ctx, FindRule(opt, &rule),
                tf::errors::InvalidArgument("unknown optimizer '", opt,
                                            "'; use one of ", RuleNames()));
    OP_REQUIRES(ctx, dim >= 1 && dim <= 65536,
                tf::errors::InvalidArgument("dim must be in [1, 65536], got ",
                                            dim));
    slots_ = NumSlotsFor(rule, static_cast<int>(dim));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    tf::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &out));
    out->scalar<int32_t>()() = slots_;
  }

 private:
  int slots_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("TnetSparseRuleSlots").Device(tf::DEVICE_CPU),
                        SparseRuleSlotsOp);

// The registration table (rules.h) for Python: each rule's name and
// hyperparameters (all rules, or the one named by `optimizer`), and every
// hyperparameter's default as written there.
class SparseRulesOp : public tf::OpKernel {
 public:
  explicit SparseRulesOp(tf::OpKernelConstruction* ctx) : tf::OpKernel(ctx) {
    std::string opt;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("optimizer", &opt));
    for (const auto& r : RuleHparams()) {
      if (opt.empty() || opt == r.first) rules_.push_back(r);
    }
    OP_REQUIRES(ctx, !rules_.empty(),
                tf::errors::InvalidArgument("unknown optimizer '", opt,
                                            "'; use one of ", RuleNames()));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const int64_t num_rules = static_cast<int64_t>(rules_.size());
    const int64_t num_hparams = static_cast<int64_t>(
        sizeof(kSparseHparams) / sizeof(kSparseHparams[0]));
    tf::Tensor* out[4] = {};
    for (int i = 0; i < 4; ++i) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(
                              i, tf::TensorShape({i < 2 ? num_rules
                                                        : num_hparams}),
                              &out[i]));
    }
    for (int64_t r = 0; r < num_rules; ++r) {
      out[0]->vec<tf::tstring>()(r) = rules_[r].first;
      out[1]->vec<tf::tstring>()(r) = rules_[r].second;
    }
    for (int64_t h = 0; h < num_hparams; ++h) {
      out[2]->vec<tf::tstring>()(h) = kSparseHparams[h].name;
      out[3]->vec<tf::tstring>()(h) = kSparseHparams[h].default_text;
    }
  }

 private:
  std::vector<std::pair<const char*, const char*>> rules_;
};

REGISTER_KERNEL_BUILDER(Name("TnetSparseRules").Device(tf::DEVICE_CPU),
                        SparseRulesOp);

}  // namespace tnet
