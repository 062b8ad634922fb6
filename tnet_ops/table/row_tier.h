// The disk tier under a table shard: rows that are not hot live in a file of
// fixed-size records on local disk, and memory keeps a byte-budgeted cache
// of hot rows (a row's weights, slots and meta, whole).
//
// One TierFile per shard holds the records of all its stripes; each stripe
// takes extents of kExtentRecords records from it (under the file's mutex,
// rarely) and owns them. A stripe's RowTier maps each row id of its arena to
// a cache slot (resident) and/or a record (a copy on disk):
// - a new row is resident only; the first time it leaves the cache it gets
//   a record, and keeps it until the row is freed (records are rewritten in
//   place, so there is nothing to compact: a freed row's record is reused
//   by the next row that needs one);
// - Row(id) returns the resident copy, reading the record into a free slot
//   if the row is on disk (a miss); the row counts as referenced;
// - Trim() brings the cache back to its budget: CLOCK over the slots picks
//   the rows not referenced since the last sweep and writes each back to its
//   record. Every evicted row is written back (the tier does not track
//   which rows a caller modified).
// Pointers from Row() stay valid until the next Trim(); TableShard trims at
// the end of each locked stripe operation, so a batch may hold its rows at
// once and the cache may exceed its budget by one batch's rows of a stripe.
//
// The file is read and written through a shared memory mapping (records
// are memcpy'd to and from the page cache; the kernel writes dirty pages
// back), which costs a fraction of a pread/pwrite system call per row.
// The file is unlinked right after it is created: it lives as long as the
// process that holds it open, and a kill -9 leaves nothing on disk to clean
// up or to trip on. The tier is a cache of the table, not a copy of it:
// checkpoints are what survives a process (restore fills a fresh tier).
// Not thread-safe: the owning stripe's lock guards a RowTier; a TierFile's
// extent allocator has its own mutex, and reads and writes of distinct
// records through the mapping need no lock.
#ifndef TNET_OPS_TABLE_ROW_TIER_H_
#define TNET_OPS_TABLE_ROW_TIER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tnet {

class TierFile {
 public:
  static constexpr uint64_t kExtentRecords = 1024;
  // The file grows by segments of this many records (whole extents), each
  // reserved on disk (fallocate) and mapped once.
  static constexpr uint64_t kSegmentRecords = 256 * kExtentRecords;
  static constexpr uint64_t kMaxSegments = uint64_t{1} << 16;
  static constexpr uint64_t kNoExtent = ~uint64_t{0};

  // Creates an unlinked file in `dir`; nullptr and *error on failure.
  static std::unique_ptr<TierFile> Create(const std::string& dir,
                                          size_t record_bytes,
                                          std::string* error);
  ~TierFile();
  TierFile(const TierFile&) = delete;
  TierFile& operator=(const TierFile&) = delete;

  // The first record of a new extent, or kNoExtent (errno set) when the
  // file cannot grow (disk full, mapping refused).
  uint64_t NewExtent();
  // Copies records of allocated extents out of / into the mapped file.
  // An I/O error of the disk under a mapped page is a SIGBUS, as for any
  // memory-mapped store; a full disk is caught by NewExtent.
  bool Read(uint64_t record, char* dst, uint64_t n_records) const;
  // Asks the kernel to start reading the pages of n records (of one
  // extent) in the background.
  void ReadAhead(uint64_t record, uint64_t n_records = 1) const;
  bool Write(uint64_t record, const char* src, uint64_t n_records) const;
  // Disk bytes reserved by the file.
  uint64_t bytes() const {
    return segments_.load(std::memory_order_relaxed) * segment_bytes_;
  }
  const std::string& dir() const { return dir_; }

 private:
  TierFile(int fd, size_t record_bytes, std::string dir);
  const int fd_;
  const size_t record_bytes_;
  const uint64_t segment_bytes_;
  const std::string dir_;
  std::mutex mu_;
  std::atomic<uint64_t> extents_{0};
  std::atomic<uint64_t> segments_{0};
  std::unique_ptr<std::atomic<char*>[]> maps_;
};

struct TierStats {
  int64_t hits = 0;        // Row() calls that found the row resident
  int64_t misses = 0;      // Row() calls that read the row from disk
  int64_t resident = 0;    // rows in the cache now
  int64_t on_disk = 0;     // rows whose only copy is on disk now
  int64_t records = 0;     // records in use (rows with a copy on disk)
  int64_t writebacks = 0;  // rows written back to disk
  int64_t cache_bytes = 0; // memory of the cache's slots (live or free)
};

class RowTier {
 public:
  static constexpr uint32_t kNone = 0xffffffffu;

  RowTier(TierFile* file, size_t row_bytes, uint64_t budget_rows);
  ~RowTier();
  RowTier(const RowTier&) = delete;
  RowTier& operator=(const RowTier&) = delete;

  // A new row id (bytes unspecified): resident. False if memory ran out.
  bool Allocate(uint32_t id);
  // The row id is free: its slot and record are released.
  void Free(uint32_t id);
  // The resident copy of a live row, read from disk if needed. On a read
  // error: a zeroed scratch row, and failed() turns true.
  char* Row(uint32_t id);
  // The row's bytes without caching it: the resident copy, or the record
  // read into buf (row_bytes). nullptr on a read error (failed()).
  const char* Peek(uint32_t id, char* buf);
  // If `id` is a row whose only copy is on disk, starts reading it from
  // the disk (no-op for kNone, resident rows and rows without a record).
  void ReadAhead(uint32_t id) const {
    if (id >= where_.size() || !OnDisk(where_[id])) return;
    file_->ReadAhead(GlobalRecord(where_[id]));
  }
  // Called at the start of a pull or push of a batch's rows: whether to
  // announce them (ReadAhead) before reading them. Yes while misses are
  // disk reads (the disk then serves the batch's misses in parallel, not
  // one at a time); no while they are page-cache copies (the hint would
  // only add a system call per miss). Misses are timed on the operations
  // that do not read ahead: after 64 that do, one does not, to look again.
  bool BeginBatch() {
    if (AlwaysReadAhead()) return reading_ahead_ = true;
    if (ahead_ops_ > 0) {
      --ahead_ops_;
      return reading_ahead_ = true;
    }
    if ((miss_ns_ > kSlowMissNs || AlwaysReadAhead()) && !probed_) {
      ahead_ops_ = 63;
      probed_ = true;
      return reading_ahead_ = true;
    }
    probed_ = false;
    return reading_ahead_ = false;
  }
  // Writes back unreferenced rows until at most the budget is resident.
  // If the file cannot grow, the rows stay resident and full() turns true.
  void Trim();

  int64_t misses() const { return misses_; }
  // A failure that lost data (a row could not be held in memory): every
  // later operation of the table fails.
  bool failed() const { return !error_.empty(); }
  // The file could not grow (disk full) at the last Trim: the rows it
  // would have written stay resident, over the budget; the next Trim that
  // writes them all clears it.
  bool full() const { return !grow_error_.empty(); }
  const std::string& error() const {
    return error_.empty() ? grow_error_ : error_;
  }
  TierStats Stats() const;
  uint64_t MemoryBytes() const;

 private:
  // where_[id]: kNone (no copy yet, or a free id), kResident | slot (the
  // row is in that cache slot; its record, if any, is record_of_slot_),
  // else the record holding the row's only copy. One word per row id:
  // with 500M rows a second word (slot and record apart) is 2 GB.
  static constexpr uint32_t kResident = 0x80000000u;
  static constexpr uint32_t kMaxIndex = kResident - 1;  // slots, records
  static bool Resident(uint32_t w) { return w != kNone && (w & kResident); }
  static bool OnDisk(uint32_t w) { return !(w & kResident); }
  char* Slot(uint32_t slot) const {
    return chunks_[slot / kSlotsPerChunk] +
           static_cast<size_t>(slot % kSlotsPerChunk) * row_bytes_;
  }
  bool TakeSlot(uint32_t* slot);
  uint64_t GlobalRecord(uint32_t local) const {
    return extents_[local / TierFile::kExtentRecords] +
           local % TierFile::kExtentRecords;
  }
  uint32_t NewRecord();
  void Fail(const char* what);

  static constexpr uint32_t kSlotsPerChunk = 256;
  static constexpr int64_t kSlowMissNs = 5000;
  // Tests: TNET_TEST_TIER_READAHEAD=1 reads ahead on every batch (their
  // files sit in the page cache, where the tier would never choose to).
  static bool AlwaysReadAhead();
  static constexpr uint32_t kPeekAhead = 256;  // divides kExtentRecords
  TierFile* const file_;
  const size_t row_bytes_;
  const uint64_t budget_rows_;
  // Per row id (see Resident()).
  std::vector<uint32_t> where_;
  // Per cache slot.
  std::vector<char*> chunks_;
  std::vector<uint32_t> id_of_;
  std::vector<uint32_t> record_of_slot_;  // the resident row's record
  std::vector<uint8_t> referenced_;
  std::vector<uint32_t> free_slots_;
  uint32_t hand_ = 0;
  uint64_t resident_ = 0;
  // Records (local numbers) of this stripe.
  std::vector<uint64_t> extents_;  // first global record of each extent
  std::vector<uint32_t> free_records_;
  uint32_t next_record_ = 0;
  std::vector<char> scratch_;
  int64_t misses_ = 0, writebacks_ = 0, on_disk_ = 0;
  int64_t miss_ns_ = 0;  // moving average of a miss's read time
  int ahead_ops_ = 0;
  bool probed_ = false;
  bool reading_ahead_ = false;
  uint32_t last_peek_ = kNone;
  std::string error_;
  std::string grow_error_;
};

}  // namespace tnet

#endif  // TNET_OPS_TABLE_ROW_TIER_H_
