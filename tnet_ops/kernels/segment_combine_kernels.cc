// TnetSegmentCombine and TnetSegmentCombineGrad.
//
// Ragged and sparse ids: entry k reads rows[idx[k]] into segment
// segments[k] (any order); segment s is combined with combiners[s % C].
// A layer numbers segments example * C + column, so the [B * C, dim]
// output is its [B, C * dim] block with no copy.
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
#include "tnet_ops/kernels/table_resource.h"
#include "tnet_ops/kernels/row_math.h"

namespace tnet {

namespace tf = ::tensorflow;

namespace {

struct Segments {
  int64_t entries = 0;
  int64_t num_segments = 0;
  int64_t columns = 0;
  const int32_t* idx = nullptr;
  const int64_t* seg = nullptr;
  const int32_t* combiners = nullptr;
};

tf::Status ReadSegments(tf::OpKernelContext* ctx, int first, int64_t rows,
                        Segments* out) {
  const tf::Tensor& idx = ctx->input(first);
  const tf::Tensor& seg = ctx->input(first + 1);
  const tf::Tensor& combiners = ctx->input(first + 3);
  TF_RETURN_IF_ERROR(
      ScalarInput<int64_t>(ctx, first + 2, "num_segments", &out->num_segments));
  if (!tf::TensorShapeUtils::IsVector(idx.shape()) ||
      !tf::TensorShapeUtils::IsVector(seg.shape()) ||
      idx.dim_size(0) != seg.dim_size(0)) {
    return tf::errors::InvalidArgument(
        "idx and segments must be vectors of one length, got ",
        idx.shape().DebugString(), " and ", seg.shape().DebugString());
  }
  if (!tf::TensorShapeUtils::IsVector(combiners.shape()) ||
      combiners.dim_size(0) == 0) {
    return tf::errors::InvalidArgument(
        "combiners must be a non-empty vector (one per column), got ",
        combiners.shape().DebugString());
  }
  out->columns = combiners.dim_size(0);
  if (out->num_segments < 0 || out->num_segments % out->columns != 0) {
    return tf::errors::InvalidArgument(
        "num_segments must be >= 0 and a multiple of the ", out->columns,
        " columns, got ", out->num_segments);
  }
  out->entries = idx.dim_size(0);
  if (out->entries > std::numeric_limits<int32_t>::max()) {
    return tf::errors::InvalidArgument(
        "at most 2^31 - 1 ids per call, got ", out->entries,
        ": split the batch");
  }
  out->idx = idx.flat<int32_t>().data();
  out->seg = seg.flat<int64_t>().data();
  out->combiners = combiners.flat<int32_t>().data();
  for (int64_t c = 0; c < out->columns; ++c) {
    if (out->combiners[c] < kSum || out->combiners[c] > kSqrtn) {
      return tf::errors::InvalidArgument(
          "combiners[", c, "] = ", out->combiners[c],
          " is not 0 (sum), 1 (mean) or 2 (sqrtn)");
    }
  }
  return tf::OkStatus();
}

inline bool AllSum(const Segments& sg) {
  for (int64_t c = 0; c < sg.columns; ++c) {
    if (sg.combiners[c] != kSum) return false;
  }
  return true;
}

// idx in [-1, rows) and segment in [0, num_segments).
inline bool EntryInRange(const Segments& sg, int64_t rows, int64_t idx,
                         int64_t seg) {
  return (static_cast<uint64_t>(seg) < static_cast<uint64_t>(sg.num_segments)) &
         (static_cast<uint64_t>(idx + 1) < static_cast<uint64_t>(rows) + 1);
}

// The one-part combines' loop: add(idx, segment) for every entry in entry
// order whose idx is not -1, prefetch(idx) kAhead entries before (only for
// an idx in range). With `check`, each entry is checked before its add;
// false at the first bad one (nothing after it is read or written).
template <typename Prefetch, typename Add>
bool ForEachEntryInOrder(const Segments& sg, int64_t rows, bool check,
                         Prefetch&& prefetch, Add&& add) {
  for (int64_t k = 0; k < sg.entries; ++k) {
    if (k + kAhead < sg.entries &&
        static_cast<uint64_t>(sg.idx[k + kAhead]) <
            static_cast<uint64_t>(rows)) {
      prefetch(int64_t{sg.idx[k + kAhead]});
    }
    const int64_t i = sg.idx[k];
    const int64_t seg = sg.seg[k];
    if (check && !EntryInRange(sg, rows, i, seg)) return false;
    if (i >= 0) add(i, seg);
  }
  return true;
}

// The first bad entry, as an InvalidArgument (the slow path of ScanSegments).
tf::Status FirstBadEntry(const Segments& sg, int64_t rows) {
  for (int64_t k = 0; k < sg.entries; ++k) {
    if (sg.idx[k] < -1 || sg.idx[k] >= rows) {
      return tf::errors::InvalidArgument("idx[", k, "] = ", sg.idx[k],
                                         " is not in [-1, ", rows, ")");
    }
    if (sg.seg[k] < 0 || sg.seg[k] >= sg.num_segments) {
      return tf::errors::InvalidArgument("segments[", k, "] = ", sg.seg[k],
                                         " is not in [0, ", sg.num_segments,
                                         ")");
    }
  }
  return tf::errors::Internal("no bad segment entry found");
}

// Validates every entry (idx in [-1, rows), segment in [0, num_segments))
// and, unless every combiner is a sum (or rows are 0 wide: nothing to
// scale), returns each segment's factor in *scale (else leaves it empty:
// the factor is 1). One pass over the entries, split over the threads, each
// counting its share into its own counts. Call it once the output exists:
// the counts are num_segments long per thread.
tf::Status ScanSegments(tf::OpKernelContext* ctx, const Segments& sg,
                        int64_t rows, int64_t dim, std::vector<float>* scale) {
  scale->clear();
  bool all_sum = true;
  for (int64_t c = 0; c < sg.columns; ++c) all_sum &= sg.combiners[c] == kSum;
  if (sg.entries == 0) return tf::OkStatus();  // no counts: every factor is 1
  const bool no_counts = all_sum || dim == 0 || sg.num_segments == 0;
  const int64_t parts = Parts(ctx, sg.entries, sg.entries);
  std::vector<std::vector<int32_t>> counts;
  if (!no_counts) {
    try {
      counts.assign(std::max<int64_t>(parts, 1),
                    std::vector<int32_t>(sg.num_segments, 0));
      scale->resize(sg.num_segments);
    } catch (const std::bad_alloc&) {
      return tf::errors::ResourceExhausted(
          "counting the ids of ", sg.num_segments, " segments needs ",
          sg.num_segments * 4 * (parts + 2), " bytes; pass fewer segments");
    }
  }
  std::vector<char> bad(std::max<int64_t>(parts, 1), 0);
  const uint64_t ns = static_cast<uint64_t>(sg.num_segments);
  const uint64_t ids = static_cast<uint64_t>(rows) + 1;
  RunChunks(ctx, parts, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t k0 = sg.entries * p / parts;
      const int64_t k1 = sg.entries * (p + 1) / parts;
      bool b = false;
      for (int64_t k = k0; k < k1; ++k) {
        b |= (static_cast<uint64_t>(sg.seg[k]) >= ns) |
             (static_cast<uint64_t>(int64_t{sg.idx[k]} + 1) >= ids);
      }
      bad[p] = b;
      if (b || no_counts) continue;
      std::vector<int32_t>& n = counts[p];
      for (int64_t k = k0; k < k1; ++k) n[sg.seg[k]] += sg.idx[k] >= 0;
    }
  });
  for (char b : bad) {
    if (b) {
      scale->clear();
      return FirstBadEntry(sg, rows);
    }
  }
  if (no_counts) return tf::OkStatus();
  // The factors, a range of segments per thread (a layer's call has
  // batch x columns of them), the column stepped rather than divided out.
  const int64_t sparts = Parts(ctx, sg.num_segments * 4, sg.num_segments);
  RunChunks(ctx, sparts, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t lo = sg.num_segments * p / sparts;
      const int64_t hi = sg.num_segments * (p + 1) / sparts;
      int64_t column = lo % sg.columns;
      for (int64_t s = lo; s < hi; ++s) {
        int64_t n = 0;
        for (const auto& part : counts) n += part[s];
        (*scale)[s] = Scale(sg.combiners[column], n);
        if (++column == sg.columns) column = 0;
      }
    }
  });
  return tf::OkStatus();
}

// What CombineRuns found.
enum class RunsResult { kDone, kNotRuns, kBadEntry };

// The segment combine when each segment's entries are one contiguous run
// (the layer's order: a dense block row-major, then each ragged or sparse
// piece in example order). The entries are cut into `parts` ranges at run
// boundaries, one per thread; each part reads its runs in entry order,
// checks every entry of a run before reading any of its rows, sums the
// run's rows times the segment's factor (1 / count for a mean, from the
// run's valid ids) into registers, and stores the segment once: the sums
// of the listing path, in the same order, with no pass listing the
// entries per part. Each part marks the segments it wrote in its own
// bitmap; a segment met twice (in one part or two) means the entries are
// not in runs: kNotRuns, and the caller's listing path rewrites every
// output row. Segments no run reached are zeroed. kBadEntry: some entry is
// out of range (the caller names it); no row was read for it.
template <int D>
RunsResult CombineRuns(tf::OpKernelContext* ctx, const Segments& sg,
                       int64_t num_rows, const float* rows, float* out,
                       int64_t parts) {
  const int64_t ns = sg.num_segments;
  const int64_t words = (ns + 63) / 64;
  std::vector<std::vector<uint64_t>> marks;
  std::vector<int64_t> bound(parts + 1, sg.entries);
  try {
    marks.assign(parts, std::vector<uint64_t>(words, 0));
  } catch (const std::bad_alloc&) {
    return RunsResult::kNotRuns;
  }
  bound[0] = 0;
  for (int64_t p = 1; p < parts; ++p) {
    int64_t b = std::max(bound[p - 1], sg.entries * p / parts);
    while (b > 0 && b < sg.entries && sg.seg[b] == sg.seg[b - 1]) ++b;
    bound[p] = b;
  }
  bool uniform = true;  // one combiner for every column: no s % C per run
  for (int64_t c = 1; c < sg.columns; ++c) {
    uniform &= sg.combiners[c] == sg.combiners[0];
  }
  const uint64_t ids = static_cast<uint64_t>(num_rows) + 1;
  // 0 fine, 1 a bad entry, 2 a segment met twice in one part.
  std::vector<char> status(parts, 0);
  RunChunks(ctx, parts, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      uint64_t* mine = marks[p].data();
      const int64_t k1 = bound[p + 1];
      int64_t k = bound[p];
      while (k < k1) {
        const int64_t s = sg.seg[k];
        if (static_cast<uint64_t>(s) >= static_cast<uint64_t>(ns)) {
          status[p] = 1;
          break;
        }
        int64_t e = k;
        int64_t count = 0;
        bool bad = false;
        for (; e < k1 && sg.seg[e] == s; ++e) {
          bad |= static_cast<uint64_t>(int64_t{sg.idx[e]} + 1) >= ids;
          count += sg.idx[e] >= 0;
        }
        if (bad) {
          status[p] = 1;
          break;
        }
        uint64_t& word = mine[s >> 6];
        const uint64_t bit = uint64_t{1} << (s & 63);
        if (word & bit) {
          status[p] = 2;
          break;
        }
        word |= bit;
        const int32_t code = sg.combiners[uniform ? 0 : s % sg.columns];
        const float f = Scale(code, count);
        float acc[D] = {};
        for (int64_t j = k; j < e; ++j) {
          if (j + kAhead < k1 && static_cast<uint64_t>(sg.idx[j + kAhead]) <
                                     static_cast<uint64_t>(num_rows)) {
            __builtin_prefetch(rows + int64_t{sg.idx[j + kAhead]} * D);
          }
          if (sg.idx[j] >= 0) {
            Axpy<D>(acc, rows + int64_t{sg.idx[j]} * D, f, D);
          }
        }
        std::memcpy(out + s * D, acc, sizeof(acc));
        k = e;
      }
    }
  });
  for (char st : status) {
    if (st == 1) return RunsResult::kBadEntry;
  }
  for (char st : status) {
    if (st == 2) return RunsResult::kNotRuns;
  }
  // A segment two parts wrote was split over two runs; a segment none
  // wrote gets zeros.
  for (int64_t w = 0; w < words; ++w) {
    uint64_t any = 0;
    for (int64_t p = 0; p < parts; ++p) {
      if (any & marks[p][w]) return RunsResult::kNotRuns;
      any |= marks[p][w];
    }
    const int64_t hi = std::min<int64_t>(64, ns - w * 64);
    const uint64_t full = hi == 64 ? ~uint64_t{0} : (uint64_t{1} << hi) - 1;
    if (any == full) continue;
    for (int64_t b = 0; b < hi; ++b) {
      if (!(any >> b & 1)) {
        std::memset(out + (w * 64 + b) * D, 0, sizeof(float) * D);
      }
    }
  }
  return RunsResult::kDone;
}

}  // namespace

class TnetSegmentCombineOp : public tf::OpKernel {
 public:
  using tf::OpKernel::OpKernel;

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& rows_t = ctx->input(0);
    OP_REQUIRES(ctx, tf::TensorShapeUtils::IsMatrix(rows_t.shape()),
                tf::errors::InvalidArgument("rows must be [U, dim], got ",
                                            rows_t.shape().DebugString()));
    Segments sg;
    OP_REQUIRES_OK(ctx, ReadSegments(ctx, 1, rows_t.dim_size(0), &sg));
    const int64_t dim = rows_t.dim_size(1);
    tf::TensorShape shape;
    OP_REQUIRES(ctx, tf::TensorShape::BuildTensorShape({sg.num_segments, dim},
                                                       &shape).ok(),
                tf::errors::InvalidArgument("num_segments * dim overflows"));
    tf::Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out_t));
    const int64_t num_rows = rows_t.dim_size(0);
    bool compiled = false;  // a row width with its own compiled loop
    ForRowWidth(dim, [&](auto kDim) { compiled = decltype(kDim)::value > 0; });
    // Compiled widths check and count while each part lists its entries
    // (below); any other width takes one separate pass first.
    std::vector<float> scale;  // empty: every factor is 1
    bool scanned = false;
    if (!compiled || sg.num_segments == 0) {
      OP_REQUIRES_OK(ctx, ScanSegments(ctx, sg, num_rows, dim, &scale));
      scanned = true;
    }
    float* out = out_t->flat<float>().data();
    if (sg.num_segments == 0 || dim == 0) return;
    const float* rows = rows_t.flat<float>().data();
    const int64_t parts = NarrowParts(ctx, sg.entries, dim, sg.num_segments);
    if (parts == 1) {
      // One part: no list. Each entry adds its row straight into its
      // segment, in entry order: the sums of the parts below, in the same
      // order. With sums only, each entry is checked just before its row is
      // read; else a first pass checks them all and counts for the means.
      const bool inline_check = !scanned && AllSum(sg);
      if (!scanned && !inline_check) {
        OP_REQUIRES_OK(ctx, ScanSegments(ctx, sg, num_rows, dim, &scale));
      }
      std::memset(out, 0, sizeof(float) * sg.num_segments * dim);
      const float* sc = scale.empty() ? nullptr : scale.data();
      bool good = true;
      ForRowWidth(dim, [&](auto kDim) {
        constexpr int D = decltype(kDim)::value;
        good = ForEachEntryInOrder(
            sg, num_rows, inline_check,
            [&](int64_t i) { __builtin_prefetch(rows + i * dim); },
            [&](int64_t i, int64_t seg) {
              Axpy<D>(out + seg * dim, rows + i * dim,
                      sc != nullptr ? sc[seg] : 1.0f, dim);
            });
      });
      if (!good) OP_REQUIRES_OK(ctx, FirstBadEntry(sg, num_rows));
      return;
    }
    // Entries in runs (the layer's order) need no listing: one range of
    // entries per part. Any other order falls through to the listing path.
    if (compiled && !scanned) {
      RunsResult runs = RunsResult::kNotRuns;
      ForRowWidth(dim, [&](auto kDim) {
        constexpr int D = decltype(kDim)::value;
        if constexpr (D > 0) {
          runs = CombineRuns<D>(ctx, sg, num_rows, rows, out, parts);
        }
      });
      if (runs == RunsResult::kBadEntry) {
        OP_REQUIRES_OK(ctx, FirstBadEntry(sg, num_rows));
      }
      if (runs == RunsResult::kDone) return;
    }
    bool all_sum = true;
    for (int64_t c = 0; c < sg.columns; ++c) all_sum &= sg.combiners[c] == kSum;
    std::vector<char> bad(parts, 0);  // 1: a bad entry, 2: out of memory
    // Each part owns a range of segments: no two threads add into one row.
    // It lists its entries without a branch, then adds them in entry order,
    // fetching the rows a few entries ahead; a run of entries of one segment
    // (the layer's order) is summed in registers and stored once. A
    // segment's first run starts from zeros (no pass zeroing the whole
    // output first); the segments no entry reached are zeroed at the end.
    // With a compiled width the listing pass also checks every entry (each
    // part checks all of them: none reads a row before all are known good)
    // and counts its own segments' ids for the mean / sqrtn factors.
    ForRowWidth(dim, [&](auto kDim) {
    constexpr int D = decltype(kDim)::value;
    RunChunks(ctx, parts, [&](int64_t p0, int64_t p1) {
      int32_t* const mine = EntryList(sg.entries);
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t lo = sg.num_segments * p / parts;
        const int64_t hi = sg.num_segments * (p + 1) / parts;
        const uint64_t span = static_cast<uint64_t>(hi - lo);
        int64_t n = 0;
        if constexpr (D > 0) try {
          const uint64_t ns = static_cast<uint64_t>(sg.num_segments);
          const uint64_t ids = static_cast<uint64_t>(num_rows) + 1;
          std::vector<int32_t> count(all_sum ? 0 : span + 1, 0);
          bool b = false;
          for (int64_t k = 0; k < sg.entries; ++k) {
            const uint64_t rel = static_cast<uint64_t>(sg.seg[k] - lo);
            const bool own = rel < span;
            const bool valid = sg.idx[k] >= 0;
            b |= (static_cast<uint64_t>(sg.seg[k]) >= ns) |
                 (static_cast<uint64_t>(int64_t{sg.idx[k]} + 1) >= ids);
            mine[n] = static_cast<int32_t>(k);
            n += own & valid;
            if (!all_sum) count[own ? rel : span] += valid;
          }
          if (b) {
            bad[p] = 1;
            continue;
          }
          std::vector<float> factors;
          if (!all_sum) {
            factors.resize(span);
            int64_t column = lo % sg.columns;
            for (uint64_t s = 0; s < span; ++s) {
              factors[s] = Scale(sg.combiners[column], count[s]);
              if (++column == sg.columns) column = 0;
            }
          }
          auto row_of = [&](int64_t i) {
            return rows + static_cast<int64_t>(sg.idx[mine[i]]) * dim;
          };
          std::vector<bool> seen(span, false);
          float acc[D];
          int64_t cur = -1;
          float f = 1.0f;
          for (int64_t i = 0; i < n; ++i) {
            if (i + kAhead < n) __builtin_prefetch(row_of(i + kAhead));
            const int64_t s = sg.seg[mine[i]];
            if (s != cur) {
              if (cur >= 0) std::memcpy(out + cur * D, acc, sizeof(acc));
              if (seen[s - lo]) {
                std::memcpy(acc, out + s * D, sizeof(acc));
              } else {
                std::memset(acc, 0, sizeof(acc));
                seen[s - lo] = true;
              }
              cur = s;
              if (!all_sum) f = factors[s - lo];
            }
            Axpy<D>(acc, row_of(i), f, D);
          }
          if (cur >= 0) std::memcpy(out + cur * D, acc, sizeof(acc));
          for (int64_t s = lo; s < hi; ++s) {
            if (!seen[s - lo]) std::memset(out + s * D, 0, sizeof(acc));
          }
        } catch (const std::bad_alloc&) {  // this part's counts and marks
          bad[p] = 2;
        } else {
          const float* sc = scale.empty() ? nullptr : scale.data();
          for (int64_t k = 0; k < sg.entries; ++k) {
            mine[n] = static_cast<int32_t>(k);
            n += (static_cast<uint64_t>(sg.seg[k] - lo) < span) &
                 (sg.idx[k] >= 0);
          }
          std::memset(out + lo * dim, 0, sizeof(float) * (hi - lo) * dim);
          for (int64_t i = 0; i < n; ++i) {
            const int64_t s = sg.seg[mine[i]];
            Axpy<D>(out + s * dim,
                    rows + static_cast<int64_t>(sg.idx[mine[i]]) * dim,
                    sc != nullptr ? sc[s] : 1.0f, dim);
          }
        }
      }
    });
    });
    for (char b : bad) {
      OP_REQUIRES(ctx, b != 2,
                  tf::errors::ResourceExhausted(
                      "counting the ids of ", sg.num_segments,
                      " segments needs ", sg.num_segments * 9,
                      " bytes; pass fewer segments"));
    }
    for (char b : bad) {
      if (b) {
        OP_REQUIRES_OK(ctx, FirstBadEntry(sg, num_rows));
      }
    }
  }
};

class TnetSegmentCombineGradOp : public tf::OpKernel {
 public:
  using tf::OpKernel::OpKernel;

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& grad_t = ctx->input(0);
    int64_t num_rows = 0;
    OP_REQUIRES_OK(ctx, ScalarInput<int64_t>(ctx, 5, "num_rows", &num_rows));
    OP_REQUIRES(ctx, num_rows >= 0 && num_rows <= (int64_t{1} << 31),
                tf::errors::InvalidArgument("num_rows must be in [0, 2^31], "
                                            "got ", num_rows));
    Segments sg;
    OP_REQUIRES_OK(ctx, ReadSegments(ctx, 1, num_rows, &sg));
    OP_REQUIRES(ctx,
                tf::TensorShapeUtils::IsMatrix(grad_t.shape()) &&
                    grad_t.dim_size(0) == sg.num_segments,
                tf::errors::InvalidArgument(
                    "grad must be [", sg.num_segments, ", dim], got ",
                    grad_t.shape().DebugString()));
    const int64_t dim = grad_t.dim_size(1);
    const int64_t parts = NarrowParts(ctx, sg.entries, dim, num_rows);
    // One part of sums only checks each entry just before it writes
    // (below); otherwise one pass checks them all first (and counts).
    const bool inline_check = parts == 1 && AllSum(sg) && dim > 0 &&
                              num_rows > 0 && sg.entries > 0;
    std::vector<float> scale;  // empty: every factor is 1
    if (!inline_check) {
      OP_REQUIRES_OK(ctx, ScanSegments(ctx, sg, num_rows, dim, &scale));
    }
    tf::TensorShape shape;
    OP_REQUIRES(ctx, tf::TensorShape::BuildTensorShape({num_rows, dim},
                                                       &shape).ok(),
                tf::errors::InvalidArgument("num_rows * dim overflows"));
    tf::Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out_t));
    float* out = out_t->flat<float>().data();
    if (num_rows == 0 || dim == 0) return;
    if (sg.entries == 0) {
      std::memset(out, 0, sizeof(float) * num_rows * dim);
      return;
    }
    const float* grad = grad_t.flat<float>().data();
    const float* sc = scale.empty() ? nullptr : scale.data();
    auto factor = [sc](int64_t s) { return sc != nullptr ? sc[s] : 1.0f; };
    if (parts == 1) {
      // One part: no list; every entry adds into its row in entry order
      // (the order of the parts below).
      std::memset(out, 0, sizeof(float) * num_rows * dim);
      bool good = true;
      ForRowWidth(dim, [&](auto kDim) {
        constexpr int D = decltype(kDim)::value;
        good = ForEachEntryInOrder(
            sg, num_rows, inline_check,
            [&](int64_t i) { __builtin_prefetch(out + i * dim, 1); },
            [&](int64_t i, int64_t seg) {
              Axpy<D>(out + i * dim, grad + seg * dim, factor(seg), dim);
            });
      });
      if (!good) OP_REQUIRES_OK(ctx, FirstBadEntry(sg, num_rows));
      return;
    }
    ForRowWidth(dim, [&](auto kDim) {
    constexpr int D = decltype(kDim)::value;
    RunChunks(ctx, parts, [&](int64_t p0, int64_t p1) {
      // The entries whose row this part owns, listed without a branch (the
      // rows are random: a skip test per entry mispredicts half the time),
      // then added in entry order (the same sums on any number of parts).
      int32_t* const mine = EntryList(sg.entries);
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t lo = num_rows * p / parts;
        const uint32_t span =
            static_cast<uint32_t>(num_rows * (p + 1) / parts - lo);
        std::memset(out + lo * dim, 0, sizeof(float) * span * dim);
        int64_t n = 0;
        for (int64_t k = 0; k < sg.entries; ++k) {
          mine[n] = static_cast<int32_t>(k);
          n += static_cast<uint32_t>(sg.idx[k] - lo) < span;
        }
        for (int64_t i = 0; i < n; ++i) {
          if (i + kAhead < n) {
            __builtin_prefetch(
                out + static_cast<int64_t>(sg.idx[mine[i + kAhead]]) * dim, 1);
          }
          const int64_t k = mine[i];
          const int64_t s = sg.seg[k];
          Axpy<D>(out + static_cast<int64_t>(sg.idx[k]) * dim, grad + s * dim,
                  factor(s), dim);
        }
      }
    });
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("TnetSegmentCombine").Device(tf::DEVICE_CPU),
                        TnetSegmentCombineOp);
REGISTER_KERNEL_BUILDER(Name("TnetSegmentCombineGrad").Device(tf::DEVICE_CPU),
                        TnetSegmentCombineGradOp);

}  // namespace tnet
