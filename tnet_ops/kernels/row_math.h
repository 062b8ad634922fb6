// Row math and thread dispatch shared by the combine kernels (unique,
// embed_combine, segment_combine, shard_order): the combiner codes, a row's
// axpy and scale with a compile-time width (ForRowWidth, table/row_width.h,
// the one width dispatch, shared with the update rules), the split of a
// kernel's work into chunks run on the worker pool, and the per-thread entry
// lists.
#ifndef TNET_OPS_KERNELS_ROW_MATH_H_
#define TNET_OPS_KERNELS_ROW_MATH_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/blocking_counter.h"
#include "tensorflow/core/platform/threadpool.h"
#include "tnet_ops/table/row_width.h"

namespace tnet {

namespace tf = ::tensorflow;

enum Combiner : int32_t { kSum = 0, kMean = 1, kSqrtn = 2 };

// Runs fn(c, c + 1) for c in [0, chunks): chunks 1.. on the worker pool,
// chunk 0 on the calling thread, and waits for all. (ParallelFor with one
// costly item per chunk ran the two chunks one after the other here.)
inline void RunChunks(tf::OpKernelContext* ctx, int64_t chunks,
                      const std::function<void(int64_t, int64_t)>& fn) {
  if (chunks <= 1) {
    fn(0, 1);
    return;
  }
  tf::thread::ThreadPool* pool =
      ctx->device()->tensorflow_cpu_worker_threads()->workers;
  tf::BlockingCounter done(static_cast<int>(chunks - 1));
  for (int64_t c = 1; c < chunks; ++c) {
    pool->Schedule([&fn, &done, c] {
      fn(c, c + 1);
      done.DecrementCount();
    });
  }
  fn(0, 1);
  done.Wait();
}

// dst[0, n) += f * src[0, n), n = D if D > 0 (known at compile time: the
// loop unrolls and vectorizes) else dim. f = 1 adds exactly.
template <int D>
inline void Axpy(float* __restrict dst, const float* __restrict src, float f,
                 int64_t dim) {
  const int64_t n = D > 0 ? D : dim;
  for (int64_t d = 0; d < n; ++d) dst[d] += f * src[d];
}

template <int D>
inline void ScaleRow(float* dst, float f, int64_t dim) {
  const int64_t n = D > 0 ? D : dim;
  for (int64_t d = 0; d < n; ++d) dst[d] *= f;
}

// How many entries ahead the combine kernels fetch the row they will read.
constexpr int64_t kAhead = 12;

// This thread's buffer of n entry numbers, kept between calls; after one
// very large batch, the next call of ordinary size gives the memory back.
inline int32_t* EntryList(int64_t n) {
  thread_local std::vector<int32_t> list;
  const size_t want = static_cast<size_t>(n);
  if (list.size() < want ||
      list.size() > std::max<size_t>(4 * want, size_t{1} << 22)) {
    std::vector<int32_t>(want).swap(list);
  }
  return list.data();
}

// How many parts (threads) a scatter over `work` entries is split into,
// each owning a range of output rows; at most `limit`.
inline int64_t Parts(tf::OpKernelContext* ctx, int64_t work, int64_t limit) {
  const int64_t threads =
      ctx->device()->tensorflow_cpu_worker_threads()->num_threads;
  return std::min<int64_t>(
      limit, std::max<int64_t>(1, std::min<int64_t>(threads, work / 32768)));
}

// Parts of a segment combine (or its gradient) over `entries` entries of
// rows `dim` wide, each owning a range of `limit` output rows. Every part
// reads all the entries to list its own, so with narrow rows (the dim-1
// weights of a linear part) a second part costs about what it saves and
// only burns a core the step's other ops could use: one part below dim 4.
inline int64_t NarrowParts(tf::OpKernelContext* ctx, int64_t entries,
                           int64_t dim, int64_t limit) {
  return dim < 4 ? std::min<int64_t>(1, limit)
                 : Parts(ctx, entries * dim, limit);
}

// The factor a column's sum is multiplied by, given its valid ids.
inline float Scale(int32_t combiner, int64_t count) {
  if (count == 0 || combiner == kSum) return 1.0f;
  if (combiner == kMean) return 1.0f / static_cast<float>(count);
  return 1.0f / std::sqrt(static_cast<float>(count));
}

}  // namespace tnet

#endif  // TNET_OPS_KERNELS_ROW_MATH_H_
