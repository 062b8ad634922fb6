// TnetUnique, TnetEmbedCombine and TnetEmbedCombineGrad: the worker side of
// a lookup without the stock chain around the temporary matrix E.
//
// TnetUnique replaces tf.unique + bincount (single-threaded, one pass each):
// each thread dedups a contiguous chunk of the batch into its own map, the
// chunks' maps are merged in chunk order (so unique keys come in order of
// first occurrence, exactly tf.unique's whatever the thread count) and the
// later chunks' indices renumbered. Padding (valid = false) gets index -1
// and is never counted.
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
#include "tensorflow/core/platform/blocking_counter.h"
#include "tensorflow/core/platform/threadpool.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tnet_ops/kernels/table_resource.h"
#include "tnet_ops/table/hash.h"

namespace tnet {

namespace tf = ::tensorflow;

namespace {

enum Combiner : int32_t { kSum = 0, kMean = 1, kSqrtn = 2 };

// An open-addressing map key -> group number (groups numbered 0, 1, ... in
// order of insertion). 8-byte slots {hash tag, group}; keys and counts sit
// in vectors by group, so they come out in group order with no pass over
// the slots (two such passes were most of TnetUnique's serial merge).
// Linear probing on the low bits of Mix64(key), grown at 5/8 load. Find is
// read-only (threads may share it); Add is not thread-safe: one map per
// chunk of a TnetUnique.
class GroupMap {
 public:
  explicit GroupMap(int64_t expected) {
    const uint64_t want = static_cast<uint64_t>(std::max<int64_t>(expected, 1));
    uint64_t cap = 64;
    while (cap * 5 < want * 8) cap *= 2;
    Rebuild(cap);
  }

  // Prefetches the home slot of a key (hash h).
  void Prefetch(uint64_t h) const { __builtin_prefetch(&slots_[h & mask_]); }

  // Adds `count` to key's group (hash h), inserting the key as a new
  // group if absent; returns the group.
  int32_t Add(int64_t key, uint64_t h, float count) {
    const uint32_t tag = static_cast<uint32_t>(h >> 32);
    for (uint64_t s = h & mask_;; s = (s + 1) & mask_) {
      Slot& slot = slots_[s];
      if (slot.group < 0) {
        const int32_t g = static_cast<int32_t>(keys_.size());
        slot = {tag, g};
        keys_.push_back(key);
        counts_.push_back(count);
        if (keys_.size() * 8 > capacity_ * 5) Rebuild(capacity_ * 2);
        return g;
      }
      if (slot.tag == tag && keys_[slot.group] == key) {
        counts_[slot.group] += count;
        return slot.group;
      }
    }
  }

  // Key's group, or -1.
  int32_t Find(int64_t key, uint64_t h) const {
    const uint32_t tag = static_cast<uint32_t>(h >> 32);
    for (uint64_t s = h & mask_;; s = (s + 1) & mask_) {
      const Slot& slot = slots_[s];
      if (slot.group < 0) return -1;
      if (slot.tag == tag && keys_[slot.group] == key) return slot.group;
    }
  }

  int64_t size() const { return static_cast<int64_t>(keys_.size()); }
  // The groups' keys, in group order.
  const std::vector<int64_t>& keys() const { return keys_; }
  // The groups' counts, in group order.
  const std::vector<float>& Counts() const { return counts_; }

 private:
  // The key's hash's high half (its low bits pick the home slot) and its
  // group: 8 bytes, so a map of ~100k keys stays in a core's L2; the key
  // itself is read from keys_ when the tags agree.
  struct Slot {
    uint32_t tag;
    int32_t group;  // -1: empty
  };
  static_assert(sizeof(Slot) == 8, "group map slots are 8 bytes");

  // Reallocates to `cap` slots and re-inserts every group.
  void Rebuild(uint64_t cap) {
    std::vector<Slot> old(cap, Slot{0, -1});
    old.swap(slots_);
    capacity_ = cap;
    mask_ = cap - 1;
    for (const Slot& slot : old) {
      if (slot.group < 0) continue;
      uint64_t s = Mix64(static_cast<uint64_t>(keys_[slot.group])) & mask_;
      while (slots_[s].group >= 0) s = (s + 1) & mask_;
      slots_[s] = slot;
    }
  }

  std::vector<Slot> slots_;
  uint64_t capacity_ = 0;
  uint64_t mask_ = 0;
  std::vector<int64_t> keys_;
  std::vector<float> counts_;  // per group
};

// Calls fn(i, h) for i in [b, e), h = Mix64(keys[i]), each key hashed once,
// kAhead positions before its call, with its home slot in `map` prefetched
// then (a ring holds the hashes in between). Padding (valid[i] false) is
// neither hashed nor prefetched: its h is stale and must not be used.
template <typename Fn>
void ForEachHashed(const GroupMap& map, const int64_t* keys, const bool* valid,
                   int64_t b, int64_t e, Fn&& fn) {
  constexpr int64_t kAhead = 16;
  uint64_t ring[kAhead] = {};
  auto hash_at = [&](int64_t i) {
    if (valid != nullptr && !valid[i]) return;
    const uint64_t h = Mix64(static_cast<uint64_t>(keys[i]));
    map.Prefetch(h);
    ring[i & (kAhead - 1)] = h;
  };
  for (int64_t i = b; i < std::min(e, b + kAhead); ++i) hash_at(i);
  for (int64_t i = b; i < e; ++i) {
    const uint64_t h = ring[i & (kAhead - 1)];  // read before it is reused
    if (i + kAhead < e) hash_at(i + kAhead);
    fn(i, h);
  }
}

// Looks keys[b, e) up in `map`: out[i] = the key's group or -1.
void FindRange(const GroupMap& map, const int64_t* keys, int64_t b, int64_t e,
               int32_t* out) {
  ForEachHashed(map, keys, nullptr, b, e, [&](int64_t i, uint64_t h) {
    out[i] = map.Find(keys[i], h);
  });
}

// Deduplicates keys[b, e) into `map` (groups in order of first occurrence
// within the range), counting each key; idx[i] = its group, -1 at padding.
void DedupRange(const int64_t* keys, const bool* valid, int64_t b, int64_t e,
                GroupMap* map, int32_t* idx) {
  ForEachHashed(*map, keys, valid, b, e, [&](int64_t i, uint64_t h) {
    idx[i] = (valid != nullptr && !valid[i]) ? -1 : map->Add(keys[i], h, 1.0f);
  });
}

// Runs fn(c, c + 1) for c in [0, chunks): chunks 1.. on the worker pool,
// chunk 0 on the calling thread, and waits for all. (ParallelFor with one
// costly item per chunk ran the two chunks one after the other here.)
void RunChunks(tf::OpKernelContext* ctx, int64_t chunks,
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

// fn(std::integral_constant<int, D>()) with D = dim for the usual row
// widths, D = 0 (any width) otherwise.
template <typename Fn>
void DispatchDim(int64_t dim, Fn&& fn) {
  switch (dim) {
    case 1: return fn(std::integral_constant<int, 1>());
    case 4: return fn(std::integral_constant<int, 4>());
    case 8: return fn(std::integral_constant<int, 8>());
    case 16: return fn(std::integral_constant<int, 16>());
    case 32: return fn(std::integral_constant<int, 32>());
    case 64: return fn(std::integral_constant<int, 64>());
    default: return fn(std::integral_constant<int, 0>());
  }
}

}  // namespace

// TnetUnique in three phases, exactly tf.unique's output on any number of
// threads:
// 1. the batch is cut into T contiguous chunks (T = worker threads, fewer
//    for small batches); each thread dedups its chunk into its own map, in
//    first-occurrence order within the chunk, writing its chunk's idx;
// 2. serially, chunk 0's map becomes the global one (its group numbers are
//    already global: first occurrences in chunk 0 come first), and every
//    later chunk's groups, in their order, are looked up in it: a key seen
//    before keeps its number, a new key gets the next one (which is its
//    global first-occurrence order); counts are added;
// 3. in parallel, every later chunk's idx is renumbered through its map.
// Each id is hashed and probed once (plus one probe per unique key of the
// later chunks in phase 2); the maps hold the chunks' unique keys only.
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

    // 1. One map per chunk. Chunks of fewer than kMinChunk ids cost more
    // in phase 2 than they save.
    constexpr int64_t kMinChunk = 65536;
    const int64_t threads =
        ctx->device()->tensorflow_cpu_worker_threads()->num_threads;
    const int64_t chunks =
        std::max<int64_t>(1, std::min<int64_t>(threads, n / kMinChunk));
    std::vector<int64_t> bound(chunks + 1);
    for (int64_t c = 0; c <= chunks; ++c) bound[c] = n * c / chunks;
    std::vector<std::unique_ptr<GroupMap>> maps(chunks);
    auto phase1 = [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        // Size the map for the distinct keys a chunk had last time (a
        // smaller map stays in cache and costs less to clear), else for a
        // quarter of its ids; it grows at 5/8 load either way.
        const int64_t len = bound[c + 1] - bound[c];
        const int64_t hint = seen_per_chunk_.load(std::memory_order_relaxed);
        maps[c] = std::make_unique<GroupMap>(
            hint > 0 ? std::min(len, hint + hint / 4) : len / 4);
        DedupRange(keys, valid, bound[c], bound[c + 1], maps[c].get(), idx);
      }
    };
    RunChunks(ctx, chunks, phase1);
    int64_t most = 0;
    for (const auto& m : maps) most = std::max(most, m->size());
    seen_per_chunk_.store(most, std::memory_order_relaxed);

    // 2. Merge later chunks into chunk 0's map; remap[c][g] = global
    // group. Middle chunks (more than 2 threads) insert serially. The last
    // chunk's keys are only looked up (the map is read-only then) and its
    // new keys only get numbers, nothing looks them up later: so in
    // parallel, each part finds its share of the keys and adds the counts
    // of the found ones (distinct keys of a chunk are distinct global
    // groups: no two parts add into one count), then, after a prefix sum
    // of the parts' misses, numbers its new keys in order (the numbers a
    // serial pass in key order gives).
    GroupMap& global = *maps[0];
    std::vector<std::vector<int32_t>> remap(chunks);
    std::vector<float> head_counts;  // the global groups' counts
    std::vector<int64_t> tail_keys;  // the last chunk's new keys
    std::vector<float> tail_counts;
    for (int64_t c = 1; c < chunks; ++c) {
      const std::vector<int64_t>& ck = maps[c]->keys();
      const std::vector<float>& cc = maps[c]->Counts();
      const int64_t m = static_cast<int64_t>(ck.size());
      std::vector<int32_t>& to = remap[c];
      to.resize(m);
      if (c < chunks - 1) {
        for (int64_t g = 0; g < m; ++g) {
          to[g] = global.Add(ck[g], Mix64(static_cast<uint64_t>(ck[g])),
                             cc[g]);
        }
      } else {
        head_counts = global.Counts();
        std::vector<int64_t> first_new(chunks + 1, 0);  // per part, then prefix
        auto find = [&](int64_t p0, int64_t p1) {
          for (int64_t p = p0; p < p1; ++p) {
            const int64_t lo = m * p / chunks, hi = m * (p + 1) / chunks;
            FindRange(global, ck.data(), lo, hi, to.data());
            int64_t missed = 0;
            for (int64_t g = lo; g < hi; ++g) {
              if (to[g] >= 0) {
                head_counts[to[g]] += cc[g];
              } else {
                ++missed;
              }
            }
            first_new[p + 1] = missed;
          }
        };
        RunChunks(ctx, chunks, find);
        for (int64_t p = 0; p < chunks; ++p) first_new[p + 1] += first_new[p];
        tail_keys.resize(first_new[chunks]);
        tail_counts.resize(first_new[chunks]);
        const int32_t head = static_cast<int32_t>(global.size());
        auto number = [&](int64_t p0, int64_t p1) {
          for (int64_t p = p0; p < p1; ++p) {
            const int64_t lo = m * p / chunks, hi = m * (p + 1) / chunks;
            int64_t t = first_new[p];
            for (int64_t g = lo; g < hi; ++g) {
              if (to[g] >= 0) continue;
              to[g] = head + static_cast<int32_t>(t);
              tail_keys[t] = ck[g];
              tail_counts[t] = cc[g];
              ++t;
            }
          }
        };
        RunChunks(ctx, chunks, number);
      }
      maps[c].reset();
    }
    if (chunks == 1) head_counts = global.Counts();
    const int64_t head = global.size();
    const int64_t u = head + static_cast<int64_t>(tail_keys.size());
    tf::Tensor* uniq_t = nullptr;
    tf::Tensor* counts_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({u}), &uniq_t));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(2, tf::TensorShape({u}), &counts_t));
    int64_t* uniq = uniq_t->flat<int64_t>().data();
    float* counts = counts_t->flat<float>().data();
    std::memcpy(uniq, global.keys().data(), sizeof(int64_t) * head);
    std::memcpy(counts, head_counts.data(), sizeof(float) * head);
    std::memcpy(uniq + head, tail_keys.data(),
                sizeof(int64_t) * tail_keys.size());
    std::memcpy(counts + head, tail_counts.data(),
                sizeof(float) * tail_counts.size());

    // 3. Renumber the later chunks' idx.
    if (chunks > 1) {
      auto phase3 = [&](int64_t c0, int64_t c1) {
        for (int64_t c = std::max<int64_t>(c0, 1); c < c1; ++c) {
          const int32_t* m = remap[c].data();
          for (int64_t i = bound[c]; i < bound[c + 1]; ++i) {
            if (idx[i] >= 0) idx[i] = m[idx[i]];
          }
        }
      };
      RunChunks(ctx, chunks, phase3);
    }
  }
 private:
  // Most distinct keys in one chunk at the last call: the next call's map
  // size (a job's batches are alike).
  std::atomic<int64_t> seen_per_chunk_{0};
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

// How many entries ahead the combine kernels fetch the row they will read.
constexpr int64_t kAhead = 12;

// This thread's buffer of n entry numbers, kept between calls; after one
// very large batch, the next call of ordinary size gives the memory back.
int32_t* EntryList(int64_t n) {
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
int64_t Parts(tf::OpKernelContext* ctx, int64_t work, int64_t limit) {
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
int64_t NarrowParts(tf::OpKernelContext* ctx, int64_t entries, int64_t dim,
                    int64_t limit) {
  return dim < 4 ? std::min<int64_t>(1, limit)
                 : Parts(ctx, entries * dim, limit);
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
    DispatchDim(dim, [&](auto kDim) {
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
    DispatchDim(dim, [&](auto kDim) {
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
  if (out->entries > std::numeric_limits<int32_t>::max()) {
    return tf::errors::InvalidArgument(
        "at most 2^31 - 1 ids per call, got ", out->entries,
        ": split the batch");
  }
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
  return tf::OkStatus();
}

inline bool AllSum(const Segments& sg) {
  for (int64_t c = 0; c < sg.columns; ++c) {
    if (sg.combiners[c] != kSum) return false;
  }
  return true;
}

// idx in [-1, rows) and segment in [0, num_segments).
inline bool EntryInRange(const Segments& sg, int64_t rows, int64_t idx,
                         int64_t seg) {
  return (static_cast<uint64_t>(seg) < static_cast<uint64_t>(sg.num_segments)) &
         (static_cast<uint64_t>(idx + 1) < static_cast<uint64_t>(rows) + 1);
}

// The one-part combines' loop: add(idx, segment) for every entry in entry
// order whose idx is not -1, prefetch(idx) kAhead entries before (only for
// an idx in range). With `check`, each entry is checked before its add;
// false at the first bad one (nothing after it is read or written).
template <typename Prefetch, typename Add>
bool ForEachEntryInOrder(const Segments& sg, int64_t rows, bool check,
                         Prefetch&& prefetch, Add&& add) {
  for (int64_t k = 0; k < sg.entries; ++k) {
    if (k + kAhead < sg.entries &&
        static_cast<uint64_t>(sg.idx[k + kAhead]) <
            static_cast<uint64_t>(rows)) {
      prefetch(int64_t{sg.idx[k + kAhead]});
    }
    const int64_t i = sg.idx[k];
    const int64_t seg = sg.seg[k];
    if (check && !EntryInRange(sg, rows, i, seg)) return false;
    if (i >= 0) add(i, seg);
  }
  return true;
}

// The first bad entry, as an InvalidArgument (the slow path of ScanSegments).
tf::Status FirstBadEntry(const Segments& sg, int64_t rows) {
  for (int64_t k = 0; k < sg.entries; ++k) {
    if (sg.idx[k] < -1 || sg.idx[k] >= rows) {
      return tf::errors::InvalidArgument("idx[", k, "] = ", sg.idx[k],
                                         " is not in [-1, ", rows, ")");
    }
    if (sg.seg[k] < 0 || sg.seg[k] >= sg.num_segments) {
      return tf::errors::InvalidArgument("segments[", k, "] = ", sg.seg[k],
                                         " is not in [0, ", sg.num_segments,
                                         ")");
    }
  }
  return tf::errors::Internal("no bad segment entry found");
}

// Validates every entry (idx in [-1, rows), segment in [0, num_segments))
// and, unless every combiner is a sum (or rows are 0 wide: nothing to
// scale), returns each segment's factor in *scale (else leaves it empty:
// the factor is 1). One pass over the entries, split over the threads, each
// counting its share into its own counts. Call it once the output exists:
// the counts are num_segments long per thread.
tf::Status ScanSegments(tf::OpKernelContext* ctx, const Segments& sg,
                        int64_t rows, int64_t dim, std::vector<float>* scale) {
  scale->clear();
  bool all_sum = true;
  for (int64_t c = 0; c < sg.columns; ++c) all_sum &= sg.combiners[c] == kSum;
  if (sg.entries == 0) return tf::OkStatus();  // no counts: every factor is 1
  const bool no_counts = all_sum || dim == 0 || sg.num_segments == 0;
  const int64_t parts = Parts(ctx, sg.entries, sg.entries);
  std::vector<std::vector<int32_t>> counts;
  if (!no_counts) {
    try {
      counts.assign(std::max<int64_t>(parts, 1),
                    std::vector<int32_t>(sg.num_segments, 0));
      scale->resize(sg.num_segments);
    } catch (const std::bad_alloc&) {
      return tf::errors::ResourceExhausted(
          "counting the ids of ", sg.num_segments, " segments needs ",
          sg.num_segments * 4 * (parts + 2), " bytes; pass fewer segments");
    }
  }
  std::vector<char> bad(std::max<int64_t>(parts, 1), 0);
  const uint64_t ns = static_cast<uint64_t>(sg.num_segments);
  const uint64_t ids = static_cast<uint64_t>(rows) + 1;
  RunChunks(ctx, parts, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t k0 = sg.entries * p / parts;
      const int64_t k1 = sg.entries * (p + 1) / parts;
      bool b = false;
      for (int64_t k = k0; k < k1; ++k) {
        b |= (static_cast<uint64_t>(sg.seg[k]) >= ns) |
             (static_cast<uint64_t>(int64_t{sg.idx[k]} + 1) >= ids);
      }
      bad[p] = b;
      if (b || no_counts) continue;
      std::vector<int32_t>& n = counts[p];
      for (int64_t k = k0; k < k1; ++k) n[sg.seg[k]] += sg.idx[k] >= 0;
    }
  });
  for (char b : bad) {
    if (b) {
      scale->clear();
      return FirstBadEntry(sg, rows);
    }
  }
  if (no_counts) return tf::OkStatus();
  // The factors, a range of segments per thread (a layer's call has
  // batch x columns of them), the column stepped rather than divided out.
  const int64_t sparts = Parts(ctx, sg.num_segments * 4, sg.num_segments);
  RunChunks(ctx, sparts, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t lo = sg.num_segments * p / sparts;
      const int64_t hi = sg.num_segments * (p + 1) / sparts;
      int64_t column = lo % sg.columns;
      for (int64_t s = lo; s < hi; ++s) {
        int64_t n = 0;
        for (const auto& part : counts) n += part[s];
        (*scale)[s] = Scale(sg.combiners[column], n);
        if (++column == sg.columns) column = 0;
      }
    }
  });
  return tf::OkStatus();
}

// What CombineRuns found.
enum class RunsResult { kDone, kNotRuns, kBadEntry };

// The segment combine when each segment's entries are one contiguous run
// (the layer's order: a dense block row-major, then each ragged or sparse
// piece in example order). The entries are cut into `parts` ranges at run
// boundaries, one per thread; each part reads its runs in entry order,
// checks every entry of a run before reading any of its rows, sums the
// run's rows times the segment's factor (1 / count for a mean, from the
// run's valid ids) into registers, and stores the segment once: the sums
// of the listing path, in the same order, with no pass listing the
// entries per part. Each part marks the segments it wrote in its own
// bitmap; a segment met twice (in one part or two) means the entries are
// not in runs: kNotRuns, and the caller's listing path rewrites every
// output row. Segments no run reached are zeroed. kBadEntry: some entry is
// out of range (the caller names it); no row was read for it.
template <int D>
RunsResult CombineRuns(tf::OpKernelContext* ctx, const Segments& sg,
                       int64_t num_rows, const float* rows, float* out,
                       int64_t parts) {
  const int64_t ns = sg.num_segments;
  const int64_t words = (ns + 63) / 64;
  std::vector<std::vector<uint64_t>> marks;
  std::vector<int64_t> bound(parts + 1, sg.entries);
  try {
    marks.assign(parts, std::vector<uint64_t>(words, 0));
  } catch (const std::bad_alloc&) {
    return RunsResult::kNotRuns;
  }
  bound[0] = 0;
  for (int64_t p = 1; p < parts; ++p) {
    int64_t b = std::max(bound[p - 1], sg.entries * p / parts);
    while (b > 0 && b < sg.entries && sg.seg[b] == sg.seg[b - 1]) ++b;
    bound[p] = b;
  }
  bool uniform = true;  // one combiner for every column: no s % C per run
  for (int64_t c = 1; c < sg.columns; ++c) {
    uniform &= sg.combiners[c] == sg.combiners[0];
  }
  const uint64_t ids = static_cast<uint64_t>(num_rows) + 1;
  // 0 fine, 1 a bad entry, 2 a segment met twice in one part.
  std::vector<char> status(parts, 0);
  RunChunks(ctx, parts, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      uint64_t* mine = marks[p].data();
      const int64_t k1 = bound[p + 1];
      int64_t k = bound[p];
      while (k < k1) {
        const int64_t s = sg.seg[k];
        if (static_cast<uint64_t>(s) >= static_cast<uint64_t>(ns)) {
          status[p] = 1;
          break;
        }
        int64_t e = k;
        int64_t count = 0;
        bool bad = false;
        for (; e < k1 && sg.seg[e] == s; ++e) {
          bad |= static_cast<uint64_t>(int64_t{sg.idx[e]} + 1) >= ids;
          count += sg.idx[e] >= 0;
        }
        if (bad) {
          status[p] = 1;
          break;
        }
        uint64_t& word = mine[s >> 6];
        const uint64_t bit = uint64_t{1} << (s & 63);
        if (word & bit) {
          status[p] = 2;
          break;
        }
        word |= bit;
        const int32_t code = sg.combiners[uniform ? 0 : s % sg.columns];
        const float f = Scale(code, count);
        float acc[D] = {};
        for (int64_t j = k; j < e; ++j) {
          if (j + kAhead < k1 && static_cast<uint64_t>(sg.idx[j + kAhead]) <
                                     static_cast<uint64_t>(num_rows)) {
            __builtin_prefetch(rows + int64_t{sg.idx[j + kAhead]} * D);
          }
          if (sg.idx[j] >= 0) {
            Axpy<D>(acc, rows + int64_t{sg.idx[j]} * D, f, D);
          }
        }
        std::memcpy(out + s * D, acc, sizeof(acc));
        k = e;
      }
    }
  });
  for (char st : status) {
    if (st == 1) return RunsResult::kBadEntry;
  }
  for (char st : status) {
    if (st == 2) return RunsResult::kNotRuns;
  }
  // A segment two parts wrote was split over two runs; a segment none
  // wrote gets zeros.
  for (int64_t w = 0; w < words; ++w) {
    uint64_t any = 0;
    for (int64_t p = 0; p < parts; ++p) {
      if (any & marks[p][w]) return RunsResult::kNotRuns;
      any |= marks[p][w];
    }
    const int64_t hi = std::min<int64_t>(64, ns - w * 64);
    const uint64_t full = hi == 64 ? ~uint64_t{0} : (uint64_t{1} << hi) - 1;
    if (any == full) continue;
    for (int64_t b = 0; b < hi; ++b) {
      if (!(any >> b & 1)) {
        std::memset(out + (w * 64 + b) * D, 0, sizeof(float) * D);
      }
    }
  }
  return RunsResult::kDone;
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
    const int64_t num_rows = rows_t.dim_size(0);
    bool compiled = false;  // a row width with its own compiled loop
    DispatchDim(dim, [&](auto kDim) { compiled = decltype(kDim)::value > 0; });
    // Compiled widths check and count while each part lists its entries
    // (below); any other width takes one separate pass first.
    std::vector<float> scale;  // empty: every factor is 1
    bool scanned = false;
    if (!compiled || sg.num_segments == 0) {
      OP_REQUIRES_OK(ctx, ScanSegments(ctx, sg, num_rows, dim, &scale));
      scanned = true;
    }
    float* out = out_t->flat<float>().data();
    if (sg.num_segments == 0 || dim == 0) return;
    const float* rows = rows_t.flat<float>().data();
    const int64_t parts = NarrowParts(ctx, sg.entries, dim, sg.num_segments);
    if (parts == 1) {
      // One part: no list. Each entry adds its row straight into its
      // segment, in entry order: the sums of the parts below, in the same
      // order. With sums only, each entry is checked just before its row is
      // read; else a first pass checks them all and counts for the means.
      const bool inline_check = !scanned && AllSum(sg);
      if (!scanned && !inline_check) {
        OP_REQUIRES_OK(ctx, ScanSegments(ctx, sg, num_rows, dim, &scale));
      }
      std::memset(out, 0, sizeof(float) * sg.num_segments * dim);
      const float* sc = scale.empty() ? nullptr : scale.data();
      bool good = true;
      DispatchDim(dim, [&](auto kDim) {
        constexpr int D = decltype(kDim)::value;
        good = ForEachEntryInOrder(
            sg, num_rows, inline_check,
            [&](int64_t i) { __builtin_prefetch(rows + i * dim); },
            [&](int64_t i, int64_t seg) {
              Axpy<D>(out + seg * dim, rows + i * dim,
                      sc != nullptr ? sc[seg] : 1.0f, dim);
            });
      });
      if (!good) OP_REQUIRES_OK(ctx, FirstBadEntry(sg, num_rows));
      return;
    }
    // Entries in runs (the layer's order) need no listing: one range of
    // entries per part. Any other order falls through to the listing path.
    if (compiled && !scanned) {
      RunsResult runs = RunsResult::kNotRuns;
      DispatchDim(dim, [&](auto kDim) {
        constexpr int D = decltype(kDim)::value;
        if constexpr (D > 0) {
          runs = CombineRuns<D>(ctx, sg, num_rows, rows, out, parts);
        }
      });
      if (runs == RunsResult::kBadEntry) {
        OP_REQUIRES_OK(ctx, FirstBadEntry(sg, num_rows));
      }
      if (runs == RunsResult::kDone) return;
    }
    bool all_sum = true;
    for (int64_t c = 0; c < sg.columns; ++c) all_sum &= sg.combiners[c] == kSum;
    std::vector<char> bad(parts, 0);  // 1: a bad entry, 2: out of memory
    // Each part owns a range of segments: no two threads add into one row.
    // It lists its entries without a branch, then adds them in entry order,
    // fetching the rows a few entries ahead; a run of entries of one segment
    // (the layer's order) is summed in registers and stored once. A
    // segment's first run starts from zeros (no pass zeroing the whole
    // output first); the segments no entry reached are zeroed at the end.
    // With a compiled width the listing pass also checks every entry (each
    // part checks all of them: none reads a row before all are known good)
    // and counts its own segments' ids for the mean / sqrtn factors.
    DispatchDim(dim, [&](auto kDim) {
    constexpr int D = decltype(kDim)::value;
    RunChunks(ctx, parts, [&](int64_t p0, int64_t p1) {
      int32_t* const mine = EntryList(sg.entries);
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t lo = sg.num_segments * p / parts;
        const int64_t hi = sg.num_segments * (p + 1) / parts;
        const uint64_t span = static_cast<uint64_t>(hi - lo);
        int64_t n = 0;
        if constexpr (D > 0) try {
          const uint64_t ns = static_cast<uint64_t>(sg.num_segments);
          const uint64_t ids = static_cast<uint64_t>(num_rows) + 1;
          std::vector<int32_t> count(all_sum ? 0 : span + 1, 0);
          bool b = false;
          for (int64_t k = 0; k < sg.entries; ++k) {
            const uint64_t rel = static_cast<uint64_t>(sg.seg[k] - lo);
            const bool own = rel < span;
            const bool valid = sg.idx[k] >= 0;
            b |= (static_cast<uint64_t>(sg.seg[k]) >= ns) |
                 (static_cast<uint64_t>(int64_t{sg.idx[k]} + 1) >= ids);
            mine[n] = static_cast<int32_t>(k);
            n += own & valid;
            if (!all_sum) count[own ? rel : span] += valid;
          }
          if (b) {
            bad[p] = 1;
            continue;
          }
          std::vector<float> factors;
          if (!all_sum) {
            factors.resize(span);
            int64_t column = lo % sg.columns;
            for (uint64_t s = 0; s < span; ++s) {
              factors[s] = Scale(sg.combiners[column], count[s]);
              if (++column == sg.columns) column = 0;
            }
          }
          auto row_of = [&](int64_t i) {
            return rows + static_cast<int64_t>(sg.idx[mine[i]]) * dim;
          };
          std::vector<bool> seen(span, false);
          float acc[D];
          int64_t cur = -1;
          float f = 1.0f;
          for (int64_t i = 0; i < n; ++i) {
            if (i + kAhead < n) __builtin_prefetch(row_of(i + kAhead));
            const int64_t s = sg.seg[mine[i]];
            if (s != cur) {
              if (cur >= 0) std::memcpy(out + cur * D, acc, sizeof(acc));
              if (seen[s - lo]) {
                std::memcpy(acc, out + s * D, sizeof(acc));
              } else {
                std::memset(acc, 0, sizeof(acc));
                seen[s - lo] = true;
              }
              cur = s;
              if (!all_sum) f = factors[s - lo];
            }
            Axpy<D>(acc, row_of(i), f, D);
          }
          if (cur >= 0) std::memcpy(out + cur * D, acc, sizeof(acc));
          for (int64_t s = lo; s < hi; ++s) {
            if (!seen[s - lo]) std::memset(out + s * D, 0, sizeof(acc));
          }
        } catch (const std::bad_alloc&) {  // this part's counts and marks
          bad[p] = 2;
        } else {
          const float* sc = scale.empty() ? nullptr : scale.data();
          for (int64_t k = 0; k < sg.entries; ++k) {
            mine[n] = static_cast<int32_t>(k);
            n += (static_cast<uint64_t>(sg.seg[k] - lo) < span) &
                 (sg.idx[k] >= 0);
          }
          std::memset(out + lo * dim, 0, sizeof(float) * (hi - lo) * dim);
          for (int64_t i = 0; i < n; ++i) {
            const int64_t s = sg.seg[mine[i]];
            Axpy<D>(out + s * dim,
                    rows + static_cast<int64_t>(sg.idx[mine[i]]) * dim,
                    sc != nullptr ? sc[s] : 1.0f, dim);
          }
        }
      }
    });
    });
    for (char b : bad) {
      OP_REQUIRES(ctx, b != 2,
                  tf::errors::ResourceExhausted(
                      "counting the ids of ", sg.num_segments,
                      " segments needs ", sg.num_segments * 9,
                      " bytes; pass fewer segments"));
    }
    for (char b : bad) {
      if (b) {
        OP_REQUIRES_OK(ctx, FirstBadEntry(sg, num_rows));
      }
    }
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
    const int64_t parts = NarrowParts(ctx, sg.entries, dim, num_rows);
    // One part of sums only checks each entry just before it writes
    // (below); otherwise one pass checks them all first (and counts).
    const bool inline_check = parts == 1 && AllSum(sg) && dim > 0 &&
                              num_rows > 0 && sg.entries > 0;
    std::vector<float> scale;  // empty: every factor is 1
    if (!inline_check) {
      OP_REQUIRES_OK(ctx, ScanSegments(ctx, sg, num_rows, dim, &scale));
    }
    tf::TensorShape shape;
    OP_REQUIRES(ctx, tf::TensorShape::BuildTensorShape({num_rows, dim},
                                                       &shape).ok(),
                tf::errors::InvalidArgument("num_rows * dim overflows"));
    tf::Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out_t));
    float* out = out_t->flat<float>().data();
    if (num_rows == 0 || dim == 0) return;
    if (sg.entries == 0) {
      std::memset(out, 0, sizeof(float) * num_rows * dim);
      return;
    }
    const float* grad = grad_t.flat<float>().data();
    const float* sc = scale.empty() ? nullptr : scale.data();
    auto factor = [sc](int64_t s) { return sc != nullptr ? sc[s] : 1.0f; };
    if (parts == 1) {
      // One part: no list; every entry adds into its row in entry order
      // (the order of the parts below).
      std::memset(out, 0, sizeof(float) * num_rows * dim);
      bool good = true;
      DispatchDim(dim, [&](auto kDim) {
        constexpr int D = decltype(kDim)::value;
        good = ForEachEntryInOrder(
            sg, num_rows, inline_check,
            [&](int64_t i) { __builtin_prefetch(out + i * dim, 1); },
            [&](int64_t i, int64_t seg) {
              Axpy<D>(out + i * dim, grad + seg * dim, factor(seg), dim);
            });
      });
      if (!good) OP_REQUIRES_OK(ctx, FirstBadEntry(sg, num_rows));
      return;
    }
    DispatchDim(dim, [&](auto kDim) {
    constexpr int D = decltype(kDim)::value;
    RunChunks(ctx, parts, [&](int64_t p0, int64_t p1) {
      // The entries whose row this part owns, listed without a branch (the
      // rows are random: a skip test per entry mispredicts half the time),
      // then added in entry order (the same sums on any number of parts).
      int32_t* const mine = EntryList(sg.entries);
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t lo = num_rows * p / parts;
        const uint32_t span =
            static_cast<uint32_t>(num_rows * (p + 1) / parts - lo);
        std::memset(out + lo * dim, 0, sizeof(float) * span * dim);
        int64_t n = 0;
        for (int64_t k = 0; k < sg.entries; ++k) {
          mine[n] = static_cast<int32_t>(k);
          n += static_cast<uint32_t>(sg.idx[k] - lo) < span;
        }
        for (int64_t i = 0; i < n; ++i) {
          if (i + kAhead < n) {
            __builtin_prefetch(
                out + static_cast<int64_t>(sg.idx[mine[i + kAhead]]) * dim, 1);
          }
          const int64_t k = mine[i];
          const int64_t s = sg.seg[k];
          Axpy<D>(out + static_cast<int64_t>(sg.idx[k]) * dim, grad + s * dim,
                  factor(s), dim);
        }
      }
    });
    });
  }
};

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

REGISTER_KERNEL_BUILDER(Name("TnetSegmentCombine").Device(tf::DEVICE_CPU),
                        TnetSegmentCombineOp);
REGISTER_KERNEL_BUILDER(Name("TnetSegmentCombineGrad").Device(tf::DEVICE_CPU),
                        TnetSegmentCombineGradOp);

}  // namespace tnet
