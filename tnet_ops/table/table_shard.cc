#include "tnet_ops/table/table_shard.h"

#include <algorithm>
#include <cstring>

#include "tnet_ops/optimizers/rules.h"
#include "tnet_ops/table/stripe.h"

namespace tnet {

namespace {

int Log2(int x) {
  int r = 0;
  while ((1 << r) < x) ++r;
  return r;
}


}  // namespace


TableShard::TableShard(const TableConfig& config)
    : config_(config),
      num_slots_(NumSlotsFor(config.optimizer.rule, config.dim)),
      row_bytes_(sizeof(int64_t) + sizeof(float) * (config.dim + num_slots_) +
                 sizeof(RowMeta)),
      meta_offset_(sizeof(int64_t) + sizeof(float) * (config.dim + num_slots_)),
      stripe_shift_(64 - Log2(config.num_stripes)) {
  stripes_.reserve(config.num_stripes);
  const int64_t n = config.num_stripes;
  for (int i = 0; i < config.num_stripes; ++i) {
    stripes_.emplace_back(new Stripe(row_bytes_));
    Stripe* s = stripes_.back().get();
    // Shares of max_rows that sum to it exactly.
    if (config.max_rows > 0) {
      s->row_cap = static_cast<uint64_t>(config.max_rows / n +
                                         (i < config.max_rows % n ? 1 : 0));
    }
    s->pending_cap = static_cast<size_t>(
        std::max<int64_t>(16, config.admission_capacity / n));
  }
  if (config.memory_budget_bytes > 0) {
    tier_file_ = TierFile::Create(config.storage_dir, row_bytes_, &tier_error_);
    if (tier_file_) {
      const uint64_t budget_rows = std::max<uint64_t>(
          1, static_cast<uint64_t>(config.memory_budget_bytes) / row_bytes_ /
                  static_cast<uint64_t>(n));
      for (auto& s : stripes_) s->arena.EnableTier(tier_file_.get(), budget_rows);
    }
  }
}

std::string TableShard::TierError(bool* fatal) const {
  if (fatal != nullptr) *fatal = true;
  if (!tier_error_.empty()) return tier_error_;
  std::string full;
  for (const auto& s : stripes_) {
    std::lock_guard<std::mutex> lock(s->mu);
    const RowTier* t = s->arena.tier();
    if (t != nullptr && t->failed()) return t->error();
    if (t != nullptr && t->full() && full.empty()) full = t->error();
  }
  if (fatal != nullptr) *fatal = false;
  return full;
}

bool TableShard::EndStripeOp(Stripe* s) {
  if (s->added != 0) {
    size_.fetch_add(s->added, std::memory_order_relaxed);
    s->added = 0;
  }
  if (s->admitted != 0) {
    admitted_.fetch_add(s->admitted, std::memory_order_relaxed);
    s->admitted = 0;
  }
  RowTier* t = s->arena.tier();
  if (t == nullptr) return true;
  t->Trim();
  return !t->failed() && !t->full();
}

TableShard::~TableShard() = default;

int64_t TableShard::MemoryBytes() const {
  int64_t total = sizeof(TableShard);
  for (const auto& s : stripes_) {
    std::lock_guard<std::mutex> lock(s->mu);
    total += sizeof(Stripe) + s->index.MemoryBytes() + s->arena.MemoryBytes() +
             s->PendingBytes();
  }
  return total;
}

TableStats TableShard::Stats() const {
  TableStats t;
  t.bytes = MemoryBytes();
  for (const auto& s : stripes_) {
    std::lock_guard<std::mutex> lock(s->mu);
    t.pending += static_cast<int64_t>(s->pending.size());
  }
  t.rows = Size();
  t.admitted = admitted_.load(std::memory_order_relaxed);
  t.rejected = rejected_.load(std::memory_order_relaxed);
  t.evicted = evicted_.load(std::memory_order_relaxed);
  t.pending_dropped = pending_dropped_.load(std::memory_order_relaxed);
  t.cap_evicted = cap_evicted_.load(std::memory_order_relaxed);
  t.tier_lookups = tier_lookups_.load(std::memory_order_relaxed);
  t.tier_misses = tier_misses_.load(std::memory_order_relaxed);
  if (tier_file_) {
    for (const auto& s : stripes_) {
      std::lock_guard<std::mutex> lock(s->mu);
      const TierStats ts = s->arena.tier()->Stats();
      t.tier_resident += ts.resident;
      t.tier_on_disk += ts.on_disk;
      t.tier_writebacks += ts.writebacks;
    }
    t.tier_disk_bytes = static_cast<int64_t>(tier_file_->bytes());
  }
  return t;
}

void TableShard::BumpMaxStamp(int64_t stamp) {
  int64_t prev = max_stamp_.load(std::memory_order_relaxed);
  while (stamp > prev && !max_stamp_.compare_exchange_weak(prev, stamp)) {
  }
}

void TableShard::LogDeleted(Stripe* s, int64_t key) {
  if (!tracking()) return;
  const int64_t cap = std::max<int64_t>(int64_t{1} << 16, Size() / 2);
  if (log_size_.fetch_add(1, std::memory_order_relaxed) >= cap) {
    log_size_.fetch_sub(1, std::memory_order_relaxed);
    log_dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  s->deleted.push_back(key);
}

int64_t TableShard::MarkChanges(bool enable) {
  // Callers stop training first (a checkpoint does); the stripe locks only
  // keep the logs consistent.
  for (auto& s : stripes_) {
    std::lock_guard<std::mutex> lock(s->mu);
    std::vector<int64_t>().swap(s->deleted);
  }
  log_size_.store(0, std::memory_order_relaxed);
  log_dropped_.store(0, std::memory_order_relaxed);
  untracked_.store(0, std::memory_order_relaxed);
  mark_.store(enable ? max_stamp_.load(std::memory_order_relaxed) : -1,
              std::memory_order_relaxed);
  return generation_.fetch_add(1, std::memory_order_relaxed) + 1;
}

ChangeInfo TableShard::Changes(std::vector<int64_t>* deleted) const {
  ChangeInfo c;
  c.generation = generation_.load(std::memory_order_relaxed);
  c.mark = mark_.load(std::memory_order_relaxed);
  c.untracked = untracked_.load(std::memory_order_relaxed);
  c.dropped = log_dropped_.load(std::memory_order_relaxed);
  if (deleted != nullptr) {
    for (const auto& s : stripes_) {
      std::lock_guard<std::mutex> lock(s->mu);
      deleted->insert(deleted->end(), s->deleted.begin(), s->deleted.end());
    }
  }
  return c;
}

void TableShard::ExportPending(std::vector<int64_t>* keys,
                               std::vector<float>* counts,
                               std::vector<int64_t>* ages) const {
  for (const auto& s : stripes_) {
    std::lock_guard<std::mutex> lock(s->mu);
    const uint32_t now = s->tick;
    s->pending.ForEach([&](const PendingMap::Slot& e) {
      keys->push_back(e.key);
      counts->push_back(e.count);
      ages->push_back(static_cast<int64_t>(now - e.tick));  // wrap-safe
    });
  }
}

void TableShard::ImportPending(const int64_t* keys, const float* counts,
                               const int64_t* ages, int64_t n, bool replace) {
  if (replace) {
    for (auto& s : stripes_) {
      std::lock_guard<std::mutex> lock(s->mu);
      s->pending.Filter([](const PendingMap::Slot&) { return false; });
      s->tick = 0;
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = Mix64(static_cast<uint64_t>(keys[i]));
    Stripe* s = stripes_[StripeOf(h)].get();
    std::lock_guard<std::mutex> lock(s->mu);
    const RowArena& arena = s->arena;
    if (s->index.Find(keys[i], h, [&arena](uint32_t r) {
          return KeyOf(arena.Row(r));
        }) != HashIndex::kNotFound) {
      s->arena.Trim();
      continue;  // the key has a row: nothing waits for it
    }
    const uint32_t tick = s->tick - static_cast<uint32_t>(ages[i]);
    PendingMap::Slot* p = s->pending.Find(keys[i], h);
    if (p != nullptr) {
      p->count = counts[i];
      p->tick = tick;
    } else {
      s->pending.Insert(keys[i], h, counts[i], tick);
      if (s->pending.size() > s->pending_cap) DropPending(s);
    }
  }
}

void TableShard::Counters(int64_t* out) const {
  out[0] = admitted_.load(std::memory_order_relaxed);
  out[1] = rejected_.load(std::memory_order_relaxed);
  out[2] = evicted_.load(std::memory_order_relaxed);
  out[3] = pending_dropped_.load(std::memory_order_relaxed);
  out[4] = cap_evicted_.load(std::memory_order_relaxed);
}

void TableShard::SetCounters(const int64_t* in) {
  admitted_.store(in[0], std::memory_order_relaxed);
  rejected_.store(in[1], std::memory_order_relaxed);
  evicted_.store(in[2], std::memory_order_relaxed);
  pending_dropped_.store(in[3], std::memory_order_relaxed);
  cap_evicted_.store(in[4], std::memory_order_relaxed);
}

void TableShard::InitRow(char* row, int64_t key, float start_scale) {
  SetKey(row, key);
  // While changes are tracked, a new row is stamped above the mark so an
  // export since the mark finds it even if no push follows (a pull that
  // inserts in training); the push that usually follows restamps it.
  int64_t stamp = max_step_.load(std::memory_order_relaxed);
  const int64_t mark = mark_.load(std::memory_order_relaxed);
  // (Not counted in max_stamp_ here: Push and Import overwrite the stamp
  // at once; Pull counts the rows it leaves with this stamp.)
  if (mark >= 0 && stamp <= mark) stamp = mark + 1;
  SetMeta(row, {stamp, 0.0f, 0.0f});
  InitializeRow(config_.initializer, key, config_.dim, WeightsOf(row));
  InitSlotsScaled(config_.optimizer, config_.dim, start_scale, SlotsOf(row));
}

char* TableShard::FindOrInsert(Stripe* s, int64_t key, uint64_t h, bool* ok,
                                bool* inserted, bool init, uint32_t* id_out,
                                float start_scale) {
  const RowArena& arena = s->arena;
  uint32_t id = s->index.Find(
      key, h, [&arena](uint32_t r) { return KeyOf(arena.Row(r)); });
  if (id_out != nullptr) *id_out = id;
  if (id != HashIndex::kNotFound) return s->arena.Row(id);
  if (!s->arena.Allocate(&id)) {
    *ok = false;
    return nullptr;
  }
  if (id_out != nullptr) *id_out = id;
  char* row = s->arena.Row(id);
  if (init) {
    InitRow(row, key, start_scale);
  } else {
    SetKey(row, key);
  }
  s->index.Insert(h, id);
  ++s->added;
  if (inserted != nullptr) *inserted = true;
  return row;
}

char* TableShard::FindOrAdmit(Stripe* s, int64_t key, uint64_t h, float show,
                               float click, int64_t step, bool* ok,
                               bool* fresh, float start_scale) {
  const RowArena& arena = s->arena;
  const uint32_t id = s->index.Find(
      key, h, [&arena](uint32_t r) { return KeyOf(arena.Row(r)); });
  if (id != HashIndex::kNotFound) return s->arena.Row(id);
  PendingMap::Slot* p = s->pending.Find(key, h);
  const float count = (p == nullptr ? 0.0f : p->count) + show;
  if (count < config_.min_count) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    const uint32_t tick = ++s->tick;
    if (p != nullptr) {
      p->count = count;
      p->tick = tick;
    } else {
      s->pending.Insert(key, h, count, tick);
      if (s->pending.size() > s->pending_cap) DropPending(s);
    }
    return nullptr;
  }
  if (p != nullptr) s->pending.Erase(p);
  bool inserted = false;
  char* row = FindOrInsert(s, key, h, ok, &inserted, true, nullptr,
                           start_scale);
  if (row == nullptr) return nullptr;
  SetMeta(row, {step, count, click});
  ++s->admitted;
  *fresh = true;
  return row;
}

void TableShard::DropPending(Stripe* s) {
  // Drops half the map: the lowest counts, and among equal counts the
  // least recently counted (ticks are distinct, so exactly half goes).
  struct Entry {
    float count;
    uint32_t age;  // ticks since the last update (wrap-safe)
  };
  std::vector<Entry> entries;
  entries.reserve(s->pending.size());
  const uint32_t now = s->tick;
  s->pending.ForEach([&](const PendingMap::Slot& e) {
    entries.push_back({e.count, now - e.tick});
  });
  const size_t drop = entries.size() / 2;
  if (drop == 0) return;
  auto colder = [](const Entry& a, const Entry& b) {
    if (a.count != b.count) return a.count < b.count;
    return a.age > b.age;
  };
  std::nth_element(entries.begin(), entries.begin() + (drop - 1),
                   entries.end(), colder);
  // Ticks are distinct, so (count, age) orders entries strictly: exactly
  // the `drop` entries not after the pivot go.
  const Entry pivot = entries[drop - 1];
  s->pending.Filter([&](const PendingMap::Slot& e) {
    return colder(pivot, Entry{e.count, now - e.tick});
  });
  pending_dropped_.fetch_add(static_cast<int64_t>(drop),
                             std::memory_order_relaxed);
}

int64_t TableShard::EnforceCap(Stripe* s) {
  if (s->row_cap == 0 || s->index.size() <= s->row_cap) return 0;
  // Free down to 90% of the cap, so the scan below runs once per ~cap/10
  // inserts instead of once per insert.
  const uint64_t target = s->row_cap - std::max<uint64_t>(1, s->row_cap / 10);
  const uint64_t n_free = s->index.size() - target;
  // The order is a function of what a row holds (show, last_step, key):
  // never of where it sits in the arena, which a restore does not keep
  // (imported rows are packed in the checkpoint's order, and rows freed
  // before a save leave holes that new keys fill only in the saving run).
  // Among equal shows and last_steps the key's hash decides (Mix64 is a
  // bijection, so the order is strict): a resumed run frees the same rows.
  struct Victim {
    float show;
    int64_t last_step;
    uint64_t h;  // Mix64(key)
    uint32_t row;
  };
  std::vector<Victim> rows;
  rows.reserve(s->index.size());
  const uint32_t last = s->arena.end();
  std::vector<char> buf(row_bytes_);
  for (uint32_t r = 0; r < last; ++r) {
    if (!s->arena.IsLive(r)) continue;
    const char* row = s->arena.Peek(r, buf.data());
    if (row == nullptr) return 0;  // the tier failed; the op reports it
    const RowMeta m = MetaOf(row);
    rows.push_back({m.show, m.last_step,
                    Mix64(static_cast<uint64_t>(KeyOf(row))), r});
  }
  auto colder = [](const Victim& a, const Victim& b) {
    if (a.show != b.show) return a.show < b.show;
    if (a.last_step != b.last_step) return a.last_step < b.last_step;
    return a.h < b.h;
  };
  std::nth_element(rows.begin(), rows.begin() + (n_free - 1), rows.end(),
                   colder);
  for (uint64_t i = 0; i < n_free; ++i) {
    const uint32_t r = rows[i].row;
    const char* row = s->arena.Peek(r, buf.data());
    if (row == nullptr) return 0;
    const int64_t key = KeyOf(row);
    LogDeleted(s, key);
    s->index.EraseRow(rows[i].h, r);
    s->arena.Free(r);
  }
  const int64_t freed = static_cast<int64_t>(n_free);
  size_.fetch_sub(freed, std::memory_order_relaxed);
  evicted_.fetch_add(freed, std::memory_order_relaxed);
  cap_evicted_.fetch_add(freed, std::memory_order_relaxed);
  return freed;
}

void TableShard::GroupByStripe(const int64_t* keys, int64_t n,
                                const ParallelRunner& run,
                                UninitVector<Item>* items,
                                std::vector<int64_t>* offsets) const {
  const int num_stripes = config_.num_stripes;
  items->resize(n);
  offsets->assign(num_stripes + 1, 0);
  // Counting sort in blocks: each block counts its keys per stripe, a prefix
  // sum over (stripe, block) gives every block its write position in every
  // stripe, then the blocks scatter their items. Blocks run in parallel.
  constexpr int64_t kBlock = 16384;
  const int64_t num_blocks = std::max<int64_t>(1, (n + kBlock - 1) / kBlock);
  std::vector<int64_t> pos(num_blocks * num_stripes, 0);
  auto count = [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t* c = pos.data() + b * num_stripes;
      const int64_t end = std::min(n, (b + 1) * kBlock);
      for (int64_t i = b * kBlock; i < end; ++i) {
        ++c[StripeOf(Mix64(static_cast<uint64_t>(keys[i])))];
      }
    }
  };
  Item* out = items->data();
  auto scatter = [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t* p = pos.data() + b * num_stripes;
      const int64_t end = std::min(n, (b + 1) * kBlock);
      for (int64_t i = b * kBlock; i < end; ++i) {
        const uint64_t h = Mix64(static_cast<uint64_t>(keys[i]));
        out[p[StripeOf(h)]++] = {h, keys[i], i};
      }
    }
  };
  if (num_blocks > 1) run(num_blocks, kBlock * 8, count);
  else count(0, 1);
  std::vector<int64_t>& off = *offsets;
  int64_t total = 0;
  for (int s = 0; s < num_stripes; ++s) {
    off[s] = total;
    for (int64_t b = 0; b < num_blocks; ++b) {
      const int64_t c = pos[b * num_stripes + s];
      pos[b * num_stripes + s] = total;
      total += c;
    }
  }
  off[num_stripes] = total;
  if (num_blocks > 1) run(num_blocks, kBlock * 12, scatter);
  else scatter(0, 1);
}

void TableShard::KeepGrouping(const int64_t* keys, int64_t n,
                              UninitVector<Item>* items,
                              std::vector<int64_t>* offsets,
                              UninitVector<uint32_t>* rows) {
  std::lock_guard<std::mutex> lock(grouping_mu_);
  kept_keys_.assign(keys, keys + n);
  kept_items_.swap(*items);
  kept_offsets_.swap(*offsets);
  kept_rows_.swap(*rows);
}

bool TableShard::TakeGrouping(const int64_t* keys, int64_t n,
                              UninitVector<Item>* items,
                              std::vector<int64_t>* offsets,
                              UninitVector<uint32_t>* rows) {
  std::lock_guard<std::mutex> lock(grouping_mu_);
  // The items group the pulled keys by position: they group this batch
  // when its keys are the pulled keys, position by position (one
  // sequential compare, not a random read per item).
  if (n == 0 || static_cast<int64_t>(kept_keys_.size()) != n ||
      static_cast<int64_t>(kept_items_.size()) != n ||
      std::memcmp(keys, kept_keys_.data(), sizeof(int64_t) * n) != 0) {
    return false;
  }
  items->swap(kept_items_);
  offsets->swap(kept_offsets_);
  rows->swap(kept_rows_);
  kept_keys_.clear();
  kept_items_.clear();
  kept_offsets_.clear();
  kept_rows_.clear();
  if (static_cast<int64_t>(rows->size()) != n) rows->clear();
  return true;
}

namespace {

// Software-pipeline distance (keys) of the batched loops: the index slot of
// key k + 2D is prefetched, key k + D is probed and its row prefetched, key
// k is read or updated.
// 16 measured best of 4, 8, 16, 32, 48 (1M rows, dim 16, 2 cores).
#ifndef TNET_PREFETCH_DISTANCE
#define TNET_PREFETCH_DISTANCE 16
#endif
constexpr int64_t kPrefetchDistance = TNET_PREFETCH_DISTANCE;
constexpr int64_t kRing = 64;  // power of two > kPrefetchDistance
static_assert(kRing > kPrefetchDistance && (kRing & (kRing - 1)) == 0, "");

}  // namespace

bool TableShard::Pull(const int64_t* keys, int64_t n, bool training,
                       float* out, const ParallelRunner& run,
                       float start_scale) {
  UninitVector<Item> items;
  std::vector<int64_t> off;
  GroupByStripe(keys, n, run, &items, &off);
  // A training pull records each item's row id for the push (KeepGrouping).
  UninitVector<uint32_t> ids;
  if (training) ids.resize(n);
  const int dim = config_.dim;
  const size_t read_bytes = sizeof(int64_t) + sizeof(float) * dim;
  std::atomic<bool> all_ok{true};
  run(config_.num_stripes, (n / config_.num_stripes + 1) * (dim + 40),
      [&](int64_t begin, int64_t end) {
        bool ok = true;
        uint32_t ring[kRing];
        for (int64_t si = begin; si < end; ++si) {
          const Item* it = items.data() + off[si];
          const int64_t m = off[si + 1] - off[si];
          if (m == 0) continue;
          Stripe* s = stripes_[si].get();
          std::lock_guard<std::mutex> lock(s->mu);
          const RowArena& arena = s->arena;
          const int64_t misses0 = arena.tier() ? arena.tier()->misses() : 0;
          if (RowTier* t = arena.tier(); t != nullptr && t->BeginBatch()) {
            for (int64_t k = 0; k < m; ++k) {
              t->ReadAhead(s->index.Candidate(it[k].h));
            }
          }
          constexpr int64_t D = kPrefetchDistance;
          for (int64_t k = -2 * D; k < m; ++k) {
            if (k + 2 * D < m) {
              __builtin_prefetch(s->index.HomeAddress(it[k + 2 * D].h));
            }
            if (k + D >= 0 && k + D < m) {
              const Item& x = it[k + D];
              const uint32_t c = s->index.Candidate(x.h);
              ring[(k + D) & (kRing - 1)] = c;
              if (c != HashIndex::kNotFound) {
                PrefetchRow<false>(arena.Row(c), read_bytes);
              }
              __builtin_prefetch(out + x.i * dim, 1);
            }
            if (k < 0) continue;
            const Item& x = it[k];
            float* dst = out + x.i * dim;
            const uint32_t c = ring[k & (kRing - 1)];
            char* row = nullptr;
            uint32_t id = c;
            if (c != HashIndex::kNotFound && KeyOf(arena.Row(c)) == x.key) {
              row = arena.Row(c);
            } else if (training && !admission()) {
              bool inserted = false;
              row = FindOrInsert(s, x.key, x.h, &ok, &inserted, true, &id,
                                 start_scale);
              if (inserted) {
                ++s->admitted;
                BumpMaxStamp(MetaOf(row).last_step);
              }
              if (row == nullptr) id = HashIndex::kNotFound;
            } else {
              id = s->index.Find(
                  x.key, x.h,
                  [&arena](uint32_t r) { return KeyOf(arena.Row(r)); });
              if (id != HashIndex::kNotFound) row = arena.Row(id);
            }
            if (training) ids[off[si] + k] = id;
            if (row != nullptr) {
              std::memcpy(dst, WeightsOf(row), sizeof(float) * dim);
            } else {
              std::memset(dst, 0, sizeof(float) * dim);
            }
          }
          if (training) EnforceCap(s);
          if (RowTier* t = s->arena.tier()) {
            tier_lookups_.fetch_add(m, std::memory_order_relaxed);
            tier_misses_.fetch_add(t->misses() - misses0,
                                   std::memory_order_relaxed);
          }
          if (!EndStripeOp(s)) ok = false;
        }
        if (!ok) all_ok = false;
      });
  if (training) KeepGrouping(keys, n, &items, &off, &ids);
  return all_ok;
}

template <typename Rule>
bool TableShard::PushWithRule(const int64_t* keys, int64_t n,
                               const float* grads, float lr, int64_t step,
                               const float* shows, const float* clicks, bool unique_keys,
                               const ParallelRunner& run, float start_scale) {
  UninitVector<Item> items;
  std::vector<int64_t> off;
  UninitVector<uint32_t> pulled;  // the pull's row id per item, or empty
  if (!TakeGrouping(keys, n, &items, &off, &pulled)) {
    pulled.clear();
    GroupByStripe(keys, n, run, &items, &off);
  }
  const uint32_t* hint = pulled.empty() ? nullptr : pulled.data();
  const int dim = config_.dim;
  const OptimizerConfig oc = ConfigForPush(config_.optimizer, start_scale);
  std::atomic<bool> all_ok{true};
  run(config_.num_stripes, (n / config_.num_stripes + 1) * (4 * dim + 60),
      [&](int64_t begin, int64_t end) {
        bool ok = true;
        // One group per distinct key in the stripe; duplicates are summed
        // into `sums` before the rule runs once per row.
        struct Group {
          int64_t item;      // index in `it` of the key's first occurrence
          int64_t sum = -1;  // offset in sums, or -1 if the key is unique
          float show;
          float click;
        };
        std::vector<Group> groups;
        std::vector<float> sums;
        std::vector<int32_t> seen;  // open addressing on h: group index
        uint32_t ring[kRing];
        for (int64_t si = begin; si < end; ++si) {
          const Item* it = items.data() + off[si];
          const int64_t m = off[si + 1] - off[si];
          if (m == 0) continue;
          // 1. Deduplicate the stripe's keys (no table access, no lock),
          // unless the caller says they are distinct already.
          groups.clear();
          sums.clear();
          if (unique_keys) {
            for (int64_t k = 0; k < m; ++k) {
              const int64_t i = it[k].i;
              groups.push_back({k, -1, shows ? shows[i] : 1.0f,
                                clicks ? clicks[i] : 0.0f});
            }
          }
          uint64_t cap = 4;
          while (cap < 2 * static_cast<uint64_t>(m)) cap *= 2;
          if (!unique_keys) seen.assign(cap, -1);
          for (int64_t k = 0; !unique_keys && k < m; ++k) {
            const Item& x = it[k];
            const float show = shows ? shows[x.i] : 1.0f;
            const float click = clicks ? clicks[x.i] : 0.0f;
            uint64_t slot = x.h & (cap - 1);
            while (seen[slot] >= 0 && it[groups[seen[slot]].item].key != x.key) {
              slot = (slot + 1) & (cap - 1);
            }
            if (seen[slot] < 0) {
              seen[slot] = static_cast<int32_t>(groups.size());
              groups.push_back({k, -1, show, click});
              continue;
            }
            Group& g = groups[seen[slot]];
            if (g.sum < 0) {
              g.sum = static_cast<int64_t>(sums.size());
              const float* g0 = grads + it[g.item].i * dim;
              sums.insert(sums.end(), g0, g0 + dim);
            }
            float* acc = sums.data() + g.sum;
            const float* gi = grads + x.i * dim;
            for (int j = 0; j < dim; ++j) acc[j] += gi[j];
            g.show += show;
            g.click += click;
          }
          // 2. Find (or insert) each row and apply the rule, pipelined.
          Stripe* s = stripes_[si].get();
          std::lock_guard<std::mutex> lock(s->mu);
          const RowArena& arena = s->arena;
          const int64_t misses0 = arena.tier() ? arena.tier()->misses() : 0;
          const int64_t ng = static_cast<int64_t>(groups.size());
          if (RowTier* t = arena.tier(); t != nullptr && t->BeginBatch()) {
            for (int64_t k = 0; k < ng; ++k) {
              t->ReadAhead(s->index.Candidate(it[groups[k].item].h));
            }
          }
          constexpr int64_t D = kPrefetchDistance;
          // The pull's row ids, where kept, stand in for the index probe
          // (a candidate confirmed below as any other: live, same key).
          const uint32_t* hints = hint != nullptr ? hint + off[si] : nullptr;
          for (int64_t k = -2 * D; k < ng; ++k) {
            if (hints == nullptr && k + 2 * D < ng) {
              __builtin_prefetch(
                  s->index.HomeAddress(it[groups[k + 2 * D].item].h));
            }
            if (k + D >= 0 && k + D < ng) {
              const Group& g = groups[k + D];
              const Item& x = it[g.item];
              uint32_t c;
              if (hints == nullptr) {
                c = s->index.Candidate(x.h);
              } else {
                c = hints[g.item];
                if (c != HashIndex::kNotFound && !arena.IsLive(c)) {
                  c = HashIndex::kNotFound;
                }
              }
              ring[(k + D) & (kRing - 1)] = c;
              if (c != HashIndex::kNotFound) {
                PrefetchRow<true>(arena.Row(c), row_bytes_);
              }
              if (g.sum < 0) {
                PrefetchRow<false>(
                    reinterpret_cast<const char*>(grads + x.i * dim),
                    sizeof(float) * dim);
              }
            }
            if (k < 0) continue;
            const Group& g = groups[k];
            const Item& x = it[g.item];
            const uint32_t c = ring[k & (kRing - 1)];
            char* row;
            if (c != HashIndex::kNotFound && KeyOf(arena.Row(c)) == x.key) {
              row = arena.Row(c);
            } else if (admission()) {
              bool fresh = false;
              row = FindOrAdmit(s, x.key, x.h, g.show, g.click, step, &ok,
                                &fresh, start_scale);
              if (row == nullptr || fresh) continue;
            } else {
              bool inserted = false;
              row = FindOrInsert(s, x.key, x.h, &ok, &inserted, true,
                                 nullptr, start_scale);
              if (row == nullptr) continue;
              if (inserted) ++s->admitted;
            }
            const float* grad =
                g.sum < 0 ? grads + x.i * dim : sums.data() + g.sum;
            Rule::Apply(oc, lr, dim, grad, WeightsOf(row), SlotsOf(row));
            RowMeta meta = MetaOf(row);
            meta.show += g.show;
            meta.click += g.click;
            meta.last_step = step;
            SetMeta(row, meta);
          }
          EnforceCap(s);
          if (RowTier* t = s->arena.tier()) {
            tier_lookups_.fetch_add(ng, std::memory_order_relaxed);
            tier_misses_.fetch_add(t->misses() - misses0,
                                   std::memory_order_relaxed);
          }
          if (!EndStripeOp(s)) ok = false;
        }
        if (!ok) all_ok = false;
      });
  return all_ok;
}

bool TableShard::Push(const int64_t* keys, int64_t n, const float* grads,
                       float lr, int64_t step, const float* shows,
                       const float* clicks, const ParallelRunner& run,
                       bool unique_keys, float start_scale) {
  int64_t prev = max_step_.load(std::memory_order_relaxed);
  while (step > prev && !max_step_.compare_exchange_weak(prev, step)) {
  }
  BumpMaxStamp(step);
  const int64_t mark = mark_.load(std::memory_order_relaxed);
  if (mark >= 0 && step <= mark && n > 0) {
    untracked_.fetch_add(n, std::memory_order_relaxed);
  }
  return DispatchRule(config_.optimizer.rule, [&](auto rule) {
    return PushWithRule<decltype(rule)>(keys, n, grads, lr, step, shows,
                                        clicks, unique_keys, run,
                                        start_scale);
  });
}

}  // namespace tnet
