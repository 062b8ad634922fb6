// TableShard: one shard of an embedding table, key int64 -> row.
//
// A row holds [key int64][weights dim][slots][last_step int64, show f32,
// click f32], packed: its size is a multiple of 4 only, so the int64 fields
// may be misaligned and are read and written through memcpy.
// Keys are spread over power-of-two stripes by the high bits of Mix64(key);
// each stripe has its own mutex, open-addressing index and row arena. A
// batch operation first groups its keys by stripe and then takes each
// stripe's lock once, so stripes run in parallel on the caller's thread pool
// and every row update is atomic under its stripe's lock (no lost updates).
//
// This file knows nothing about TensorFlow; kernels/ adapts tensors to it.
#ifndef TNET_OPS_TABLE_TABLE_SHARD_H_
#define TNET_OPS_TABLE_TABLE_SHARD_H_

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tnet_ops/optimizers/rules.h"
#include "tnet_ops/table/hash_index.h"
#include "tnet_ops/table/initializer.h"
#include "tnet_ops/table/pending_map.h"
#include "tnet_ops/table/row_arena.h"

namespace tnet {

// A std::vector whose resize(n) leaves new elements default-initialized
// (for trivial types: not written), where the caller overwrites them all
// anyway: a batch's grouping (24 bytes a key) and its row ids were zeroed
// on every pull and push only to be overwritten.
template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() = default;
  template <typename U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept(
      std::is_nothrow_default_constructible<U>::value) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
template <typename T>
using UninitVector = std::vector<T, DefaultInitAllocator<T>>;

struct TableConfig {
  int dim = 8;
  OptimizerConfig optimizer;
  InitializerConfig initializer;
  int num_stripes = 64;  // power of two
  // Lifecycle (see Admission and Cap below). min_count <= 1 admits every
  // key on first sight, as a table without admission does.
  float min_count = 1.0f;
  int64_t admission_capacity = 1 << 20;  // pending keys per shard
  int64_t max_rows = 0;                  // per shard; 0 = unbounded
  // Disk tier (row_tier.h): > 0 keeps at most this many bytes of rows
  // (weights + slots + meta) in memory per shard and the rest in a file in
  // storage_dir; 0 holds every row in memory.
  int64_t memory_budget_bytes = 0;
  std::string storage_dir;
};

// Runs fn(begin, end) over [0, n) work items, possibly in parallel; `cost`
// is a rough per-item cost in cycles for the splitter.
using ParallelRunner =
    std::function<void(int64_t n, int64_t cost,
                       const std::function<void(int64_t, int64_t)>& fn)>;

// Per-row metadata: the 16 bytes after a row's slots (in this order), and
// what Export / Import carry beside weights and slots.
struct RowMeta {
  int64_t last_step;
  float show;
  float click;
};
static_assert(sizeof(RowMeta) == 16, "row meta is 16 bytes");

// Outcome of one eviction pass.
struct EvictStats {
  int64_t evicted = 0;
  int64_t remaining = 0;
};

// Change tracking for incremental checkpoints (MarkChanges / Changes).
struct ChangeInfo {
  int64_t generation = 0;  // bumped by every MarkChanges
  int64_t mark = -1;       // the mark's step; -1: not tracking
  int64_t untracked = 0;   // row changes an export since `mark` misses
  int64_t dropped = 0;     // deletions the bounded log could not hold
};

// Lifecycle counters of one shard since it was created (Stats()).
struct TableStats {
  int64_t rows = 0;             // live rows now
  int64_t admitted = 0;         // rows created by pulls / pushes (not imports)
  int64_t rejected = 0;         // pushed keys dropped: not admitted yet
  int64_t evicted = 0;          // rows freed by Evict and by the row cap
  int64_t bytes = 0;            // MemoryBytes()
  int64_t pending = 0;          // keys counted towards admission now
  int64_t pending_dropped = 0;  // pending counts dropped when the map was full
  int64_t cap_evicted = 0;      // the part of `evicted` freed by the row cap
  // Disk tier (all 0 without one):
  int64_t tier_lookups = 0;     // rows pulled or pushed through the tier
  int64_t tier_misses = 0;      // the part of them read from disk
  int64_t tier_resident = 0;    // rows in the memory cache now
  int64_t tier_on_disk = 0;     // rows only on disk now
  int64_t tier_disk_bytes = 0;  // size of the tier's file
  int64_t tier_writebacks = 0;  // rows written back to disk
};

class TableShard {
 public:
  explicit TableShard(const TableConfig& config);
  ~TableShard();

  const TableConfig& config() const { return config_; }
  int dim() const { return config_.dim; }
  int num_slots() const { return num_slots_; }
  int64_t Size() const { return size_.load(std::memory_order_relaxed); }
  int64_t MemoryBytes() const;
  TableStats Stats() const;
  // Empty, or why the disk tier could not be created or failed (an I/O
  // error); once it failed, operations report failure (return false).
  // *fatal (if given): whether the table lost data (false: the disk is
  // full, the table is intact and goes on when there is space again).
  std::string TierError(bool* fatal = nullptr) const;

  // Admission (min_count > 1): a key gets a row only once pushes have
  // brought its show count (the `shows` input, or 1 per occurrence) to
  // min_count. Until then Pull reads zeros even in training and inserts
  // nothing, and Push adds the shows to the key's pending count and drops
  // its gradient (counted in `rejected`). The push that reaches min_count
  // inserts the row from the key-seeded initializer with show = the pending
  // count and last_step = step, and applies no gradient (the gradient was
  // computed against the zeros the key read). Pending counts live in an
  // exact per-stripe map of at most admission_capacity / num_stripes keys;
  // when a stripe's map is full, half of its keys are dropped (lowest counts
  // first, least recently counted first among equal counts; pending_dropped):
  // those keys start counting again, so a key is admitted late, never early
  // (no false admissions).
  //
  // Cap (max_rows > 0): each stripe holds at most its share of max_rows
  // (the shares sum to max_rows). When an operation leaves a stripe above
  // its share, the stripe frees its lowest-show rows (older last_step first
  // among equal shows, then a fixed hash order of the keys: never the rows'
  // places in memory, so a restored table frees the same rows) down to 90%
  // of its share before the operation returns, still under the stripe
  // lock, so Size() never exceeds max_rows between operations; during one
  // operation a stripe may briefly hold the batch's new keys on top. Freed
  // rows and chunks are reused.

  // out[n * dim]. training: missing keys get a row initialized from the key
  // (unless admission holds them back); otherwise missing keys read zeros
  // and nothing is inserted.
  // Returns false if memory ran out (the rows inserted so far stay).
  // start_scale multiplies the accumulator start of the rows this pull
  // inserts (StartScale in rules.h; 1: the start as configured).
  bool Pull(const int64_t* keys, int64_t n, bool training, float* out,
            const ParallelRunner& run, float start_scale = 1.0f);

  // Applies the optimizer to each key's row, inserting missing keys first.
  // Duplicate keys are summed (gradient, shows, clicks) before the update.
  // shows/clicks may be null (each occurrence then counts one show and no
  // click). Inputs must already be validated (finite, sizes).
  // unique_keys: the caller guarantees distinct keys, so the summing pass
  // is skipped (a repeated key would then be updated once per occurrence).
  bool Push(const int64_t* keys, int64_t n, const float* grads, float lr,
            int64_t step, const float* shows, const float* clicks,
            const ParallelRunner& run, bool unique_keys = false,
            float start_scale = 1.0f);

  // Copies up to max_rows live rows starting at `cursor` (0 = start) and
  // returns the cursor to continue from, or -1 when the table is exhausted.
  // Rows never move, so a row that stays live during a multi-call export is
  // returned exactly once. since_step >= 0 returns only rows whose
  // last_step > since_step (the others are skipped without counting against
  // max_rows); -1 returns every row. slots and meta may be null (a
  // weights-only export). Returns -2 if the disk tier failed (TierError()).
  // Rows on disk are read without entering the tier's cache.
  int64_t Export(int64_t cursor, int64_t max_rows, int64_t since_step,
                 std::vector<int64_t>* keys, std::vector<float>* weights,
                 std::vector<float>* slots, std::vector<RowMeta>* meta) const;

  // Change tracking, what makes an incremental checkpoint cost what changed.
  // MarkChanges(true) starts a new generation: mark = the largest last_step
  // any row ever had (so every live row has last_step <= mark), and the
  // deletion log and the untracked counter are emptied. From then on:
  // * a row that changes gets last_step > mark (pushes with a step above
  //   the mark; a row inserted by a pull is stamped max(max pushed step,
  //   mark + 1)), so Export(since_step = mark) returns it; every change an
  //   export since the mark would miss is counted in `untracked` instead:
  //   pushes with step <= mark, imports of rows with last_step <= mark,
  //   evictions whose show decay changed a row with last_step <= mark;
  // * every freed row (Evict, the row cap) logs its key, up to
  //   max(65536, Size() / 2) keys per generation; more are counted in
  //   `dropped` (the log is then incomplete).
  // A delta since the mark is exact iff untracked == 0 and dropped == 0.
  // MarkChanges(false) stops tracking and frees the log. Returns the new
  // generation.
  int64_t MarkChanges(bool enable);
  // The current generation's state; deleted (if given) gets the logged keys
  // (in log order, possibly repeated: a key freed, re-inserted, freed).
  ChangeInfo Changes(std::vector<int64_t>* deleted) const;

  // Inserts or overwrites rows (weights, slots and meta as given).
  bool Import(const int64_t* keys, int64_t n, const float* weights,
              const float* slots, const RowMeta* meta, const ParallelRunner& run);

  // show *= show_decay_rate for every row, then frees rows whose show is
  // below show_threshold, or (ttl_steps > 0) whose last update is more than
  // ttl_steps steps before current_step. Freed rows and index slots are
  // reused; empty arena chunks and oversized indexes give memory back.
  // compact: also move the surviving rows of each stripe down into the holes
  // so the arena tail is released. Compaction moves rows, so an export whose
  // cursor spans a compacting eviction may miss moved rows (never sees one
  // twice); tnet's checkpointing never runs the two at once.
  EvictStats Evict(float show_decay_rate, float show_threshold,
                   int64_t ttl_steps, int64_t current_step, bool compact,
                   const ParallelRunner& run);

  // Whether cursor is one Export can start from.
  bool ValidCursor(int64_t cursor) const;

  // Admission state, for checkpoints: every pending key with its count and
  // its age (ticks of its stripe since its count last changed, which orders
  // the drops of a full map). ImportPending(replace=true) first empties
  // every stripe's map; entries whose key has a row are skipped. Ages are
  // re-based on the stripe's clock, so a table restored with the same
  // stripes drops exactly what the uninterrupted one would.
  void ExportPending(std::vector<int64_t>* keys, std::vector<float>* counts,
                     std::vector<int64_t>* ages) const;
  void ImportPending(const int64_t* keys, const float* counts,
                     const int64_t* ages, int64_t n, bool replace);

  // The lifecycle counters of Stats() that are not derived from the rows:
  // admitted, rejected, evicted, pending_dropped, cap_evicted (a
  // checkpoint saves them; SetCounters restores them).
  static constexpr int kNumCounters = 5;
  void Counters(int64_t* out) const;
  void SetCounters(const int64_t* in);

 private:
  struct Stripe;

  static int64_t KeyOf(const char* row) {
    int64_t key;
    std::memcpy(&key, row, sizeof(key));
    return key;
  }
  static void SetKey(char* row, int64_t key) {
    std::memcpy(row, &key, sizeof(key));
  }
  RowMeta MetaOf(const char* row) const {
    RowMeta m;
    std::memcpy(&m, row + meta_offset_, sizeof(m));
    return m;
  }
  void SetMeta(char* row, const RowMeta& m) const {
    std::memcpy(row + meta_offset_, &m, sizeof(m));
  }
  float* WeightsOf(char* row) const {
    return reinterpret_cast<float*>(row + sizeof(int64_t));
  }
  float* SlotsOf(char* row) const { return WeightsOf(row) + config_.dim; }

  uint32_t StripeOf(uint64_t h) const {
    return stripe_shift_ >= 64 ? 0 : static_cast<uint32_t>(h >> stripe_shift_);
  }
  // Finds or inserts (initialized) the row of key. Caller holds the lock.
  // *inserted (if given) says whether the row is new.
  // init=false leaves a new row's weights, slots and meta unspecified (only
  // its key is set): for Import, which overwrites them at once.
  // *id (if given) is the row's id.
  char* FindOrInsert(Stripe* s, int64_t key, uint64_t h, bool* ok,
                     bool* inserted = nullptr, bool init = true,
                     uint32_t* id = nullptr, float start_scale = 1.0f);
  // Push path with admission: the row of key, or nullptr while the key is
  // not admitted (its pending count grows by show). *fresh: the row was
  // admitted by this call (no gradient must be applied).
  char* FindOrAdmit(Stripe* s, int64_t key, uint64_t h, float show,
                    float click, int64_t step, bool* ok, bool* fresh,
                    float start_scale);
  // Drops half of a full pending map (lowest count, then oldest, first).
  void DropPending(Stripe* s);
  // Frees the stripe's lowest-show rows if it is above its row cap; returns
  // how many. Caller holds the lock.
  int64_t EnforceCap(Stripe* s);
  bool admission() const { return config_.min_count > 1.0f; }
  // start_scale: the factor on the rule's accumulator start (StartScale).
  void InitRow(char* row, int64_t key, float start_scale = 1.0f);
  // Change tracking helpers (see MarkChanges). tracking(): a mark is set.
  bool tracking() const {
    return mark_.load(std::memory_order_relaxed) >= 0;
  }
  // Records that the row of key was freed. Caller holds s's lock.
  void LogDeleted(Stripe* s, int64_t key);
  void BumpMaxStamp(int64_t stamp);

  // One key of a batch: its Mix64 hash, the key and its position.
  struct Item {
    uint64_t h;
    int64_t key;
    int64_t i;
  };
  // Groups a batch by stripe: items[offsets[s] .. offsets[s+1]) are the keys
  // of stripe s in batch order. Large batches are grouped in parallel.
  void GroupByStripe(const int64_t* keys, int64_t n, const ParallelRunner& run,
                     UninitVector<Item>* items,
                     std::vector<int64_t>* offsets) const;
  // The last training pull's grouping, kept for the push of the same keys
  // (a step pushes exactly the unique keys it pulled, in the same order):
  // Push takes it when its keys are the pulled keys, position by position,
  // else it groups again (another worker's pull came between,
  // or the keys differ). One batch at most is kept. With it come the row
  // ids the pull found, per item (kNotFound where it found none): a hint the
  // push confirms (the row still live and holding the key) before it
  // skips the index; otherwise it looks the key up as usual.
  void KeepGrouping(const int64_t* keys, int64_t n, UninitVector<Item>* items,
                    std::vector<int64_t>* offsets,
                    UninitVector<uint32_t>* rows);
  bool TakeGrouping(const int64_t* keys, int64_t n, UninitVector<Item>* items,
                    std::vector<int64_t>* offsets,
                    UninitVector<uint32_t>* rows);
  std::mutex grouping_mu_;
  std::vector<int64_t> kept_keys_;
  UninitVector<Item> kept_items_;
  std::vector<int64_t> kept_offsets_;
  UninitVector<uint32_t> kept_rows_;

  // Prefetches bytes [0, bytes) of a row (for reading, or for writing when
  // kWrite). Careful: GCC does not count __builtin_prefetch as a side
  // effect and deletes loops that do nothing else once inlined (as the
  // first version, with a runtime rw flag, was): check that prefetcht0
  // instructions are emitted after changing this or its call sites.
  template <bool kWrite>
  static void PrefetchRow(const char* row, size_t bytes) {
    for (size_t b = 0; b < bytes; b += 64) {
      __builtin_prefetch(row + b, kWrite ? 1 : 0, 3);
    }
    __builtin_prefetch(row + bytes - 1, kWrite ? 1 : 0, 3);
  }

  template <typename Rule>
  bool PushWithRule(const int64_t* keys, int64_t n, const float* grads,
                    float lr, int64_t step, const float* shows,
                    const float* clicks, bool unique_keys, const ParallelRunner& run,
                    float start_scale);

  // Ends a locked stripe operation: adds the rows it inserted and admitted
  // to size_ and admitted_ (FindOrInsert and the admissions count them in
  // the stripe), trims the tier's cache to its budget; false if the tier
  // failed. Caller holds s's lock; every operation that may insert calls it
  // before it lets the lock go.
  bool EndStripeOp(Stripe* s);

  const TableConfig config_;
  std::unique_ptr<TierFile> tier_file_;
  std::string tier_error_;
  std::atomic<int64_t> tier_lookups_{0};
  std::atomic<int64_t> tier_misses_{0};
  const int num_slots_;
  const size_t row_bytes_;
  const size_t meta_offset_;
  const int stripe_shift_;
  std::vector<std::unique_ptr<Stripe>> stripes_;
  std::atomic<int64_t> size_{0};
  std::atomic<int64_t> max_step_{0};
  std::atomic<int64_t> admitted_{0};
  std::atomic<int64_t> rejected_{0};
  std::atomic<int64_t> evicted_{0};
  std::atomic<int64_t> pending_dropped_{0};
  std::atomic<int64_t> cap_evicted_{0};
  // Change tracking (MarkChanges): mark_ < 0 means not tracking.
  std::atomic<int64_t> max_stamp_{0};  // largest last_step ever written
  std::atomic<int64_t> mark_{-1};
  std::atomic<int64_t> generation_{0};
  std::atomic<int64_t> untracked_{0};
  std::atomic<int64_t> log_size_{0};
  std::atomic<int64_t> log_dropped_{0};
};

}  // namespace tnet

#endif  // TNET_OPS_TABLE_TABLE_SHARD_H_
