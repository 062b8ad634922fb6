// TableShard's whole-table row passes: the export cursor, import (restore)
// and eviction. Pull and push (the per-step path) are in table_shard.cc.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

#include "tnet_ops/table/table_shard.h"
#include "tnet_ops/table/stripe.h"

namespace tnet {

namespace {

// An export cursor is (stripe << 40) | next row number in that stripe.
constexpr int kCursorRowBits = 40;
constexpr int64_t kCursorRowMask = (int64_t{1} << kCursorRowBits) - 1;

}  // namespace

bool TableShard::ValidCursor(int64_t cursor) const {
  if (cursor == -1) return true;
  if (cursor < 0) return false;
  return (cursor >> kCursorRowBits) < config_.num_stripes;
}

int64_t TableShard::Export(int64_t cursor, int64_t max_rows,
                            int64_t since_step, std::vector<int64_t>* keys,
                            std::vector<float>* weights,
                            std::vector<float>* slots,
                            std::vector<RowMeta>* meta) const {
  if (cursor < 0) return -1;
  int64_t si = cursor >> kCursorRowBits;
  uint64_t r = static_cast<uint64_t>(cursor & kCursorRowMask);
  const int dim = config_.dim;
  int64_t budget = max_rows;
  while (si < config_.num_stripes && budget > 0) {
    Stripe* s = stripes_[si].get();
    std::lock_guard<std::mutex> lock(s->mu);
    const uint64_t end = s->arena.end();
    // Rows on disk are read without entering the tier's cache.
    std::vector<char> buf(row_bytes_);
    for (; r < end && budget > 0; ++r) {
      if (!s->arena.IsLive(static_cast<uint32_t>(r))) continue;
      const char* row = s->arena.Peek(static_cast<uint32_t>(r), buf.data());
      if (row == nullptr) return -2;  // the tier failed (TierError())
      if (since_step >= 0 && MetaOf(row).last_step <= since_step) continue;
      keys->push_back(KeyOf(row));
      const float* w = WeightsOf(const_cast<char*>(row));
      weights->insert(weights->end(), w, w + dim);
      if (slots != nullptr) {
        const float* sl = SlotsOf(const_cast<char*>(row));
        slots->insert(slots->end(), sl, sl + num_slots_);
      }
      if (meta != nullptr) meta->push_back(MetaOf(row));
      --budget;
    }
    if (r >= end) {
      ++si;
      r = 0;
    }
  }
  if (si >= config_.num_stripes) return -1;
  return (si << kCursorRowBits) | static_cast<int64_t>(r);
}

bool TableShard::Import(const int64_t* keys, int64_t n, const float* weights,
                         const float* slots, const RowMeta* meta,
                         const ParallelRunner& run) {
  UninitVector<Item> items;
  std::vector<int64_t> off;
  GroupByStripe(keys, n, run, &items, &off);
  const int dim = config_.dim;
  std::atomic<bool> all_ok{true};
  int64_t max_stamp = 0, at_or_below_mark = 0;
  const int64_t mark = mark_.load(std::memory_order_relaxed);
  for (int64_t i = 0; i < n; ++i) {
    max_stamp = std::max(max_stamp, meta[i].last_step);
    if (meta[i].last_step <= mark) ++at_or_below_mark;
  }
  BumpMaxStamp(max_stamp);
  // Imported rows an export since the mark would not see (a restore marks
  // again afterwards; any other import of old rows forces a full save).
  if (at_or_below_mark > 0) {
    untracked_.fetch_add(at_or_below_mark, std::memory_order_relaxed);
  }
  run(config_.num_stripes, (n / config_.num_stripes + 1) * (2 * dim + 60),
      [&](int64_t begin, int64_t end) {
        bool ok = true;
        for (int64_t si = begin; si < end; ++si) {
          if (off[si] == off[si + 1]) continue;
          Stripe* s = stripes_[si].get();
          std::lock_guard<std::mutex> lock(s->mu);
          // Probe with the slots of the next keys already on their way: a
          // restore inserts every key of a table at a random slot, and at
          // 200M rows waited on memory for each (BENCHMARKS.md, "Restore
          // as fast as save").
          constexpr int64_t kAhead = 16;
          for (int64_t k = off[si]; k < std::min(off[si] + kAhead, off[si + 1]); ++k) {
            __builtin_prefetch(s->index.HomeAddress(items[k].h));
          }
          for (int64_t k = off[si]; k < off[si + 1]; ++k) {
            if (k + kAhead < off[si + 1]) {
              __builtin_prefetch(s->index.HomeAddress(items[k + kAhead].h));
            }
            const int64_t i = items[k].i;
            char* row = FindOrInsert(s, items[k].key, items[k].h, &ok,
                                     nullptr, /*init=*/false);
            if (row == nullptr) continue;
            std::memcpy(WeightsOf(row), weights + i * dim, sizeof(float) * dim);
            std::memcpy(SlotsOf(row), slots + i * num_slots_,
                        sizeof(float) * num_slots_);
            SetMeta(row, meta[i]);
            // A restore imports a stripe's rows in large batches: keep the
            // tier's cache near its budget within the batch too.
            if (((k - off[si]) & 1023) == 1023) s->arena.Trim();
          }
          EnforceCap(s);
          if (!EndStripeOp(s)) ok = false;
        }
        if (!ok) all_ok = false;
      });
  return all_ok;
}

EvictStats TableShard::Evict(float show_decay_rate, float show_threshold,
                              int64_t ttl_steps, int64_t current_step,
                              bool compact, const ParallelRunner& run) {
  std::atomic<int64_t> evicted{0};
  run(config_.num_stripes, (Size() / config_.num_stripes + 1) * 30,
      [&](int64_t begin, int64_t end) {
        for (int64_t si = begin; si < end; ++si) {
          Stripe* s = stripes_[si].get();
          std::lock_guard<std::mutex> lock(s->mu);
          int64_t freed = 0, untracked = 0;
          const int64_t mark = mark_.load(std::memory_order_relaxed);
          const uint32_t last = s->arena.end();
          for (uint32_t r = 0; r < last; ++r) {
            if (!s->arena.IsLive(r)) continue;
            // With a disk tier, rows pass through the cache: keep it near
            // its budget (no row pointer is held across iterations).
            if ((r & 1023) == 0) s->arena.Trim();
            char* row = s->arena.Row(r);
            RowMeta m = MetaOf(row);
            const float old_show = m.show;
            m.show *= show_decay_rate;
            SetMeta(row, m);
            const bool cold = m.show < show_threshold;
            const bool stale =
                ttl_steps > 0 && current_step - m.last_step > ttl_steps;
            if (!cold && !stale) {
              // A decayed show is a change an export since the mark misses.
              if (mark >= 0 && m.last_step <= mark &&
                  std::memcmp(&old_show, &m.show, sizeof(float)) != 0) {
                ++untracked;
              }
              continue;
            }
            LogDeleted(s, KeyOf(row));
            s->index.EraseRow(Mix64(static_cast<uint64_t>(KeyOf(row))), r);
            s->arena.Free(r);
            ++freed;
          }
          s->arena.Trim();
          if (freed > 0 && compact) {
            s->arena.Compact([&](uint32_t from, uint32_t to) {
              const int64_t key = KeyOf(s->arena.Row(to));
              s->index.UpdateRow(Mix64(static_cast<uint64_t>(key)), from, to);
            });
          }
          if (untracked > 0) {
            untracked_.fetch_add(untracked, std::memory_order_relaxed);
          }
          if (freed > 0) {
            s->index.MaybeShrink();
            size_.fetch_sub(freed, std::memory_order_relaxed);
            evicted.fetch_add(freed, std::memory_order_relaxed);
            evicted_.fetch_add(freed, std::memory_order_relaxed);
          }
        }
      });
  return {evicted.load(), Size()};
}

}  // namespace tnet
