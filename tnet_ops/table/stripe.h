// One stripe of a TableShard (internal to table/): a mutex, an
// open-addressing index, a row arena and the admission state of keys that
// have no row yet. Every operation on a stripe holds its mutex.
#ifndef TNET_OPS_TABLE_STRIPE_H_
#define TNET_OPS_TABLE_STRIPE_H_

#include <cstdint>
#include <mutex>
#include <vector>

#include "tnet_ops/table/hash_index.h"
#include "tnet_ops/table/pending_map.h"
#include "tnet_ops/table/row_arena.h"
#include "tnet_ops/table/table_shard.h"

namespace tnet {

struct alignas(64) TableShard::Stripe {
  explicit Stripe(size_t row_bytes) : arena(row_bytes) {}
  std::mutex mu;
  HashIndex index;
  RowArena arena;
  // Admission: key -> show count so far (and when it last changed), for
  // keys without a row.
  PendingMap pending;
  uint32_t tick = 0;  // bumped on every pending update
  size_t pending_cap = 0;
  uint64_t row_cap = 0;  // 0 = unbounded
  // Keys freed since the shard's change mark (TableShard::MarkChanges).
  std::vector<int64_t> deleted;
  // Rows inserted / admitted by the current operation on this stripe, not
  // yet added to the shard's size_ / admitted_: EndStripeOp adds them once
  // per operation (an atomic add per new row, on a cache line both threads
  // write, cost ~13% of a pull that inserts a third of its keys).
  int64_t added = 0;
  int64_t admitted = 0;

  uint64_t PendingBytes() const { return pending.MemoryBytes(); }
};

}  // namespace tnet

#endif  // TNET_OPS_TABLE_STRIPE_H_
