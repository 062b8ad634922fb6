// SparseTableExport (a cursor over live rows) and SparseTableImport.
#include <cmath>
#include <cstring>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tnet_ops/kernels/table_resource.h"

namespace tnet {

namespace tf = ::tensorflow;

// SparseTableExport (every row) and SparseTableExportSince (rows whose
// last_step > since_step, input 3) share this kernel.
class SparseTableExportOp : public tf::OpKernel {
 public:
  explicit SparseTableExportOp(tf::OpKernelConstruction* ctx)
      : tf::OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, GetDimAttr(ctx, &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("weights_only", &weights_only_));
    has_since_ = ctx->num_inputs() == 4;
  }

  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, dim_, &res));
    int64_t cursor = 0, max_rows = 0;
    OP_REQUIRES_OK(ctx, ScalarInput<int64_t>(ctx, 1, "cursor", &cursor));
    OP_REQUIRES_OK(ctx, ScalarInput<int64_t>(ctx, 2, "max_rows", &max_rows));
    OP_REQUIRES(ctx, max_rows >= 0,
                tf::errors::InvalidArgument("max_rows must be >= 0, got ",
                                            max_rows));
    int64_t since_step = -1;
    if (has_since_) {
      OP_REQUIRES_OK(ctx,
                     ScalarInput<int64_t>(ctx, 3, "since_step", &since_step));
      OP_REQUIRES(ctx, since_step >= -1,
                  tf::errors::InvalidArgument(
                      "since_step must be >= -1 (-1: every row), got ",
                      since_step));
    }
    TableShard* table = res->table();
    OP_REQUIRES(ctx, table->ValidCursor(cursor),
                tf::errors::InvalidArgument(
                    "cursor ", cursor, " is not one this table returned; "
                    "start an export with cursor 0"));
    std::vector<int64_t> keys;
    std::vector<float> weights, slots;
    std::vector<RowMeta> meta;
    const int64_t reserve = std::min<int64_t>(max_rows, table->Size());
    keys.reserve(reserve);
    weights.reserve(reserve * dim_);
    if (!weights_only_) {
      slots.reserve(reserve * table->num_slots());
      meta.reserve(reserve);
    }
    const int64_t next = table->Export(
        cursor, max_rows, since_step, &keys, &weights,
        weights_only_ ? nullptr : &slots, weights_only_ ? nullptr : &meta);
    if (next == -2) {
      ctx->SetStatus(TableFailure(table, "exporting rows"));
      return;
    }
    const int64_t n = static_cast<int64_t>(keys.size());
    const int64_t s = weights_only_ ? 0 : table->num_slots();
    tf::Tensor *k_out, *w_out, *s_out, *m_out, *c_out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {n}, &k_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, {n, dim_}, &w_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, {n, s}, &s_out));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(3, {n, weights_only_ ? 0 : 3}, &m_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, {}, &c_out));
    if (n > 0) {
      std::memcpy(k_out->flat<int64_t>().data(), keys.data(), n * 8);
      std::memcpy(w_out->flat<float>().data(), weights.data(),
                  weights.size() * 4);
      if (s > 0) {
        std::memcpy(s_out->flat<float>().data(), slots.data(), slots.size() * 4);
      }
      double* m = m_out->flat<double>().data();
      for (int64_t i = 0; i < static_cast<int64_t>(meta.size()); ++i) {
        m[3 * i] = meta[i].show;
        m[3 * i + 1] = meta[i].click;
        m[3 * i + 2] = static_cast<double>(meta[i].last_step);
      }
    }
    c_out->scalar<int64_t>()() = next;
  }

 private:
  int64_t dim_;
  bool weights_only_ = false;
  bool has_since_ = false;
};

class SparseTableImportOp : public tf::OpKernel {
 public:
  explicit SparseTableImportOp(tf::OpKernelConstruction* ctx)
      : tf::OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, GetDimAttr(ctx, &dim_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, dim_, &res));
    TableShard* table = res->table();
    const tf::Tensor& keys = ctx->input(1);
    const tf::Tensor& weights = ctx->input(2);
    const tf::Tensor& slots = ctx->input(3);
    const tf::Tensor& meta = ctx->input(4);
    OP_REQUIRES(ctx, tf::TensorShapeUtils::IsVector(keys.shape()),
                tf::errors::InvalidArgument("keys must be 1-D, got shape ",
                                            keys.shape().DebugString()));
    const int64_t n = keys.dim_size(0);
    const int64_t s = table->num_slots();
    const struct {
      const tf::Tensor& t;
      int64_t cols;
      const char* name;
    } parts[3] = {{weights, dim_, "weights"},
                  {slots, s, "slots"},
                  {meta, 3, "meta"}};
    for (const auto& p : parts) {
      OP_REQUIRES(ctx,
                  tf::TensorShapeUtils::IsMatrix(p.t.shape()) &&
                      p.t.dim_size(0) == n && p.t.dim_size(1) == p.cols,
                  tf::errors::InvalidArgument(
                      p.name, " must have shape [", n, ", ", p.cols,
                      "] for this table, got ", p.t.shape().DebugString()));
    }
    if (n == 0) return;
    // Weights and slots are taken as they are, inf and NaN included: Import
    // is the inverse of Export, and a finite push can overflow a weight (an
    // lr of 3e38 does), so refusing them would make such a checkpoint
    // unrestorable. Pushes still refuse non-finite gradients.
    const double* m = meta.flat<double>().data();
    std::vector<RowMeta> rows(n);
    for (int64_t i = 0; i < n; ++i) {
      const double show = m[3 * i], click = m[3 * i + 1], step = m[3 * i + 2];
      OP_REQUIRES(ctx,
                  std::isfinite(show) && std::isfinite(click) && show >= 0 &&
                      click >= 0 && step >= 0 && step < 9007199254740992.0 &&
                      step == std::floor(step),
                  tf::errors::InvalidArgument(
                      "meta row ", i, " must be (show >= 0, click >= 0, "
                      "integral last_step >= 0), got (", show, ", ", click,
                      ", ", step, ")"));
      rows[i].last_step = static_cast<int64_t>(step);
      rows[i].show = static_cast<float>(show);
      rows[i].click = static_cast<float>(click);
    }
    const bool ok = table->Import(keys.flat<int64_t>().data(), n,
                                  weights.flat<float>().data(),
                                  slots.flat<float>().data(), rows.data(),
                                  MakeRunner(ctx));
    if (!ok) {
      ctx->SetStatus(TableFailure(table, "importing rows"));
      return;
    }
  }

 private:
  int64_t dim_;
};

REGISTER_KERNEL_BUILDER(Name("SparseTableExport").Device(tf::DEVICE_CPU),
                        SparseTableExportOp);
REGISTER_KERNEL_BUILDER(Name("SparseTableExportSince").Device(tf::DEVICE_CPU),
                        SparseTableExportOp);
REGISTER_KERNEL_BUILDER(Name("SparseTableImport").Device(tf::DEVICE_CPU),
                        SparseTableImportOp);

}  // namespace tnet
