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

namespace {

bool FiniteNonNegative(float x) { return std::isfinite(x) && x >= 0.0f; }

}  // namespace

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
    OptimizerConfig& o = config_.optimizer;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initial_accumulator_value",
                                     &o.initial_accumulator_value));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &o.epsilon));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta_1", &o.beta_1));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta_2", &o.beta_2));
    OP_REQUIRES_OK(ctx,
                   ctx->GetAttr("learning_rate_power", &o.learning_rate_power));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("l1_regularization_strength",
                                     &o.l1_regularization_strength));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("l2_regularization_strength",
                                     &o.l2_regularization_strength));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("l2_shrinkage_regularization_strength",
                                     &o.l2_shrinkage_regularization_strength));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta", &o.beta));
    OP_REQUIRES(ctx, FiniteNonNegative(o.initial_accumulator_value),
                tf::errors::InvalidArgument(
                    "initial_accumulator_value must be finite and >= 0, got ",
                    o.initial_accumulator_value));
    OP_REQUIRES(ctx, FiniteNonNegative(o.epsilon),
                tf::errors::InvalidArgument(
                    "epsilon must be finite and >= 0, got ", o.epsilon));
    const std::string rule_error = CheckRule(o);
    OP_REQUIRES(ctx, rule_error.empty(),
                tf::errors::InvalidArgument(rule_error));
    OP_REQUIRES(ctx, o.beta_1 >= 0.0f && o.beta_1 < 1.0f,
                tf::errors::InvalidArgument("beta_1 must be in [0, 1), got ",
                                            o.beta_1));
    OP_REQUIRES(ctx, o.beta_2 >= 0.0f && o.beta_2 < 1.0f,
                tf::errors::InvalidArgument("beta_2 must be in [0, 1), got ",
                                            o.beta_2));
    OP_REQUIRES(ctx,
                std::isfinite(o.learning_rate_power) &&
                    o.learning_rate_power <= 0.0f,
                tf::errors::InvalidArgument(
                    "learning_rate_power must be finite and <= 0, got ",
                    o.learning_rate_power));
    OP_REQUIRES(ctx,
                FiniteNonNegative(o.l1_regularization_strength) &&
                    FiniteNonNegative(o.l2_regularization_strength) &&
                    FiniteNonNegative(o.l2_shrinkage_regularization_strength) &&
                    FiniteNonNegative(o.beta),
                tf::errors::InvalidArgument(
                    "l1/l2/l2_shrinkage regularization strengths and beta must "
                    "be finite and >= 0"));

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

}  // namespace tnet
