// TnetShardOrder.
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
#include "tnet_ops/kernels/row_math.h"

namespace tnet {

namespace tf = ::tensorflow;

// The unique keys of a step grouped by shard (key mod num_shards), so that
// a sharded table's pull and push take each shard's keys, rows, gradients
// and counts as contiguous slices: no partition of the keys, no gather of
// the gradients per shard, no stitch of the pulled rows by position.
class TnetShardOrderOp : public tf::OpKernel {
 public:
  explicit TnetShardOrderOp(tf::OpKernelConstruction* ctx)
      : tf::OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_shards", &num_shards_));
    OP_REQUIRES(ctx, num_shards_ >= 1 && num_shards_ <= (int64_t{1} << 20),
                tf::errors::InvalidArgument(
                    "num_shards must be in [1, 2^20], got ", num_shards_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& keys_t = ctx->input(0);
    const tf::Tensor& idx_t = ctx->input(1);
    const tf::Tensor& counts_t = ctx->input(2);
    OP_REQUIRES(ctx,
                tf::TensorShapeUtils::IsVector(keys_t.shape()) &&
                    tf::TensorShapeUtils::IsVector(idx_t.shape()) &&
                    tf::TensorShapeUtils::IsVector(counts_t.shape()),
                tf::errors::InvalidArgument(
                    "keys, idx and counts must be vectors, got shapes ",
                    keys_t.shape().DebugString(), ", ",
                    idx_t.shape().DebugString(), ", ",
                    counts_t.shape().DebugString()));
    const int64_t u = keys_t.dim_size(0);
    const int64_t n = idx_t.dim_size(0);
    OP_REQUIRES(ctx, counts_t.dim_size(0) == u,
                tf::errors::InvalidArgument(
                    "counts must have one entry per key: ",
                    counts_t.dim_size(0), " for ", u, " keys"));
    OP_REQUIRES(ctx, u <= std::numeric_limits<int32_t>::max(),
                tf::errors::InvalidArgument("at most 2^31 - 1 keys, got ", u));
    const int64_t* keys = keys_t.flat<int64_t>().data();
    const int32_t* idx = idx_t.flat<int32_t>().data();
    const float* counts = counts_t.flat<float>().data();
    const int64_t shards = num_shards_;
    tf::Tensor* sizes_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, tf::TensorShape({shards}),
                                             &sizes_t));
    int64_t* sizes = sizes_t->flat<int64_t>().data();
    std::fill(sizes, sizes + shards, 0);
    std::vector<int32_t> pos;
    try {
      pos.resize(u);
    } catch (const std::bad_alloc&) {
      ctx->SetStatus(tf::errors::ResourceExhausted(
          "TnetShardOrder: no memory for ", u, " positions"));
      return;
    }
    // Each key's shard, once (floormod; a mask when shards is a power of
    // two, where two's complement gives floormod for negative keys too).
    std::vector<int32_t> shard;
    try {
      shard.resize(u);
    } catch (const std::bad_alloc&) {
      ctx->SetStatus(tf::errors::ResourceExhausted(
          "TnetShardOrder: no memory for ", u, " shard numbers"));
      return;
    }
    if ((shards & (shards - 1)) == 0) {
      const uint64_t mask = static_cast<uint64_t>(shards - 1);
      for (int64_t i = 0; i < u; ++i) {
        shard[i] = static_cast<int32_t>(static_cast<uint64_t>(keys[i]) & mask);
      }
    } else {
      for (int64_t i = 0; i < u; ++i) {
        const int64_t m = keys[i] % shards;
        shard[i] = static_cast<int32_t>(m < 0 ? m + shards : m);
      }
    }
    for (int64_t i = 0; i < u; ++i) ++sizes[shard[i]];
    std::vector<int64_t> next(shards, 0);
    for (int64_t s = 1; s < shards; ++s) next[s] = next[s - 1] + sizes[s - 1];
    tf::Tensor* keys_out = nullptr;
    tf::Tensor* idx_out = nullptr;
    tf::Tensor* counts_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys_t.shape(), &keys_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, idx_t.shape(), &idx_out));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(2, counts_t.shape(), &counts_out));
    int64_t* gk = keys_out->flat<int64_t>().data();
    float* gc = counts_out->flat<float>().data();
    for (int64_t i = 0; i < u; ++i) {
      const int64_t at = next[shard[i]]++;
      pos[i] = static_cast<int32_t>(at);
      gk[at] = keys[i];
      gc[at] = counts[i];
    }
    int32_t* gi = idx_out->flat<int32_t>().data();
    const int64_t chunks = std::max<int64_t>(
        1, std::min<int64_t>(
               ctx->device()->tensorflow_cpu_worker_threads()->num_threads,
               n / 65536));
    std::vector<char> bad(chunks, 0);
    RunChunks(ctx, chunks, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t lo = n * c / chunks, hi = n * (c + 1) / chunks;
        bool b = false;
        for (int64_t i = lo; i < hi; ++i) {
          const int32_t v = idx[i];
          const bool in = static_cast<uint64_t>(int64_t{v}) <
                          static_cast<uint64_t>(u);
          b |= !in & (v != -1);
          gi[i] = in ? pos[v] : -1;
        }
        bad[c] = b;
      }
    });
    for (int64_t c = 0; c < chunks; ++c) {
      if (!bad[c]) continue;
      for (int64_t i = 0; i < n; ++i) {
        OP_REQUIRES(ctx, idx[i] >= -1 && idx[i] < u,
                    tf::errors::InvalidArgument(
                        "idx[", i, "] = ", idx[i], " is not in [-1, ", u,
                        ") (", u, " keys)"));
      }
    }
  }

 private:
  int64_t num_shards_ = 1;
};

REGISTER_KERNEL_BUILDER(Name("TnetShardOrder").Device(tf::DEVICE_CPU),
                        TnetShardOrderOp);

}  // namespace tnet
