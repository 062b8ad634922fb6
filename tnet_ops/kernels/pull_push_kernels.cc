// SparseTablePull / SparseTablePush: validate every input, then hand the
// flat buffers to the table. Validation happens before any row is touched,
// so a rejected push leaves the table exactly as it was.
#include <cmath>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tnet_ops/kernels/table_resource.h"
#include "tnet_ops/optimizers/rules.h"

namespace tnet {

namespace tf = ::tensorflow;

namespace {

// The V2 ops' `batch_size` input at `index` (>= 0; 0: unknown); 0 for the
// V1 ops, which have no such input.
tf::Status BatchSizeInput(tf::OpKernelContext* ctx, int index,
                          int64_t* batch_size) {
  *batch_size = 0;
  if (ctx->num_inputs() <= index) return tf::OkStatus();
  TF_RETURN_IF_ERROR(
      ScalarInput<int64_t>(ctx, index, "batch_size", batch_size));
  if (*batch_size < 0) {
    return tf::errors::InvalidArgument(
        "batch_size must be >= 0 (0: unknown), got ", *batch_size);
  }
  return tf::OkStatus();
}

}  // namespace

class SparseTablePullOp : public tf::OpKernel {
 public:
  explicit SparseTablePullOp(tf::OpKernelConstruction* ctx)
      : tf::OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, GetDimAttr(ctx, &dim_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, dim_, &res));
    const tf::Tensor& keys = ctx->input(1);
    OP_REQUIRES(ctx, tf::TensorShapeUtils::IsVector(keys.shape()),
                tf::errors::InvalidArgument(
                    "keys must be a 1-D int64 tensor, got shape ",
                    keys.shape().DebugString(),
                    "; flatten ids (and drop padding) before the pull"));
    bool training = false;
    OP_REQUIRES_OK(ctx, ScalarInput<bool>(ctx, 2, "training", &training));
    int64_t batch_size = 0;
    OP_REQUIRES_OK(ctx, BatchSizeInput(ctx, 3, &batch_size));
    const float scale =
        StartScale(res->table()->config().optimizer, batch_size);
    const int64_t n = keys.dim_size(0);
    tf::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({n, dim_}),
                                             &out));
    if (n == 0) return;
    const bool ok = res->table()->Pull(keys.flat<int64_t>().data(), n,
                                       training, out->flat<float>().data(),
                                       MakeRunner(ctx), scale);
    if (!ok) {
      ctx->SetStatus(TableFailure(res->table(), "inserting rows"));
      return;
    }
  }

 private:
  int64_t dim_;
};

class SparseTablePushOp : public tf::OpKernel {
 public:
  explicit SparseTablePushOp(tf::OpKernelConstruction* ctx)
      : tf::OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, GetDimAttr(ctx, &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("unique_keys", &unique_keys_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, dim_, &res));
    const tf::Tensor& keys = ctx->input(1);
    const tf::Tensor& grads = ctx->input(2);
    OP_REQUIRES(ctx, tf::TensorShapeUtils::IsVector(keys.shape()),
                tf::errors::InvalidArgument("keys must be 1-D, got shape ",
                                            keys.shape().DebugString()));
    const int64_t n = keys.dim_size(0);
    OP_REQUIRES(ctx,
                tf::TensorShapeUtils::IsMatrix(grads.shape()) &&
                    grads.dim_size(0) == n && grads.dim_size(1) == dim_,
                tf::errors::InvalidArgument(
                    "grads must have shape [", n, ", ", dim_,
                    "] (one row per key, table dim), got ",
                    grads.shape().DebugString()));
    float lr = 0.0f;
    int64_t step = 0;
    OP_REQUIRES_OK(ctx, ScalarInput<float>(ctx, 3, "learning_rate", &lr));
    OP_REQUIRES_OK(ctx, ScalarInput<int64_t>(ctx, 4, "step", &step));
    const int rule = res->table()->config().optimizer.rule;
    const bool positive = RuleNeedsPositiveLearningRate(rule);
    OP_REQUIRES(ctx, std::isfinite(lr) && (positive ? lr > 0.0f : lr >= 0.0f),
                tf::errors::InvalidArgument(
                    "learning_rate must be finite and ",
                    positive ? "> 0" : ">= 0", " for ", RuleName(rule),
                    ", got ", lr));
    OP_REQUIRES(ctx, step >= 0,
                tf::errors::InvalidArgument("step must be >= 0, got ", step));
    const float* counts[2] = {nullptr, nullptr};
    const char* names[2] = {"shows", "clicks"};
    for (int k = 0; k < 2; ++k) {
      const tf::Tensor& t = ctx->input(5 + k);
      OP_REQUIRES(ctx,
                  tf::TensorShapeUtils::IsVector(t.shape()) &&
                      (t.dim_size(0) == 0 || t.dim_size(0) == n),
                  tf::errors::InvalidArgument(
                      names[k], " must be empty or have shape [", n,
                      "], got ", t.shape().DebugString()));
      if (t.dim_size(0) == 0) continue;
      const float* p = t.flat<float>().data();
      for (int64_t i = 0; i < n; ++i) {
        OP_REQUIRES(ctx, std::isfinite(p[i]) && p[i] >= 0.0f,
                    tf::errors::InvalidArgument(
                        names[k], " must be finite and >= 0; element ", i,
                        " is ", p[i]));
      }
      counts[k] = p;
    }
    int64_t batch_size = 0;
    OP_REQUIRES_OK(ctx, BatchSizeInput(ctx, 7, &batch_size));
    if (n == 0) return;
    const float* g = grads.flat<float>().data();
    OP_REQUIRES_OK(ctx, CheckFinite(g, n * dim_, "grads"));
    const bool ok = res->table()->Push(keys.flat<int64_t>().data(), n, g, lr,
                                       step, counts[0], counts[1],
                                       MakeRunner(ctx), unique_keys_,
                                       StartScale(res->table()->config().optimizer,
                                                  batch_size));
    if (!ok) {
      ctx->SetStatus(TableFailure(res->table(), "inserting rows"));
      return;
    }
  }

 private:
  int64_t dim_;
  bool unique_keys_ = false;
};

REGISTER_KERNEL_BUILDER(Name("SparseTablePull").Device(tf::DEVICE_CPU),
                        SparseTablePullOp);
REGISTER_KERNEL_BUILDER(Name("SparseTablePush").Device(tf::DEVICE_CPU),
                        SparseTablePushOp);
// The V2 ops add `batch_size` (the last input), read by the same kernels.
REGISTER_KERNEL_BUILDER(Name("SparseTablePullV2").Device(tf::DEVICE_CPU),
                        SparseTablePullOp);
REGISTER_KERNEL_BUILDER(Name("SparseTablePushV2").Device(tf::DEVICE_CPU),
                        SparseTablePushOp);

}  // namespace tnet
