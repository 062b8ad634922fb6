// TnetUnique replaces tf.unique + bincount (single-threaded, one pass each):
// each thread dedups a contiguous chunk of the batch into its own map, the
// chunks' maps are merged in chunk order (so unique keys come in order of
// first occurrence, exactly tf.unique's whatever the thread count) and the
// later chunks' indices renumbered. Padding (valid = false) gets index -1
// and is never counted.
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
#include "tnet_ops/table/hash.h"

namespace tnet {

namespace tf = ::tensorflow;

namespace {

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

REGISTER_KERNEL_BUILDER(Name("TnetUnique").Device(tf::DEVICE_CPU),
                        TnetUniqueOp);

}  // namespace tnet
