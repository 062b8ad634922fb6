#include "tnet_ops/table/row_tier.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace tnet {

std::unique_ptr<TierFile> TierFile::Create(const std::string& dir,
                                           size_t record_bytes,
                                           std::string* error) {
  std::string path = (dir.empty() ? std::string(".") : dir) +
                     "/tnet-tier-XXXXXX";
  std::vector<char> name(path.begin(), path.end());
  name.push_back('\0');
  const int fd = mkstemp(name.data());
  if (fd < 0) {
    *error = "cannot create a file in storage_dir '" + dir +
             "': " + std::strerror(errno) +
             " (give a writable local directory)";
    return nullptr;
  }
  // Unlinked at once: the records live as long as this process.
  unlink(name.data());
  return std::unique_ptr<TierFile>(new TierFile(fd, record_bytes, dir));
}

TierFile::TierFile(int fd, size_t record_bytes, std::string dir)
    : fd_(fd),
      record_bytes_(record_bytes),
      segment_bytes_((kSegmentRecords * record_bytes + 4095) / 4096 * 4096),
      dir_(std::move(dir)),
      maps_(new std::atomic<char*>[kMaxSegments]) {
  for (uint64_t i = 0; i < kMaxSegments; ++i) maps_[i].store(nullptr);
}

TierFile::~TierFile() {
  const uint64_t n = segments_.load();
  for (uint64_t i = 0; i < n; ++i) munmap(maps_[i].load(), segment_bytes_);
  close(fd_);
}

uint64_t TierFile::NewExtent() {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t e = extents_.load(std::memory_order_relaxed);
  const uint64_t seg = e * kExtentRecords / kSegmentRecords;
  if (seg >= segments_.load(std::memory_order_relaxed)) {
    if (seg >= kMaxSegments) {
      errno = EFBIG;
      return kNoExtent;
    }
    // The segment's blocks are reserved before it is mapped, so a full
    // disk is an error here and never a fault on a mapped write.
    const off_t at = static_cast<off_t>(seg * segment_bytes_);
    int rc = posix_fallocate(fd_, at, static_cast<off_t>(segment_bytes_));
    if (rc == EOPNOTSUPP || rc == EINVAL) {
      rc = ftruncate(fd_, at + static_cast<off_t>(segment_bytes_)) == 0
               ? 0 : errno;
    }
    if (rc != 0) {
      errno = rc;
      return kNoExtent;
    }
    void* m = mmap(nullptr, segment_bytes_, PROT_READ | PROT_WRITE,
                   MAP_SHARED, fd_, at);
    if (m == MAP_FAILED) return kNoExtent;
    madvise(m, segment_bytes_, MADV_RANDOM);  // rows, not streams
    maps_[seg].store(static_cast<char*>(m), std::memory_order_release);
    segments_.store(seg + 1, std::memory_order_release);
  }
  extents_.store(e + 1, std::memory_order_relaxed);
  return e * kExtentRecords;
}

// Records are copied through the mapping (the page cache): a row read or
// written costs a memcpy, not a system call. A segment holds whole extents,
// so a run of records is split only where it crosses segments.
template <typename Copy>
static void EachPiece(uint64_t record, uint64_t n, uint64_t seg_records,
                      const Copy& copy) {
  while (n > 0) {
    const uint64_t seg = record / seg_records;
    const uint64_t at = record % seg_records;
    const uint64_t take = std::min(n, seg_records - at);
    copy(seg, at, take);
    record += take;
    n -= take;
  }
}

bool TierFile::Read(uint64_t record, char* dst, uint64_t n_records) const {
  EachPiece(record, n_records, kSegmentRecords,
            [&](uint64_t seg, uint64_t at, uint64_t take) {
              std::memcpy(dst, maps_[seg].load(std::memory_order_acquire) +
                                   at * record_bytes_,
                          take * record_bytes_);
              dst += take * record_bytes_;
            });
  return true;
}

void TierFile::ReadAhead(uint64_t record, uint64_t n_records) const {
  const uint64_t seg = record / kSegmentRecords;
  const uint64_t at = (record % kSegmentRecords) * record_bytes_;
  char* base = maps_[seg].load(std::memory_order_acquire);
  const uint64_t first = at / 4096 * 4096;
  const uint64_t last =
      (at + n_records * record_bytes_ + 4095) / 4096 * 4096;
  madvise(base + first, std::min(last, segment_bytes_) - first,
          MADV_WILLNEED);
}

bool TierFile::Write(uint64_t record, const char* src,
                     uint64_t n_records) const {
  EachPiece(record, n_records, kSegmentRecords,
            [&](uint64_t seg, uint64_t at, uint64_t take) {
              std::memcpy(maps_[seg].load(std::memory_order_acquire) +
                              at * record_bytes_,
                          src, take * record_bytes_);
              src += take * record_bytes_;
            });
  return true;
}

bool RowTier::AlwaysReadAhead() {
  static const bool always = [] {
    const char* v = std::getenv("TNET_TEST_TIER_READAHEAD");
    return v != nullptr && v[0] == '1';
  }();
  return always;
}

RowTier::RowTier(TierFile* file, size_t row_bytes, uint64_t budget_rows)
    : file_(file),
      row_bytes_(row_bytes),
      budget_rows_(std::max<uint64_t>(1, budget_rows)),
      scratch_(row_bytes, 0) {}

RowTier::~RowTier() {
  for (char* c : chunks_) std::free(c);
}

void RowTier::Fail(const char* what) {
  if (error_.empty()) {
    error_ = std::string("the table's disk tier (storage_dir '") +
             file_->dir() + "') failed to " + what + ": " +
             std::strerror(errno);
  }
}

bool RowTier::TakeSlot(uint32_t* slot) {
  if (!free_slots_.empty()) {
    *slot = free_slots_.back();
    free_slots_.pop_back();
    return true;
  }
  const size_t n = id_of_.size();
  if (n >= kMaxIndex) return false;
  if (n % kSlotsPerChunk == 0) {
    char* c = static_cast<char*>(std::malloc(kSlotsPerChunk * row_bytes_));
    if (c == nullptr) return false;
    chunks_.push_back(c);
  }
  id_of_.push_back(kNone);
  record_of_slot_.push_back(kNone);
  referenced_.push_back(0);
  *slot = static_cast<uint32_t>(n);
  return true;
}

uint32_t RowTier::NewRecord() {
  if (!free_records_.empty()) {
    const uint32_t r = free_records_.back();
    free_records_.pop_back();
    return r;
  }
  const uint32_t r = next_record_;
  if (r > kMaxIndex) {
    errno = EFBIG;
    return kNone;
  }
  if (r % TierFile::kExtentRecords == 0) {
    const uint64_t first = file_->NewExtent();
    if (first == TierFile::kNoExtent) return kNone;
    extents_.push_back(first);
  }
  ++next_record_;
  return r;
}

bool RowTier::Allocate(uint32_t id) {
  if (id >= where_.size()) where_.resize(id + 1, kNone);
  uint32_t slot;
  if (!TakeSlot(&slot)) return false;
  where_[id] = kResident | slot;
  record_of_slot_[slot] = kNone;
  id_of_[slot] = id;
  referenced_[slot] = 1;
  ++resident_;
  return true;
}

void RowTier::Free(uint32_t id) {
  const uint32_t w = where_[id];
  uint32_t rec = kNone;
  if (Resident(w)) {
    const uint32_t slot = w & kMaxIndex;
    rec = record_of_slot_[slot];
    record_of_slot_[slot] = kNone;
    id_of_[slot] = kNone;
    referenced_[slot] = 0;
    free_slots_.push_back(slot);
    --resident_;
  } else if (w != kNone) {
    rec = w;
    --on_disk_;
  }
  if (rec != kNone) free_records_.push_back(rec);
  where_[id] = kNone;
}

char* RowTier::Row(uint32_t id) {
  const uint32_t w = where_[id];
  if (Resident(w)) {
    referenced_[w & kMaxIndex] = 1;
    return Slot(w & kMaxIndex);
  }
  ++misses_;
  uint32_t s;
  if (!TakeSlot(&s)) {
    errno = ENOMEM;
    Fail("hold a row in memory");
    std::memset(scratch_.data(), 0, row_bytes_);
    return scratch_.data();
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (w == kNone || !file_->Read(GlobalRecord(w), Slot(s), 1)) {
    if (w == kNone) errno = EINVAL;
    Fail("read a row");
    free_slots_.push_back(s);
    std::memset(scratch_.data(), 0, row_bytes_);
    return scratch_.data();
  }
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now() - t0).count();
  if (!reading_ahead_) miss_ns_ += (ns - miss_ns_) / 16;
  where_[id] = kResident | s;
  record_of_slot_[s] = w;
  id_of_[s] = id;
  referenced_[s] = 1;
  ++resident_;
  --on_disk_;
  return Slot(s);
}

const char* RowTier::Peek(uint32_t id, char* buf) {
  const uint32_t rec = where_[id];
  if (Resident(rec)) return Slot(rec & kMaxIndex);
  if (rec == kNone) {
    errno = EINVAL;
    Fail("read a row");
    return nullptr;
  }
  // A walk (export, checkpoint) reads records largely in order. When
  // reads come from the disk, announce each block of kPeekAhead records
  // the walk enters, so the disk reads it in one go (the mapping is
  // MADV_RANDOM: no read-ahead of its own); from the page cache, don't.
  const bool ahead = miss_ns_ > kSlowMissNs || AlwaysReadAhead();
  if (ahead && (last_peek_ == kNone ||
                rec / kPeekAhead != last_peek_ / kPeekAhead)) {
    file_->ReadAhead(GlobalRecord(rec - rec % kPeekAhead), kPeekAhead);
  }
  last_peek_ = rec;
  const auto t0 = std::chrono::steady_clock::now();
  file_->Read(GlobalRecord(rec), buf, 1);
  if (!ahead) {
    miss_ns_ += (std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::steady_clock::now() - t0).count() -
                 miss_ns_) / 16;
  }
  return buf;
}

void RowTier::Trim() {
  if (resident_ <= budget_rows_) {
    grow_error_.clear();
    return;
  }
  const uint64_t need = resident_ - budget_rows_;
  const uint32_t n = static_cast<uint32_t>(id_of_.size());
  std::vector<uint32_t> victims;  // slots
  victims.reserve(need);
  // Two sweeps at most: the first clears every reference bit it passes.
  for (uint64_t scanned = 0; victims.size() < need && scanned < 2ull * n + 1;
       ++scanned) {
    if (hand_ >= n) hand_ = 0;
    const uint32_t slot = hand_++;
    if (id_of_[slot] == kNone || referenced_[slot] == 2) continue;
    if (referenced_[slot] == 1) {
      referenced_[slot] = 0;
      continue;
    }
    referenced_[slot] = 2;  // picked
    victims.push_back(slot);
  }
  size_t with_record = 0;
  for (uint32_t slot : victims) {
    if (record_of_slot_[slot] == kNone) record_of_slot_[slot] = NewRecord();
    if (record_of_slot_[slot] == kNone) {
      referenced_[slot] = 0;  // stays resident: the file cannot grow
      continue;
    }
    victims[with_record++] = slot;
  }
  if (with_record < victims.size()) {
    grow_error_ = std::string("the table's disk tier (storage_dir '") +
                  file_->dir() + "') cannot grow its file: " +
                  std::strerror(errno) +
                  "; the rows stay in memory over memory_budget_bytes and "
                  "nothing is lost: free disk space there (the table goes "
                  "on) or save a checkpoint";
    victims.resize(with_record);
  } else {
    grow_error_.clear();
  }
  // Each row goes to its record through the mapping (a memcpy), in record
  // order: neighbouring records share pages, which then stay hot.
  std::sort(victims.begin(), victims.end(), [&](uint32_t a, uint32_t b) {
    return record_of_slot_[a] < record_of_slot_[b];
  });
  for (const uint32_t slot : victims) {
    const uint32_t rec = record_of_slot_[slot];
    file_->Write(GlobalRecord(rec), Slot(slot), 1);
    where_[id_of_[slot]] = rec;
    record_of_slot_[slot] = kNone;
    id_of_[slot] = kNone;
    referenced_[slot] = 0;
    free_slots_.push_back(slot);
    --resident_;
    ++on_disk_;
    ++writebacks_;
  }
}

TierStats RowTier::Stats() const {
  TierStats t;
  t.misses = misses_;
  t.resident = static_cast<int64_t>(resident_);
  t.on_disk = on_disk_;
  t.records = static_cast<int64_t>(next_record_) -
              static_cast<int64_t>(free_records_.size());
  t.writebacks = writebacks_;
  t.cache_bytes = static_cast<int64_t>(chunks_.size() * kSlotsPerChunk *
                                       row_bytes_);
  return t;
}

uint64_t RowTier::MemoryBytes() const {
  return chunks_.size() * kSlotsPerChunk * row_bytes_ +
         chunks_.capacity() * sizeof(char*) +
         (where_.capacity() + id_of_.capacity() + record_of_slot_.capacity() +
          free_slots_.capacity() + free_records_.capacity()) *
             sizeof(uint32_t) +
         referenced_.capacity() + extents_.capacity() * sizeof(uint64_t) +
         scratch_.capacity();
}

}  // namespace tnet
