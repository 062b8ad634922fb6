// TnetUnique, TnetEmbedCombine and TnetEmbedCombineGrad: the worker side of
// a lookup without the stock chain around the temporary matrix E.
//
// TnetUnique replaces tf.unique + bincount (single-threaded, one pass each):
// keys are bucketed by the top bits of their Mix64 hash, every bucket is
// deduplicated in parallel, and a prefix sum over first occurrences numbers
// the unique keys in the order of their first occurrence, so the result is
// exactly tf.unique's whatever the thread count. Padding (valid = false)
// gets index -1 and is never counted.
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
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tnet_ops/kernels/table_resource.h"
#include "tnet_ops/table/hash.h"

namespace tnet {

namespace tf = ::tensorflow;

namespace {

constexpr int kBucketBits = 6;
constexpr int kBuckets = 1 << kBucketBits;
constexpr int64_t kBlock = 16384;

enum Combiner : int32_t { kSum = 0, kMean = 1, kSqrtn = 2 };

inline int64_t NumBlocks(int64_t n) {
  return std::max<int64_t>(1, (n + kBlock - 1) / kBlock);
}

}  // namespace

class TnetUniqueOp : public tf::OpKernel {
 public:
  using tf::OpKernel::OpKernel;

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& keys_t = ctx->input(0);
    const tf::Tensor& valid_t = ctx->input(1);
    OP_REQUIRES(ctx, tf::TensorShapeUtils::IsVector(keys_t.shape()),
                tf::errors::InvalidArgument("keys must be 1-D, got shape ",
                                            keys_t.shape().DebugString()));
    const int64_t n = keys_t.dim_size(0);
    OP_REQUIRES(ctx,
                tf::TensorShapeUtils::IsVector(valid_t.shape()) &&
                    (valid_t.dim_size(0) == 0 || valid_t.dim_size(0) == n),
                tf::errors::InvalidArgument(
                    "valid must be empty (every key valid) or have shape [",
                    n, "], got ", valid_t.shape().DebugString()));
    OP_REQUIRES(ctx, n <= std::numeric_limits<int32_t>::max(),
                tf::errors::InvalidArgument(
                    "TnetUnique takes at most 2^31 - 1 keys, got ", n,
                    "; split the batch"));
    const int64_t* keys = keys_t.flat<int64_t>().data();
    const bool* valid =
        valid_t.dim_size(0) == 0 ? nullptr : valid_t.flat<bool>().data();
    tf::Tensor* idx_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, tf::TensorShape({n}), &idx_t));
    int32_t* idx = idx_t->flat<int32_t>().data();
    const ParallelRunner run = MakeRunner(ctx);

    // 1. Bucket positions by hash, keeping batch order inside a bucket.
    const int64_t num_blocks = NumBlocks(n);
    std::vector<int64_t> pos(num_blocks * kBuckets, 0);
    std::vector<uint8_t> bucket_of(n);
    auto count = [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        int64_t* c = pos.data() + b * kBuckets;
        const int64_t end = std::min(n, (b + 1) * kBlock);
        for (int64_t i = b * kBlock; i < end; ++i) {
          if (valid != nullptr && !valid[i]) {
            idx[i] = -1;
            bucket_of[i] = 0;
            continue;
          }
          const uint8_t k = static_cast<uint8_t>(
              Mix64(static_cast<uint64_t>(keys[i])) >> (64 - kBucketBits));
          bucket_of[i] = k;
          ++c[k];
        }
      }
    };
    if (num_blocks > 1) run(num_blocks, kBlock * 10, count);
    else count(0, 1);
    std::vector<int64_t> off(kBuckets + 1, 0);
    int64_t total = 0;
    for (int k = 0; k < kBuckets; ++k) {
      off[k] = total;
      for (int64_t b = 0; b < num_blocks; ++b) {
        const int64_t c = pos[b * kBuckets + k];
        pos[b * kBuckets + k] = total;
        total += c;
      }
    }
    off[kBuckets] = total;
    struct Item {
      int64_t key;
      int64_t i;
    };
    std::vector<Item> items(total);
    auto scatter = [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        int64_t* p = pos.data() + b * kBuckets;
        const int64_t end = std::min(n, (b + 1) * kBlock);
        for (int64_t i = b * kBlock; i < end; ++i) {
          if (valid != nullptr && !valid[i]) continue;
          items[p[bucket_of[i]]++] = {keys[i], i};
        }
      }
    };
    if (num_blocks > 1) run(num_blocks, kBlock * 4, scatter);
    else scatter(0, 1);

    // 2. Deduplicate each bucket: each item's local group (in `local`, in
    // bucket order), each group's first position, first-occurrence flags.
    std::vector<uint8_t> first(n, 0);
    std::vector<int32_t> local(total);
    std::vector<std::vector<int32_t>> group_first(kBuckets);
    std::vector<std::vector<int32_t>> group_count(kBuckets);
    auto dedup = [&](int64_t k0, int64_t k1) {
      struct Slot {
        int64_t key;
        int32_t group;  // -1: empty
      };
      std::vector<Slot> slots;
      for (int64_t k = k0; k < k1; ++k) {
        const Item* it = items.data() + off[k];
        int32_t* loc = local.data() + off[k];
        const int64_t m = off[k + 1] - off[k];
        std::vector<int32_t>& gf = group_first[k];
        std::vector<int32_t>& gc = group_count[k];
        if (m == 0) continue;
        uint64_t cap = 8;
        while (cap < 2 * static_cast<uint64_t>(m)) cap *= 2;
        slots.assign(cap, Slot{0, -1});
        // The top bits chose the bucket; the low bits index the slots.
        for (int64_t j = 0; j < m; ++j) {
          const int64_t key = it[j].key;
          uint64_t s = Mix64(static_cast<uint64_t>(key)) & (cap - 1);
          while (slots[s].group >= 0 && slots[s].key != key) {
            s = (s + 1) & (cap - 1);
          }
          if (slots[s].group < 0) {
            slots[s] = {key, static_cast<int32_t>(gf.size())};
            gf.push_back(static_cast<int32_t>(it[j].i));
            gc.push_back(0);
            first[it[j].i] = 1;
          }
          loc[j] = slots[s].group;
          ++gc[slots[s].group];
        }
      }
    };
    run(kBuckets, std::max<int64_t>(1, total / kBuckets) * 40, dedup);

    // 3. Number the unique keys by first occurrence: a blocked prefix sum.
    std::vector<int64_t> block_base(num_blocks + 1, 0);
    auto count_first = [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t end = std::min(n, (b + 1) * kBlock);
        int64_t c = 0;
        for (int64_t i = b * kBlock; i < end; ++i) c += first[i];
        block_base[b + 1] = c;
      }
    };
    if (num_blocks > 1) run(num_blocks, kBlock, count_first);
    else count_first(0, 1);
    for (int64_t b = 0; b < num_blocks; ++b) block_base[b + 1] += block_base[b];
    const int64_t u = block_base[num_blocks];
    // rank[i] for first positions only (written into a side array).
    std::vector<int32_t> rank(n);
    auto rank_first = [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t end = std::min(n, (b + 1) * kBlock);
        int64_t r = block_base[b];
        for (int64_t i = b * kBlock; i < end; ++i) {
          if (first[i]) rank[i] = static_cast<int32_t>(r++);
        }
      }
    };
    if (num_blocks > 1) run(num_blocks, kBlock * 2, rank_first);
    else rank_first(0, 1);

    tf::Tensor* uniq_t = nullptr;
    tf::Tensor* counts_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({u}), &uniq_t));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(2, tf::TensorShape({u}), &counts_t));
    int64_t* uniq = uniq_t->flat<int64_t>().data();
    float* counts = counts_t->flat<float>().data();

    // 4. Local group -> global number, per bucket.
    auto finish = [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        std::vector<int32_t>& gf = group_first[k];
        const std::vector<int32_t>& gc = group_count[k];
        for (size_t g = 0; g < gf.size(); ++g) {
          const int32_t r = rank[gf[g]];
          uniq[r] = keys[gf[g]];
          counts[r] = static_cast<float>(gc[g]);
          gf[g] = r;  // reuse: local group -> global number
        }
        const Item* it = items.data() + off[k];
        const int32_t* loc = local.data() + off[k];
        const int64_t m = off[k + 1] - off[k];
        for (int64_t j = 0; j < m; ++j) idx[it[j].i] = gf[loc[j]];
      }
    };
    run(kBuckets, std::max<int64_t>(1, total / kBuckets) * 10, finish);
  }
};

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
  for (int64_t i = 0; i < total; ++i) {
    const int32_t r = out->idx[i];
    if (r < -1 || r >= rows) {
      return tf::errors::InvalidArgument(
          "idx (flat) [", i, "] = ", r, " is not in [-1, ", rows,
          "): an index into the rows, or -1 for padding");
    }
  }
  return tf::OkStatus();
}

// How many parts (threads) a scatter over `work` entries is split into,
// each owning a range of output rows; at most `limit`.
int64_t Parts(tf::OpKernelContext* ctx, int64_t work, int64_t limit) {
  const int64_t threads =
      ctx->device()->tensorflow_cpu_worker_threads()->num_threads;
  return std::min<int64_t>(
      limit, std::max<int64_t>(1, std::min<int64_t>(threads, work / 32768)));
}

// The factor a column's sum is multiplied by, given its valid ids.
inline float Scale(int32_t combiner, int64_t count) {
  if (count == 0 || combiner == kSum) return 1.0f;
  if (combiner == kMean) return 1.0f / static_cast<float>(count);
  return 1.0f / std::sqrt(static_cast<float>(count));
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
    auto work = [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int32_t* ib = lay.idx + b * lay.width;
        for (int64_t c = 0; c < lay.columns; ++c) {
          float* dst = out + (b * lay.columns + c) * dim;
          std::memset(dst, 0, sizeof(float) * dim);
          int64_t count = 0;
          for (int64_t j = lay.start[c]; j < lay.start[c + 1]; ++j) {
            const int32_t r = ib[j];
            if (r < 0) continue;
            ++count;
            const float* src = rows + static_cast<int64_t>(r) * dim;
            for (int64_t d = 0; d < dim; ++d) dst[d] += src[d];
          }
          const float s = Scale(lay.combiners[c], count);
          if (s != 1.0f) {
            for (int64_t d = 0; d < dim; ++d) dst[d] *= s;
          }
        }
      }
    };
    MakeRunner(ctx)(lay.batch, (lay.width + lay.columns) * (dim + 4), work);
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
    // Each part owns a range of output rows and scans every id, so no two
    // threads add into one row (deterministic sums, no atomics).
    const int64_t parts = Parts(ctx, lay.batch * lay.width, num_rows);
    auto work = [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t lo = num_rows * p / parts;
        const int64_t hi = num_rows * (p + 1) / parts;
        for (int64_t b = 0; b < lay.batch; ++b) {
          const int32_t* ib = lay.idx + b * lay.width;
          for (int64_t c = 0; c < lay.columns; ++c) {
            const int64_t j0 = lay.start[c], j1 = lay.start[c + 1];
            int64_t count = 0;
            bool mine = false;
            for (int64_t j = j0; j < j1; ++j) {
              count += ib[j] >= 0;
              mine |= ib[j] >= lo && ib[j] < hi;
            }
            if (!mine) continue;
            const float s = Scale(lay.combiners[c], count);
            const float* g = grad + (b * lay.columns + c) * dim;
            for (int64_t j = j0; j < j1; ++j) {
              const int32_t r = ib[j];
              if (r < lo || r >= hi) continue;
              float* dst = out + static_cast<int64_t>(r) * dim;
              for (int64_t d = 0; d < dim; ++d) dst[d] += s * g[d];
            }
          }
        }
      }
    };
    MakeRunner(ctx)(parts, lay.batch * (lay.width * 4 + dim * 2), work);
  }
};

REGISTER_KERNEL_BUILDER(Name("TnetUnique").Device(tf::DEVICE_CPU),
                        TnetUniqueOp);
REGISTER_KERNEL_BUILDER(Name("TnetEmbedCombine").Device(tf::DEVICE_CPU),
                        TnetEmbedCombineOp);
REGISTER_KERNEL_BUILDER(Name("TnetEmbedCombineGrad").Device(tf::DEVICE_CPU),
                        TnetEmbedCombineGradOp);

// Ragged and sparse ids: entry k reads rows[idx[k]] into segment
// segments[k] (any order); segment s is combined with combiners[s % C].
// A layer numbers segments example * C + column, so the [B * C, dim]
// output is its [B, C * dim] block with no copy.
namespace {

struct Segments {
  int64_t entries = 0;
  int64_t num_segments = 0;
  int64_t columns = 0;
  const int32_t* idx = nullptr;
  const int64_t* seg = nullptr;
  const int32_t* combiners = nullptr;
};

tf::Status ReadSegments(tf::OpKernelContext* ctx, int first, int64_t rows,
                        Segments* out) {
  const tf::Tensor& idx = ctx->input(first);
  const tf::Tensor& seg = ctx->input(first + 1);
  const tf::Tensor& combiners = ctx->input(first + 3);
  TF_RETURN_IF_ERROR(
      ScalarInput<int64_t>(ctx, first + 2, "num_segments", &out->num_segments));
  if (!tf::TensorShapeUtils::IsVector(idx.shape()) ||
      !tf::TensorShapeUtils::IsVector(seg.shape()) ||
      idx.dim_size(0) != seg.dim_size(0)) {
    return tf::errors::InvalidArgument(
        "idx and segments must be vectors of one length, got ",
        idx.shape().DebugString(), " and ", seg.shape().DebugString());
  }
  if (!tf::TensorShapeUtils::IsVector(combiners.shape()) ||
      combiners.dim_size(0) == 0) {
    return tf::errors::InvalidArgument(
        "combiners must be a non-empty vector (one per column), got ",
        combiners.shape().DebugString());
  }
  out->columns = combiners.dim_size(0);
  if (out->num_segments < 0 || out->num_segments % out->columns != 0) {
    return tf::errors::InvalidArgument(
        "num_segments must be >= 0 and a multiple of the ", out->columns,
        " columns, got ", out->num_segments);
  }
  out->entries = idx.dim_size(0);
  out->idx = idx.flat<int32_t>().data();
  out->seg = seg.flat<int64_t>().data();
  out->combiners = combiners.flat<int32_t>().data();
  for (int64_t c = 0; c < out->columns; ++c) {
    if (out->combiners[c] < kSum || out->combiners[c] > kSqrtn) {
      return tf::errors::InvalidArgument(
          "combiners[", c, "] = ", out->combiners[c],
          " is not 0 (sum), 1 (mean) or 2 (sqrtn)");
    }
  }
  for (int64_t k = 0; k < out->entries; ++k) {
    if (out->idx[k] < -1 || out->idx[k] >= rows) {
      return tf::errors::InvalidArgument("idx[", k, "] = ", out->idx[k],
                                         " is not in [-1, ", rows, ")");
    }
    if (out->seg[k] < 0 || out->seg[k] >= out->num_segments) {
      return tf::errors::InvalidArgument("segments[", k, "] = ", out->seg[k],
                                         " is not in [0, ", out->num_segments,
                                         ")");
    }
  }
  return tf::OkStatus();
}

// Per segment, the factor its sum is multiplied by.
std::vector<float> SegmentScales(const Segments& sg) {
  std::vector<int32_t> counts(sg.num_segments, 0);
  for (int64_t k = 0; k < sg.entries; ++k) counts[sg.seg[k]] += sg.idx[k] >= 0;
  std::vector<float> scale(sg.num_segments);
  for (int64_t s = 0; s < sg.num_segments; ++s) {
    scale[s] = Scale(sg.combiners[s % sg.columns], counts[s]);
  }
  return scale;
}

}  // namespace

class TnetSegmentCombineOp : public tf::OpKernel {
 public:
  using tf::OpKernel::OpKernel;

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& rows_t = ctx->input(0);
    OP_REQUIRES(ctx, tf::TensorShapeUtils::IsMatrix(rows_t.shape()),
                tf::errors::InvalidArgument("rows must be [U, dim], got ",
                                            rows_t.shape().DebugString()));
    Segments sg;
    OP_REQUIRES_OK(ctx, ReadSegments(ctx, 1, rows_t.dim_size(0), &sg));
    const int64_t dim = rows_t.dim_size(1);
    tf::TensorShape shape;
    OP_REQUIRES(ctx, tf::TensorShape::BuildTensorShape({sg.num_segments, dim},
                                                       &shape).ok(),
                tf::errors::InvalidArgument("num_segments * dim overflows"));
    tf::Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out_t));
    float* out = out_t->flat<float>().data();
    std::memset(out, 0, sizeof(float) * sg.num_segments * dim);
    if (sg.num_segments == 0 || dim == 0) return;
    const std::vector<float> scale = SegmentScales(sg);
    const float* rows = rows_t.flat<float>().data();
    const int64_t parts =
        Parts(ctx, sg.entries * dim, sg.num_segments);
    // Each part owns a range of segments: no two threads add into one row.
    MakeRunner(ctx)(parts, sg.entries * (dim + 4), [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t lo = sg.num_segments * p / parts;
        const int64_t hi = sg.num_segments * (p + 1) / parts;
        for (int64_t k = 0; k < sg.entries; ++k) {
          const int64_t s = sg.seg[k];
          if (s < lo || s >= hi || sg.idx[k] < 0) continue;
          const float* src = rows + static_cast<int64_t>(sg.idx[k]) * dim;
          float* dst = out + s * dim;
          const float f = scale[s];
          for (int64_t d = 0; d < dim; ++d) dst[d] += f * src[d];
        }
      }
    });
  }
};

class TnetSegmentCombineGradOp : public tf::OpKernel {
 public:
  using tf::OpKernel::OpKernel;

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& grad_t = ctx->input(0);
    int64_t num_rows = 0;
    OP_REQUIRES_OK(ctx, ScalarInput<int64_t>(ctx, 5, "num_rows", &num_rows));
    OP_REQUIRES(ctx, num_rows >= 0 && num_rows <= (int64_t{1} << 31),
                tf::errors::InvalidArgument("num_rows must be in [0, 2^31], "
                                            "got ", num_rows));
    Segments sg;
    OP_REQUIRES_OK(ctx, ReadSegments(ctx, 1, num_rows, &sg));
    OP_REQUIRES(ctx,
                tf::TensorShapeUtils::IsMatrix(grad_t.shape()) &&
                    grad_t.dim_size(0) == sg.num_segments,
                tf::errors::InvalidArgument(
                    "grad must be [", sg.num_segments, ", dim], got ",
                    grad_t.shape().DebugString()));
    const int64_t dim = grad_t.dim_size(1);
    tf::TensorShape shape;
    OP_REQUIRES(ctx, tf::TensorShape::BuildTensorShape({num_rows, dim},
                                                       &shape).ok(),
                tf::errors::InvalidArgument("num_rows * dim overflows"));
    tf::Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out_t));
    float* out = out_t->flat<float>().data();
    std::memset(out, 0, sizeof(float) * num_rows * dim);
    if (num_rows == 0 || dim == 0 || sg.entries == 0) return;
    const std::vector<float> scale = SegmentScales(sg);
    const float* grad = grad_t.flat<float>().data();
    const int64_t parts = Parts(ctx, sg.entries * dim, num_rows);
    MakeRunner(ctx)(parts, sg.entries * (dim + 4), [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t lo = num_rows * p / parts;
        const int64_t hi = num_rows * (p + 1) / parts;
        for (int64_t k = 0; k < sg.entries; ++k) {
          const int32_t r = sg.idx[k];
          if (r < lo || r >= hi) continue;
          const int64_t s = sg.seg[k];
          const float* g = grad + s * dim;
          float* dst = out + static_cast<int64_t>(r) * dim;
          const float f = scale[s];
          for (int64_t d = 0; d < dim; ++d) dst[d] += f * g[d];
        }
      }
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("TnetSegmentCombine").Device(tf::DEVICE_CPU),
                        TnetSegmentCombineOp);
REGISTER_KERNEL_BUILDER(Name("TnetSegmentCombineGrad").Device(tf::DEVICE_CPU),
                        TnetSegmentCombineGradOp);

}  // namespace tnet
