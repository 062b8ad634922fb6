// Chunked row arena: fixed-stride rows in chunks of kRowsPerChunk, addressed
// by a 32-bit row id.
//
// Rows never move (stable addresses, no realloc copies). Freed ids go to a
// min-heap so new rows fill the lowest holes first; a chunk whose rows are
// all free gives its memory back and is allocated again only when one of
// its ids is reused. Not thread-safe: the owning stripe's lock guards it.
//
// With a disk tier (EnableTier) the ids stay, but a row's bytes live in the
// tier's cache or on disk (row_tier.h): Row() may read the row from disk,
// its pointer is valid until the next Trim(), and Compact() moves nothing.
#ifndef TNET_OPS_TABLE_ROW_ARENA_H_
#define TNET_OPS_TABLE_ROW_ARENA_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <queue>
#include <vector>

#include "tnet_ops/table/row_tier.h"

namespace tnet {

class RowArena {
 public:
  static constexpr uint32_t kRowsPerChunk = 256;

  explicit RowArena(size_t row_bytes) : row_bytes_(row_bytes) {}

  // Moves the rows' bytes to a tier over `file` whose cache holds at most
  // budget_rows rows between operations. Call before the first Allocate.
  void EnableTier(TierFile* file, uint64_t budget_rows) {
    tier_.reset(new RowTier(file, row_bytes_, budget_rows));
  }
  RowTier* tier() const { return tier_.get(); }
  // Writes rows back until the tier's cache is within its budget (no-op
  // without a tier). Invalidates pointers from Row().
  void Trim() {
    if (tier_) tier_->Trim();
  }
  // A row's bytes for reading, without moving it into the tier's cache:
  // Row(id), or the row read into buf (row_bytes); nullptr on a read error.
  const char* Peek(uint32_t row, char* buf) const {
    return tier_ ? tier_->Peek(row, buf) : Row(row);
  }
  ~RowArena() {
    for (char* c : chunks_) std::free(c);
  }
  RowArena(const RowArena&) = delete;
  RowArena& operator=(const RowArena&) = delete;

  // Returns a fresh row id; its bytes are unspecified until the caller
  // writes them. Fails (returns false) only when 2^32-1 rows are in use or
  // memory is exhausted.
  bool Allocate(uint32_t* id) {
    uint32_t row;
    if (!free_.empty()) {
      row = free_.top();
      free_.pop();
    } else {
      if (next_ == 0xfffffffeu) return false;
      row = next_++;
      if ((row % kRowsPerChunk) == 0) {
        chunks_.push_back(nullptr);
        live_in_chunk_.push_back(0);
        live_bits_.resize(live_bits_.size() + kRowsPerChunk / 64, 0);
      }
    }
    const uint32_t c = row / kRowsPerChunk;
    if (tier_) {
      if (!tier_->Allocate(row)) {
        free_.push(row);
        return false;
      }
    } else if (chunks_[c] == nullptr) {
      chunks_[c] = static_cast<char*>(std::malloc(kRowsPerChunk * row_bytes_));
      if (chunks_[c] == nullptr) {
        free_.push(row);
        return false;
      }
      ++allocated_chunks_;
    }
    ++live_in_chunk_[c];
    live_bits_[row / 64] |= (uint64_t{1} << (row % 64));
    *id = row;
    return true;
  }

  void Free(uint32_t row) {
    const uint32_t c = row / kRowsPerChunk;
    live_bits_[row / 64] &= ~(uint64_t{1} << (row % 64));
    free_.push(row);
    if (tier_) {
      tier_->Free(row);
      --live_in_chunk_[c];
      return;
    }
    if (--live_in_chunk_[c] == 0) {
      std::free(chunks_[c]);
      chunks_[c] = nullptr;
      --allocated_chunks_;
    }
  }

  // Moves live rows down into the lowest free ids until ids [0, live) are
  // all live, calling moved(from, to) for each move, then releases the
  // chunks past the last live row. Addresses of moved rows change.
  template <typename Moved>
  bool Compact(Moved moved) {
    if (tier_) return true;  // ids index the tier: nothing to move
    uint32_t lo = 0;
    uint32_t hi = next_;
    while (true) {
      while (lo < hi && IsLive(lo)) ++lo;
      while (hi > lo && !IsLive(hi - 1)) --hi;
      if (lo + 1 >= hi) break;
      const uint32_t from = hi - 1;
      const uint32_t c = lo / kRowsPerChunk;
      if (chunks_[c] == nullptr) {
        chunks_[c] = static_cast<char*>(std::malloc(kRowsPerChunk * row_bytes_));
        if (chunks_[c] == nullptr) return false;
        ++allocated_chunks_;
      }
      std::memcpy(Row(lo), Row(from), row_bytes_);
      ++live_in_chunk_[c];
      live_bits_[lo / 64] |= (uint64_t{1} << (lo % 64));
      moved(from, lo);
      Free(from);
      --hi;
    }
    // Every id below `hi` is live now: drop the free list and the tail.
    while (hi > 0 && !IsLive(hi - 1)) --hi;
    next_ = hi;
    free_ = decltype(free_)();
    const size_t keep_chunks = (next_ + kRowsPerChunk - 1) / kRowsPerChunk;
    for (size_t c = keep_chunks; c < chunks_.size(); ++c) {
      if (chunks_[c] != nullptr) {
        std::free(chunks_[c]);
        --allocated_chunks_;
      }
    }
    chunks_.resize(keep_chunks);
    chunks_.shrink_to_fit();
    live_in_chunk_.resize(keep_chunks);
    live_in_chunk_.shrink_to_fit();
    live_bits_.resize(keep_chunks * (kRowsPerChunk / 64));
    live_bits_.shrink_to_fit();
    return true;
  }

  char* Row(uint32_t row) const {
    if (tier_) return tier_->Row(row);
    return chunks_[row / kRowsPerChunk] +
           static_cast<size_t>(row % kRowsPerChunk) * row_bytes_;
  }
  bool IsLive(uint32_t row) const {
    return row < next_ && (live_bits_[row / 64] >> (row % 64)) & 1;
  }
  // One past the highest row id ever handed out (export cursors walk [0, end)).
  uint32_t end() const { return next_; }

  uint64_t MemoryBytes() const {
    return allocated_chunks_ * kRowsPerChunk * row_bytes_ +
           chunks_.capacity() * sizeof(char*) +
           live_in_chunk_.capacity() * sizeof(uint32_t) +
           live_bits_.capacity() * sizeof(uint64_t) +
           free_.size() * sizeof(uint32_t) +
           (tier_ ? tier_->MemoryBytes() : 0);
  }

 private:
  const size_t row_bytes_;
  std::vector<char*> chunks_;
  std::vector<uint32_t> live_in_chunk_;
  std::vector<uint64_t> live_bits_;
  std::priority_queue<uint32_t, std::vector<uint32_t>, std::greater<uint32_t>>
      free_;
  uint32_t next_ = 0;
  uint64_t allocated_chunks_ = 0;
  std::unique_ptr<RowTier> tier_;
};

}  // namespace tnet

#endif  // TNET_OPS_TABLE_ROW_ARENA_H_
