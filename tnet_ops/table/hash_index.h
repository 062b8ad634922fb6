// Open-addressing index from key to row id, one per stripe.
//
// Linear probing over 8-byte slots {tag, row id} with backward-shift
// deletion, so there are no tombstones and eviction leaves the index as if
// the key had never been inserted. Not thread-safe: the owning stripe's lock
// guards it.
//
// The index does not store keys. A slot's tag is the low 32 bits of the
// key's Mix64 hash, and a key's home slot is tag & mask, so:
// - erase, rehash and compaction never read a row: the tag alone gives each
//   entry's home slot;
// - two entries with different home slots never have equal tags, so a tag
//   match is a false positive only between keys with the same home and the
//   same low 32 hash bits (about 1 in 2^(32 - log2(capacity)));
// - a lookup confirms a tag match against the key stored in the row (the
//   caller's key_of(row)), which pull and push read anyway.
// Stripes use the top bits of the same hash, disjoint from the tag bits for
// any practical stripe count.
#ifndef TNET_OPS_TABLE_HASH_INDEX_H_
#define TNET_OPS_TABLE_HASH_INDEX_H_

#include <cstdint>
#include <cstring>
#include <memory>

#include "tnet_ops/table/hash.h"

namespace tnet {

class HashIndex {
 public:
  static constexpr uint32_t kEmpty = 0xffffffffu;
  static constexpr uint32_t kNotFound = 0xffffffffu;

  HashIndex() { Reset(kMinCapacity); }

  static uint32_t Tag(uint64_t h) { return static_cast<uint32_t>(h); }

  // Address of the home slot of hash h, for software prefetching.
  const void* HomeAddress(uint64_t h) const {
    return &slots_[Tag(h) & mask_];
  }

  // Row id of the first slot in h's probe run whose tag matches, or
  // kNotFound. A hint only: the caller must confirm the row's key (and fall
  // back to Find when it differs).
  uint32_t Candidate(uint64_t h) const {
    const uint32_t tag = Tag(h);
    for (uint64_t i = tag & mask_;; i = (i + 1) & mask_) {
      const Slot s = slots_[i];
      if (s.row == kEmpty) return kNotFound;
      if (s.tag == tag) return s.row;
    }
  }

  // Row id of `key` (whose Mix64 hash is `h`), or kNotFound. key_of(row)
  // returns the key stored in a row.
  template <typename KeyOf>
  uint32_t Find(int64_t key, uint64_t h, const KeyOf& key_of) const {
    const uint32_t tag = Tag(h);
    for (uint64_t i = tag & mask_;; i = (i + 1) & mask_) {
      const Slot s = slots_[i];
      if (s.row == kEmpty) return kNotFound;
      if (s.tag == tag && key_of(s.row) == key) return s.row;
    }
  }

  // Points the entry of row `from` (hash h) at row `to` (after compaction
  // moved the row). Returns whether the entry was found.
  bool UpdateRow(uint64_t h, uint32_t from, uint32_t to) {
    for (uint64_t i = Tag(h) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].row == kEmpty) return false;
      if (slots_[i].row == from) {
        slots_[i].row = to;
        return true;
      }
    }
  }

  // Inserts the row of a key known to be absent.
  void Insert(uint64_t h, uint32_t row) {
    if ((size_ + 1) * 4 > capacity_ * 3) Rehash(capacity_ * 2);
    InsertNoGrow(Tag(h), row);
    ++size_;
  }

  // Removes the entry of row `row` (hash h) if present; returns whether it
  // was.
  bool EraseRow(uint64_t h, uint32_t row) {
    uint64_t i = Tag(h) & mask_;
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].row == kEmpty) return false;
      if (slots_[i].row == row) break;
    }
    // Backward-shift: pull later members of the probe run into the hole.
    uint64_t hole = i;
    for (uint64_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      if (slots_[j].row == kEmpty) break;
      const uint64_t home = slots_[j].tag & mask_;
      // Move j into the hole unless its home lies cyclically in (hole, j].
      const bool home_in_range = (hole <= j) ? (home > hole && home <= j)
                                             : (home > hole || home <= j);
      if (!home_in_range) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole].row = kEmpty;
    --size_;
    return true;
  }

  // Shrinks the slot array when it is mostly empty (after eviction), so
  // freed keys give their index memory back.
  void MaybeShrink() {
    uint64_t target = capacity_;
    while (target > kMinCapacity && size_ * 8 < target) target /= 2;
    if (target < capacity_) Rehash(target);
  }

  uint64_t size() const { return size_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t MemoryBytes() const { return capacity_ * sizeof(Slot); }

 private:
  struct Slot {
    uint32_t tag;
    uint32_t row;
  };
  static_assert(sizeof(Slot) == 8, "index slots are 8 bytes");
  static constexpr uint64_t kMinCapacity = 16;

  void Reset(uint64_t capacity) {
    capacity_ = capacity;
    mask_ = capacity - 1;
    slots_.reset(new Slot[capacity]);
    for (uint64_t i = 0; i < capacity; ++i) slots_[i] = {0, kEmpty};
  }

  void InsertNoGrow(uint32_t tag, uint32_t row) {
    for (uint64_t i = tag & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].row == kEmpty) {
        slots_[i] = {tag, row};
        return;
      }
    }
  }

  void Rehash(uint64_t capacity) {
    std::unique_ptr<Slot[]> old = std::move(slots_);
    const uint64_t old_capacity = capacity_;
    Reset(capacity);
    // Old slots are read in order; their new homes are random: fetch the
    // home of the slot 16 ahead while inserting this one.
    constexpr uint64_t kAhead = 16;
    for (uint64_t i = 0; i < old_capacity; ++i) {
      if (i + kAhead < old_capacity) {
        __builtin_prefetch(&slots_[old[i + kAhead].tag & mask_], 1);
      }
      if (old[i].row != kEmpty) InsertNoGrow(old[i].tag, old[i].row);
    }
  }

  std::unique_ptr<Slot[]> slots_;
  uint64_t capacity_ = 0;
  uint64_t mask_ = 0;
  uint64_t size_ = 0;
};

}  // namespace tnet

#endif  // TNET_OPS_TABLE_HASH_INDEX_H_
