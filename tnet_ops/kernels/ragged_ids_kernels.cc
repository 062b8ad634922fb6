// TnetRowIds and TnetCompactIds: ragged, sparse and padded id columns
// turned into flat values and their example rows.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tnet {

namespace tf = ::tensorflow;

// A ragged column's example rows from its row_splits in one pass (the
// stock value_rowids() builds a [rows, longest row] mask, then compacts it).
template <typename T>
class TnetRowIdsOp : public tf::OpKernel {
 public:
  using tf::OpKernel::OpKernel;

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& splits_t = ctx->input(0);
    OP_REQUIRES(ctx,
                tf::TensorShapeUtils::IsVector(splits_t.shape()) &&
                    splits_t.dim_size(0) >= 1,
                tf::errors::InvalidArgument(
                    "row_splits must be a non-empty vector, got shape ",
                    splits_t.shape().DebugString()));
    const T* s = splits_t.flat<T>().data();
    const int64_t rows = splits_t.dim_size(0) - 1;
    OP_REQUIRES(ctx, s[0] == 0,
                tf::errors::InvalidArgument("row_splits[0] must be 0, got ",
                                            static_cast<int64_t>(s[0])));
    for (int64_t r = 0; r < rows; ++r) {
      OP_REQUIRES(ctx, s[r + 1] >= s[r],
                  tf::errors::InvalidArgument(
                      "row_splits must not decrease; row_splits[", r + 1,
                      "] = ", static_cast<int64_t>(s[r + 1]),
                      " < row_splits[", r, "] = ", static_cast<int64_t>(s[r])));
    }
    const int64_t total = static_cast<int64_t>(s[rows]);
    OP_REQUIRES(ctx, total <= std::numeric_limits<int32_t>::max(),
                tf::errors::InvalidArgument(
                    "row_splits[-1] = ", total,
                    " values: at most 2^31 - 1 per batch; split the batch"));
    tf::Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(0, tf::TensorShape({total}), &out_t));
    int64_t* out = out_t->flat<int64_t>().data();
    for (int64_t r = 0; r < rows; ++r) {
      std::fill(out + static_cast<int64_t>(s[r]),
                out + static_cast<int64_t>(s[r + 1]), r);
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("TnetRowIds")
                            .Device(tf::DEVICE_CPU)
                            .TypeConstraint<int32_t>("Tsplits"),
                        TnetRowIdsOp<int32_t>);
REGISTER_KERNEL_BUILDER(Name("TnetRowIds")
                            .Device(tf::DEVICE_CPU)
                            .TypeConstraint<int64_t>("Tsplits"),
                        TnetRowIdsOp<int64_t>);

// A padded [B, L] id block without its padding (-1 / ""): the values in
// row-major order and the row of each, i.e. a ragged column's flat values
// and row ids, so a padded column takes the ragged path (its padding is
// never keyed, deduplicated, listed or combined).
template <typename T>
bool IsPadding(const T& v) { return v == T(-1); }
template <>
bool IsPadding<tf::tstring>(const tf::tstring& v) { return v.empty(); }

template <typename T>
class TnetCompactIdsOp : public tf::OpKernel {
 public:
  using tf::OpKernel::OpKernel;

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& ids_t = ctx->input(0);
    OP_REQUIRES(ctx, tf::TensorShapeUtils::IsMatrix(ids_t.shape()),
                tf::errors::InvalidArgument(
                    "ids must be a [batch, ids] matrix, got shape ",
                    ids_t.shape().DebugString()));
    const int64_t rows = ids_t.dim_size(0);
    const int64_t width = ids_t.dim_size(1);
    const T* ids = ids_t.flat<T>().data();
    const int64_t total = rows * width;
    int64_t n = 0;
    for (int64_t k = 0; k < total; ++k) n += !IsPadding(ids[k]);
    tf::Tensor* values_t = nullptr;
    tf::Tensor* rows_t = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(0, tf::TensorShape({n}), &values_t));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(1, tf::TensorShape({n}), &rows_t));
    T* values = values_t->flat<T>().data();
    int64_t* row_ids = rows_t->flat<int64_t>().data();
    int64_t out = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = ids + r * width;
      for (int64_t j = 0; j < width; ++j) {
        if (IsPadding(row[j])) continue;
        values[out] = row[j];
        row_ids[out] = r;
        ++out;
      }
    }
  }
};

#define TNET_REGISTER_COMPACT(T)                                          \
  REGISTER_KERNEL_BUILDER(                                                \
      Name("TnetCompactIds").Device(tf::DEVICE_CPU).TypeConstraint<T>("T"), \
      TnetCompactIdsOp<T>);
TNET_REGISTER_COMPACT(int32_t)
TNET_REGISTER_COMPACT(int64_t)
TNET_REGISTER_COMPACT(tf::tstring)
#undef TNET_REGISTER_COMPACT

}  // namespace tnet
