// Admission counts of keys that have no row yet: a flat open-addressing map
// key -> {count, tick}, one per stripe.
//
// 16 bytes a slot, linear probing on the low bits of Mix64(key) (stripes use
// the high bits), backward-shift deletion (no tombstones), grows at 3/4
// load and is rebuilt smaller after a drop. A node-based std::unordered_map
// cost ~2.5x the memory and halved push throughput (bench_lifecycle).
// Not thread-safe: the owning stripe's lock guards it.
#ifndef TNET_OPS_TABLE_PENDING_MAP_H_
#define TNET_OPS_TABLE_PENDING_MAP_H_

#include <cstdint>
#include <memory>

#include "tnet_ops/table/hash.h"

namespace tnet {

class PendingMap {
 public:
  struct Slot {
    int64_t key;
    float count;    // < 0: empty slot
    uint32_t tick;  // when the count last changed (for drop order)
  };
  static_assert(sizeof(Slot) == 16, "pending slots are 16 bytes");

  PendingMap() { Reset(kMinCapacity); }

  // The slot of key (hash h = Mix64(key)), or nullptr.
  Slot* Find(int64_t key, uint64_t h) {
    for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.count < 0.0f) return nullptr;
      if (s.key == key) return &s;
    }
  }

  // Inserts a key known to be absent.
  void Insert(int64_t key, uint64_t h, float count, uint32_t tick) {
    if ((size_ + 1) * 4 > capacity_ * 3) Rehash(capacity_ * 2);
    InsertNoGrow({key, count, tick}, h);
    ++size_;
  }

  // Removes the entry in `slot` (a pointer Find returned).
  void Erase(Slot* slot) {
    uint64_t hole = static_cast<uint64_t>(slot - slots_.get());
    for (uint64_t j = (hole + 1) & mask_;; j = (j + 1) & mask_) {
      if (slots_[j].count < 0.0f) break;
      const uint64_t home =
          Mix64(static_cast<uint64_t>(slots_[j].key)) & mask_;
      const bool home_in_range = (hole <= j) ? (home > hole && home <= j)
                                             : (home > hole || home <= j);
      if (!home_in_range) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole].count = -1.0f;
    --size_;
  }

  // Calls fn(const Slot&) for every entry.
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (uint64_t i = 0; i < capacity_; ++i) {
      if (slots_[i].count >= 0.0f) fn(slots_[i]);
    }
  }

  // Keeps only the entries keep(slot) accepts; resizes to fit them.
  template <typename Keep>
  void Filter(Keep keep) {
    std::unique_ptr<Slot[]> old = std::move(slots_);
    const uint64_t old_capacity = capacity_;
    uint64_t kept = 0;
    for (uint64_t i = 0; i < old_capacity; ++i) {
      if (old[i].count >= 0.0f && keep(old[i])) ++kept;
    }
    uint64_t capacity = kMinCapacity;
    while (kept * 2 > capacity) capacity *= 2;
    Reset(capacity);
    for (uint64_t i = 0; i < old_capacity; ++i) {
      if (old[i].count >= 0.0f && keep(old[i])) {
        InsertNoGrow(old[i], Mix64(static_cast<uint64_t>(old[i].key)));
      }
    }
    size_ = kept;
  }

  uint64_t size() const { return size_; }
  uint64_t MemoryBytes() const { return capacity_ * sizeof(Slot); }

 private:
  static constexpr uint64_t kMinCapacity = 16;

  void Reset(uint64_t capacity) {
    capacity_ = capacity;
    mask_ = capacity - 1;
    slots_.reset(new Slot[capacity]);
    for (uint64_t i = 0; i < capacity; ++i) slots_[i] = {0, -1.0f, 0};
  }

  void InsertNoGrow(const Slot& s, uint64_t h) {
    for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].count < 0.0f) {
        slots_[i] = s;
        return;
      }
    }
  }

  void Rehash(uint64_t capacity) {
    std::unique_ptr<Slot[]> old = std::move(slots_);
    const uint64_t old_capacity = capacity_;
    Reset(capacity);
    for (uint64_t i = 0; i < old_capacity; ++i) {
      if (old[i].count >= 0.0f) {
        InsertNoGrow(old[i], Mix64(static_cast<uint64_t>(old[i].key)));
      }
    }
  }

  std::unique_ptr<Slot[]> slots_;
  uint64_t capacity_ = 0;
  uint64_t mask_ = 0;
  uint64_t size_ = 0;
};

}  // namespace tnet

#endif  // TNET_OPS_TABLE_PENDING_MAP_H_
