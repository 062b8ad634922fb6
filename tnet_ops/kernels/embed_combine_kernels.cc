// TnetEmbedCombine and TnetEmbedCombineGrad: the worker side of a lookup
// without the stock chain around the temporary matrix E.
//
// TnetEmbedCombine reads E[U, dim] through idx[B, W] (one row of C columns
// side by side, column c `widths[c]` wide, -1 = padding) and writes each
// column's sum / mean / sqrtn straight into its slot of the [B, C * dim]
// output: no gathered [B, W, dim] copy, no zero row appended to E, no
// split / unstack / concat. Its gradient (TnetEmbedCombineGrad) is dE
// [U, dim] itself, already summed per unique key, which is what the push
// sends: the IndexedSlices of a gather and the sum over them disappear.
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
#include "tnet_ops/kernels/table_resource.h"
#include "tnet_ops/kernels/row_math.h"

namespace tnet {

namespace tf = ::tensorflow;

namespace {

// Validated view of (idx [B, W], widths [C], combiners [C]).
struct Layout {
  int64_t batch = 0;
  int64_t width = 0;
  int64_t columns = 0;
  std::vector<int64_t> start;  // column c spans [start[c], start[c + 1])
  const int32_t* idx = nullptr;
  const int32_t* combiners = nullptr;
};

tf::Status ReadLayout(tf::OpKernelContext* ctx, int idx_input, int64_t rows,
                      Layout* out) {
  const tf::Tensor& idx = ctx->input(idx_input);
  const tf::Tensor& widths = ctx->input(idx_input + 1);
  const tf::Tensor& combiners = ctx->input(idx_input + 2);
  if (!tf::TensorShapeUtils::IsMatrix(idx.shape())) {
    return tf::errors::InvalidArgument("idx must be [batch, width], got ",
                                       idx.shape().DebugString());
  }
  if (!tf::TensorShapeUtils::IsVector(widths.shape()) ||
      widths.dim_size(0) == 0 ||
      !tf::TensorShapeUtils::IsVector(combiners.shape()) ||
      combiners.dim_size(0) != widths.dim_size(0)) {
    return tf::errors::InvalidArgument(
        "widths and combiners must be non-empty vectors of one length (one "
        "entry per column), got ", widths.shape().DebugString(), " and ",
        combiners.shape().DebugString());
  }
  out->batch = idx.dim_size(0);
  out->width = idx.dim_size(1);
  out->columns = widths.dim_size(0);
  out->start.assign(out->columns + 1, 0);
  const int32_t* w = widths.flat<int32_t>().data();
  const int32_t* comb = combiners.flat<int32_t>().data();
  for (int64_t c = 0; c < out->columns; ++c) {
    if (w[c] < 0) {
      return tf::errors::InvalidArgument("widths[", c, "] = ", w[c],
                                         " is negative");
    }
    if (comb[c] < kSum || comb[c] > kSqrtn) {
      return tf::errors::InvalidArgument(
          "combiners[", c, "] = ", comb[c],
          " is not 0 (sum), 1 (mean) or 2 (sqrtn)");
    }
    out->start[c + 1] = out->start[c] + w[c];
  }
  if (out->start[out->columns] != out->width) {
    return tf::errors::InvalidArgument(
        "widths sum to ", out->start[out->columns], " but idx has ",
        out->width, " columns");
  }
  out->idx = idx.flat<int32_t>().data();
  out->combiners = comb;
  const int64_t total = out->batch * out->width;
  if (total > std::numeric_limits<int32_t>::max() / 2) {
    return tf::errors::InvalidArgument(
        "at most 2^30 - 1 ids per call, got ", total, ": split the batch");
  }
  // One branch-free pass (it vectorizes) split over the threads; the
  // slow scan for the first bad entry only runs when there is one.
  const uint64_t ids = static_cast<uint64_t>(rows) + 1;
  const int64_t parts = std::max<int64_t>(
      1, std::min<int64_t>(
             ctx->device()->tensorflow_cpu_worker_threads()->num_threads,
             total / 262144));
  std::vector<char> bad(parts, 0);
  RunChunks(ctx, parts, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      bool b = false;
      const int64_t e = total * (p + 1) / parts;
      for (int64_t i = total * p / parts; i < e; ++i) {
        b |= static_cast<uint64_t>(int64_t{out->idx[i]} + 1) >= ids;
      }
      bad[p] = b;
    }
  });
  if (std::find(bad.begin(), bad.end(), 1) == bad.end()) {
    return tf::OkStatus();
  }
  for (int64_t i = 0; i < total; ++i) {
    const int32_t r = out->idx[i];
    if (r < -1 || r >= rows) {
      return tf::errors::InvalidArgument(
          "idx (flat) [", i, "] = ", r, " is not in [-1, ", rows,
          "): an index into the rows, or -1 for padding");
    }
  }
  return tf::errors::Internal("no bad idx found");
}

}  // namespace

class TnetEmbedCombineOp : public tf::OpKernel {
 public:
  using tf::OpKernel::OpKernel;

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& rows_t = ctx->input(0);
    OP_REQUIRES(ctx, tf::TensorShapeUtils::IsMatrix(rows_t.shape()),
                tf::errors::InvalidArgument("rows must be [U, dim], got ",
                                            rows_t.shape().DebugString()));
    Layout lay;
    OP_REQUIRES_OK(ctx, ReadLayout(ctx, 1, rows_t.dim_size(0), &lay));
    const int64_t dim = rows_t.dim_size(1);
    tf::TensorShape shape;
    OP_REQUIRES(ctx,
                tf::TensorShape::BuildTensorShape(
                    {lay.batch, lay.columns * dim}, &shape).ok() &&
                    lay.columns <= (int64_t{1} << 40) / std::max<int64_t>(dim, 1),
                tf::errors::InvalidArgument("output [", lay.batch, ", ",
                                            lay.columns, " * ", dim,
                                            "] is too large"));
    tf::Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out_t));
    if (lay.batch == 0 || dim == 0) return;
    const float* rows = rows_t.flat<float>().data();
    float* out = out_t->flat<float>().data();
    ForRowWidth(dim, [&](auto kDim) {
      constexpr int D = decltype(kDim)::value;
      auto work = [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const int32_t* ib = lay.idx + b * lay.width;
          if (b + 1 < b1) {  // the next example's rows, while this one adds
            for (int64_t j = 0; j < lay.width; ++j) {
              const int32_t r = ib[lay.width + j];
              if (r >= 0) __builtin_prefetch(rows + static_cast<int64_t>(r) * dim);
            }
          }
          for (int64_t c = 0; c < lay.columns; ++c) {
            float* dst = out + (b * lay.columns + c) * dim;
            // At the compiled widths the sum is kept in registers and
            // stored once (a memset call per column and example cost more
            // than a narrow row's adds); other widths add into dst.
            float acc[D > 0 ? D : 1] = {};
            float* sum = D > 0 ? acc : dst;
            const int64_t w = D > 0 ? D : dim;
            if (D == 0) std::memset(dst, 0, sizeof(float) * dim);
            int64_t count = 0;
            for (int64_t j = lay.start[c]; j < lay.start[c + 1]; ++j) {
              const int32_t r = ib[j];
              if (r < 0) continue;
              ++count;
              Axpy<D>(sum, rows + static_cast<int64_t>(r) * w, 1.0f, w);
            }
            const float s = Scale(lay.combiners[c], count);
            if (s != 1.0f) ScaleRow<D>(sum, s, w);
            if (D > 0) std::memcpy(dst, acc, sizeof(float) * w);
          }
        }
      };
      MakeRunner(ctx)(lay.batch, (lay.width + lay.columns) * (dim + 4), work);
    });
  }
};

class TnetEmbedCombineGradOp : public tf::OpKernel {
 public:
  using tf::OpKernel::OpKernel;

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& grad_t = ctx->input(0);
    int64_t num_rows = 0;
    OP_REQUIRES_OK(ctx, ScalarInput<int64_t>(ctx, 4, "num_rows", &num_rows));
    OP_REQUIRES(ctx, num_rows >= 0 && num_rows <= (int64_t{1} << 31),
                tf::errors::InvalidArgument("num_rows must be in [0, 2^31], "
                                            "got ", num_rows));
    OP_REQUIRES(ctx, tf::TensorShapeUtils::IsMatrix(grad_t.shape()),
                tf::errors::InvalidArgument("grad must be [batch, C * dim], "
                                            "got ",
                                            grad_t.shape().DebugString()));
    Layout lay;
    OP_REQUIRES_OK(ctx, ReadLayout(ctx, 1, num_rows, &lay));
    OP_REQUIRES(ctx,
                grad_t.dim_size(0) == lay.batch &&
                    grad_t.dim_size(1) % lay.columns == 0,
                tf::errors::InvalidArgument(
                    "grad must be [", lay.batch, ", ", lay.columns,
                    " * dim], got ", grad_t.shape().DebugString()));
    const int64_t dim = grad_t.dim_size(1) / lay.columns;
    tf::TensorShape shape;
    OP_REQUIRES(ctx, tf::TensorShape::BuildTensorShape({num_rows, dim},
                                                       &shape).ok(),
                tf::errors::InvalidArgument("num_rows * dim overflows"));
    tf::Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out_t));
    float* out = out_t->flat<float>().data();
    std::memset(out, 0, sizeof(float) * num_rows * dim);
    if (lay.batch == 0 || dim == 0 || num_rows == 0) return;
    const float* grad = grad_t.flat<float>().data();
    // Each part owns a range of output rows, so no two threads add into one
    // row (deterministic sums, no atomics, the same on any number of parts):
    // it lists the ids it owns without a branch (the rows are random: a test
    // per id mispredicts half the time), then adds them in id order,
    // fetching rows ahead. Factors other than 1 (a mean or sqrtn over more
    // than one id) are computed first, per example and column.
    const int64_t groups = lay.batch * lay.columns;
    std::vector<float> scale;
    bool scaled = false;
    for (int64_t c = 0; c < lay.columns; ++c) {
      scaled |= lay.combiners[c] != kSum && lay.start[c + 1] - lay.start[c] > 1;
    }
    if (scaled) {
      scale.resize(groups);
      MakeRunner(ctx)(lay.batch, lay.width + lay.columns,
                      [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const int32_t* ib = lay.idx + b * lay.width;
          for (int64_t c = 0; c < lay.columns; ++c) {
            int64_t count = 0;
            for (int64_t j = lay.start[c]; j < lay.start[c + 1]; ++j) {
              count += ib[j] >= 0;
            }
            scale[b * lay.columns + c] = Scale(lay.combiners[c], count);
          }
        }
      });
    }
    const float* sc = scaled ? scale.data() : nullptr;
    // Narrow rows (a linear part's dim-1 weights): one part, as
    // NarrowParts says for the segment kernels.
    const int64_t parts = dim < 4 ? std::min<int64_t>(1, num_rows)
                                  : Parts(ctx, lay.batch * lay.width, num_rows);
    std::vector<int32_t> column_of(lay.width);  // a slot's column
    for (int64_t c = 0; c < lay.columns; ++c) {
      for (int64_t j = lay.start[c]; j < lay.start[c + 1]; ++j) {
        column_of[j] = static_cast<int32_t>(c);
      }
    }
    ForRowWidth(dim, [&](auto kDim) {
    constexpr int D = decltype(kDim)::value;
    RunChunks(ctx, parts, [&](int64_t p0, int64_t p1) {
      // The slots (b * W + j) whose row this part owns, listed in one flat
      // pass without a branch; the example and column of a slot are found
      // again while adding (the slots come in increasing order).
      int32_t* const mine = EntryList(lay.batch * lay.width);
      const int64_t total = lay.batch * lay.width;
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t lo = num_rows * p / parts;
        const uint32_t span =
            static_cast<uint32_t>(num_rows * (p + 1) / parts - lo);
        int64_t n = 0;
        for (int64_t k = 0; k < total; ++k) {
          mine[n] = static_cast<int32_t>(k);
          n += static_cast<uint32_t>(lay.idx[k] - lo) < span;
        }
        int64_t b = 0;
        int64_t first = 0;  // example b's first slot
        for (int64_t t = 0; t < n; ++t) {
          if (t + kAhead < n) {
            __builtin_prefetch(
                out + static_cast<int64_t>(lay.idx[mine[t + kAhead]]) * dim, 1);
          }
          const int64_t k = mine[t];
          while (k >= first + lay.width) {
            ++b;
            first += lay.width;
          }
          const int64_t g = b * lay.columns + column_of[k - first];
          Axpy<D>(out + static_cast<int64_t>(lay.idx[k]) * dim,
                  grad + g * dim, sc != nullptr ? sc[g] : 1.0f, dim);
        }
      }
    });
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("TnetEmbedCombine").Device(tf::DEVICE_CPU),
                        TnetEmbedCombineOp);
REGISTER_KERNEL_BUILDER(Name("TnetEmbedCombineGrad").Device(tf::DEVICE_CPU),
                        TnetEmbedCombineGradOp);

}  // namespace tnet
