// TnetDecodeRows: the lines of a CSV/TSV batch to their columns in one pass
// over the bytes, with the row check the reader did by an RE2 full match.
//
// The feature-spec reader checked every line against one regular
// expression (the fields' patterns joined by the delimiter), split it into
// cells, and decoded each column with its own chain of string ops (where
// on empty cells, tf.strings.to_number, ...): ~45 ops per chunk, and a
// string tensor per column. This kernel does all of it per line: split on
// the delimiter, check each cell against its column's pattern exactly as
// RE2 matches it (tests/test_decode_rows.py compares with RE2 on random
// and hostile lines), and write the numbers, ids, cells and id lists. A
// line that does not match gets ok = false (the reader drops or reports
// it, as before; its values are unspecified).
// Numbers parse with
// absl::SimpleAtod, the function tf.strings.to_number uses, so the values
// are the stock chain's to the bit.
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/numbers.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tnet_ops/kernels/table_resource.h"

namespace tnet {

namespace tf = ::tensorflow;

namespace {

// Column kinds (tnet/data/readers.py _ROW_KINDS keeps the same numbers).
enum Kind : int {
  kSkip = 0,        // [^delim\r\n]*, not decoded
  kLabel01 = 1,     // [01] -> double
  kLabelUnit = 2,   // 0(\.D*)?|1(\.0*)?|\.D+ -> double
  kDenseInt = 3,    // (-?D{1,18})? -> double, pad when empty
  kDenseNum = 4,    // (NUM)? -> double, pad when empty
  kWeightInt = 5,   // (D{1,18})? -> double, pad when empty
  kWeightNum = 6,   // (NUM without the sign)? -> double, pad when empty
  kIdInt = 7,       // (-?D{1,18})? -> int64, pad when empty
  kString = 8,      // [^delim\r\n]* -> the cell
  kIdsInt = 9,      // (INT(sep INT)*)? -> ragged int64
  kNumKinds = 10,
};

inline bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Digits from p: how many (stops at end or a non-digit).
inline int64_t Digits(const char* p, const char* end) {
  const char* s = p;
  while (p < end && IsDigit(*p)) ++p;
  return p - s;
}

// -?D{1,18} exactly, over the whole [p, end).
inline bool IsInt(const char* p, const char* end, bool sign) {
  if (sign && p < end && *p == '-') ++p;
  const int64_t n = end - p;
  return n >= 1 && n <= 18 && Digits(p, end) == n;
}

// -?(D{1,18}(\.D*)?|\.D+)([eE][-+]?D{1,2})? over the whole [p, end).
bool IsNum(const char* p, const char* end, bool sign) {
  if (sign && p < end && *p == '-') ++p;
  if (p < end && *p == '.') {
    ++p;
    const int64_t n = Digits(p, end);
    if (n == 0) return false;
    p += n;
  } else {
    const int64_t n = Digits(p, end);
    if (n < 1 || n > 18) return false;
    p += n;
    if (p < end && *p == '.') {
      ++p;
      p += Digits(p, end);
    }
  }
  if (p == end) return true;
  if (*p != 'e' && *p != 'E') return false;
  ++p;
  if (p < end && (*p == '-' || *p == '+')) ++p;
  const int64_t n = Digits(p, end);
  return n >= 1 && n <= 2 && p + n == end;
}

// 0(\.D*)?|1(\.0*)?|\.D+ over the whole [p, end).
bool IsUnit(const char* p, const char* end) {
  if (p == end) return false;
  if (*p == '.') return end - p >= 2 && Digits(p + 1, end) == end - p - 1;
  if (*p != '0' && *p != '1') return false;
  const char first = *p++;
  if (p == end) return true;
  if (*p != '.') return false;
  ++p;
  if (first == '0') return Digits(p, end) == end - p;
  while (p < end && *p == '0') ++p;
  return p == end;
}

// [^\r\n]* as RE2 matches it in its default UTF-8 mode: ASCII but CR and
// LF, or a lead byte C2-DF, E0-EF or F0-F4 followed by 1, 2 or 3
// continuation bytes (80-BF). RE2's byte ranges check no more than that
// (it accepts E0 80 80 and F4 90 80 80; tests/test_decode_rows.py
// compares), so neither does this.
bool IsAnyCell(const char* p, const char* end) {
  const auto* s = reinterpret_cast<const unsigned char*>(p);
  const auto* e = reinterpret_cast<const unsigned char*>(end);
  while (s < e) {
    const unsigned c = *s;
    if (c < 0x80) {
      if (c == '\r' || c == '\n') return false;
      ++s;
      continue;
    }
    int n;
    if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
    } else {
      return false;
    }
    if (e - s <= n) return false;
    for (int i = 1; i <= n; ++i) {
      if ((s[i] & 0xC0) != 0x80) return false;
    }
    s += n + 1;
  }
  return true;
}

// A checked INT (at most 18 digits): no overflow possible.
inline int64_t ParseCheckedInt(const char* p, const char* end) {
  const bool negative = *p == '-';
  if (negative) ++p;
  int64_t v = 0;
  for (; p < end; ++p) v = v * 10 + (*p - '0');
  return negative ? -v : v;
}

// Parses (INT(sep INT)*)? over the whole cell into out (room for every
// id); false if the cell does not match (out then holds a prefix).
bool ParseIdList(const char* p, const char* end, char sep, int64_t* out) {
  if (p == end) return true;
  while (true) {
    const bool negative = *p == '-';
    p += negative;
    const char* q = p;
    uint64_t v = 0;  // unsigned: a run of more than 18 digits (refused
                     // below) wraps instead of overflowing
    unsigned d;
    while (q < end && (d = static_cast<unsigned char>(*q) - '0') <= 9) {
      v = v * 10 + d;
      ++q;
    }
    if (q == p || q - p > 18) return false;
    const auto value = static_cast<int64_t>(v);
    *out++ = negative ? -value : value;
    if (q == end) return true;
    if (*q != sep || q + 1 == end) return false;
    p = q + 1;
  }
}

// -?D*(\.D*)? with at most 15 digits in all and at most 22 after the
// point, as a double: the digits as an integer m (< 10^15 < 2^53, exact),
// divided by 10^k (exact for k <= 22): one correctly rounded division,
// so the correctly rounded value of the decimal, what absl::SimpleAtod
// gives (Clinger's fast path). Anything else (an exponent, more digits)
// returns false and goes to SimpleAtod. The cell's pattern was checked.
bool FastDecimal(const char* p, const char* end, double* out) {
  static constexpr double kPow10[23] = {
      1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
      1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
  const bool negative = p < end && *p == '-';
  p += negative;
  uint64_t m = 0;
  int digits = 0, fraction = -1;  // fraction: digits after the point
  for (; p < end; ++p) {
    const unsigned d = static_cast<unsigned char>(*p) - '0';
    if (d <= 9) {
      m = m * 10 + d;
      if (++digits > 15) return false;
      fraction += fraction >= 0;
    } else if (*p == '.' && fraction < 0) {
      fraction = 0;
    } else {
      return false;
    }
  }
  if (digits == 0) return false;
  const int k = fraction < 0 ? 0 : fraction;
  if (k > 22) return false;
  const double v = static_cast<double>(m) / kPow10[k];
  *out = negative ? -v : v;
  return true;
}

// The delimiters of a line: cut[c] = the start of cell c (just after the
// c-th delimiter) for c = 1, 2, ...; stops at the cols-th delimiter (one
// too many). Returns how many delimiters it found (at most cols). With
// SSE2 the line is compared 16 bytes at a time and the delimiters read
// off the match mask (a memchr call per cell cost more than the cells'
// checks on short numeric cells); else one memchr per cell.
int64_t CutCells(const char* line, int64_t size, char delim, int64_t cols,
                 uint32_t* cut) {
  int64_t c = 0;
#if defined(__SSE2__)
  const __m128i d = _mm_set1_epi8(delim);
  int64_t i = 0;
  for (; i + 16 <= size; i += 16) {
    unsigned mask = static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(line + i)), d)));
    while (mask != 0) {
      const int bit = __builtin_ctz(mask);
      mask &= mask - 1;
      if (++c >= cols) return c;
      cut[c] = static_cast<uint32_t>(i + bit + 1);
    }
  }
  for (; i < size; ++i) {
    if (line[i] != delim) continue;
    if (++c >= cols) return c;
    cut[c] = static_cast<uint32_t>(i + 1);
  }
#else
  const char* end = line + size;
  for (const char* p = line;;) {
    p = static_cast<const char*>(std::memchr(p, delim, end - p));
    if (p == nullptr || ++c >= cols) break;
    cut[c] = static_cast<uint32_t>(++p - line);
  }
#endif
  return c;
}

double BitsToDouble(int64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

}  // namespace

class TnetDecodeRowsOp : public tf::OpKernel {
 public:
  explicit TnetDecodeRowsOp(tf::OpKernelConstruction* ctx)
      : tf::OpKernel(ctx) {
    std::string delim;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("delimiter", &delim));
    OP_REQUIRES(ctx, delim.size() == 1 && delim[0] != '\n' && delim[0] != '\r',
                tf::errors::InvalidArgument(
                    "delimiter must be one character other than CR and LF, "
                    "got \"", delim, "\""));
    delim_ = delim[0];
    std::vector<int64_t> kinds;
    std::vector<std::string> seps;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("kinds", &kinds));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("separators", &seps));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("pads", &pads_));
    OP_REQUIRES(ctx, !kinds.empty() && seps.size() == kinds.size() &&
                         pads_.size() == kinds.size(),
                tf::errors::InvalidArgument(
                    "kinds, separators and pads need one entry per column "
                    "(and at least one column); got ", kinds.size(), ", ",
                    seps.size(), ", ", pads_.size()));
    int counts[4] = {0, 0, 0, 0};  // floats, ints, strings, lists
    for (size_t c = 0; c < kinds.size(); ++c) {
      const int64_t k = kinds[c];
      OP_REQUIRES(ctx, k >= 0 && k < kNumKinds,
                  tf::errors::InvalidArgument("kinds[", c, "] = ", k,
                                              " is not a column kind (0..",
                                              kNumKinds - 1, ")"));
      OP_REQUIRES(ctx, k != kIdsInt || (seps[c].size() == 1 &&
                                        seps[c][0] != delim_ &&
                                        seps[c][0] != '\n' &&
                                        seps[c][0] != '\r'),
                  tf::errors::InvalidArgument(
                      "separators[", c, "] must be one character other "
                      "than the delimiter, CR and LF, got \"", seps[c], "\""));
      kinds_.push_back(static_cast<int>(k));
      seps_.push_back(seps[c].empty() ? '\0' : seps[c][0]);
      int out = -1;
      if (k == kIdInt) {
        out = 1;
      } else if (k == kString) {
        out = 2;
      } else if (k == kIdsInt) {
        out = 3;
      } else if (k != kSkip) {
        out = 0;
      }
      slot_.push_back(out < 0 ? -1 : counts[out]++);
    }
    int declared[4];
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_floats", &declared[0]));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_ints", &declared[1]));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_strings", &declared[2]));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_lists", &declared[3]));
    for (int i = 0; i < 4; ++i) {
      OP_REQUIRES(ctx, declared[i] == counts[i],
                  tf::errors::InvalidArgument(
                      "num_floats/num_ints/num_strings/num_lists must count "
                      "the kinds' outputs: declared ", declared[0], "/",
                      declared[1], "/", declared[2], "/", declared[3],
                      ", kinds give ", counts[0], "/", counts[1], "/",
                      counts[2], "/", counts[3]));
    }
    for (int i = 0; i < 4; ++i) counts_[i] = counts[i];
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& lines_t = ctx->input(0);
    OP_REQUIRES(ctx, tf::TensorShapeUtils::IsVector(lines_t.shape()),
                tf::errors::InvalidArgument("lines must be 1-D, got shape ",
                                            lines_t.shape().DebugString()));
    const auto lines = lines_t.flat<tf::tstring>();
    const int64_t n = lines.size();
    const int64_t cols = static_cast<int64_t>(kinds_.size());
    const tf::TensorShape rows_shape({n});

    tf::OpOutputList floats, ints, strings, values, splits;
    OP_REQUIRES_OK(ctx, ctx->output_list("floats", &floats));
    OP_REQUIRES_OK(ctx, ctx->output_list("ints", &ints));
    OP_REQUIRES_OK(ctx, ctx->output_list("strings", &strings));
    OP_REQUIRES_OK(ctx, ctx->output_list("list_values", &values));
    OP_REQUIRES_OK(ctx, ctx->output_list("list_splits", &splits));
    tf::Tensor* ok_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output("ok", rows_shape, &ok_t));
    std::vector<double*> f_out(counts_[0]);
    std::vector<int64_t*> i_out(counts_[1]);
    std::vector<tf::tstring*> s_out(counts_[2]);
    std::vector<int64_t*> sp_out(counts_[3]);
    for (int i = 0; i < counts_[0]; ++i) {
      tf::Tensor* t = nullptr;
      OP_REQUIRES_OK(ctx, floats.allocate(i, rows_shape, &t));
      f_out[i] = t->flat<double>().data();
    }
    for (int i = 0; i < counts_[1]; ++i) {
      tf::Tensor* t = nullptr;
      OP_REQUIRES_OK(ctx, ints.allocate(i, rows_shape, &t));
      i_out[i] = t->flat<int64_t>().data();
    }
    for (int i = 0; i < counts_[2]; ++i) {
      tf::Tensor* t = nullptr;
      OP_REQUIRES_OK(ctx, strings.allocate(i, rows_shape, &t));
      s_out[i] = t->flat<tf::tstring>().data();
    }
    for (int i = 0; i < counts_[3]; ++i) {
      tf::Tensor* t = nullptr;
      OP_REQUIRES_OK(ctx, splits.allocate(i, tf::TensorShape({n + 1}), &t));
      sp_out[i] = t->flat<int64_t>().data();
      sp_out[i][0] = 0;
    }
    bool* ok = ok_t->flat<bool>().data();
    // Cell starts per line (cols + 1 each; the last is the line's end + 1),
    // kept for the id lists' second pass.
    std::vector<uint32_t> starts(counts_[3] > 0 ? n * (cols + 1) : 0);
    const ParallelRunner run = MakeRunner(ctx);

    // 1. Split, check and decode every scalar column; count list ids.
    auto first = [&](int64_t b, int64_t e) {
      std::vector<uint32_t> local(cols + 1);
      for (int64_t r = b; r < e; ++r) {
        const char* line = lines(r).data();
        const int64_t size = static_cast<int64_t>(lines(r).size());
        uint32_t* cut = counts_[3] > 0 ? &starts[r * (cols + 1)] : local.data();
        bool good = size < (int64_t{1} << 32) - 1;
        // Split: exactly cols cells, cut[c] the start of cell c.
        int64_t c = 0;
        cut[0] = 0;
        if (good) {
          c = CutCells(line, size, delim_, cols, cut);
          good = c == cols - 1;
          if (good) cut[cols] = static_cast<uint32_t>(size + 1);
        }
        for (c = 0; c < cols && good; ++c) {
          const char* p = line + cut[c];
          const char* end = line + cut[c + 1] - 1;
          switch (kinds_[c]) {
            case kSkip:
            case kString:
              good = IsAnyCell(p, end);
              break;
            case kLabel01:
              good = end - p == 1 && (*p == '0' || *p == '1');
              break;
            case kLabelUnit:
              good = IsUnit(p, end);
              break;
            case kDenseInt:
            case kIdInt:
              good = p == end || IsInt(p, end, true);
              break;
            case kWeightInt:
              good = p == end || IsInt(p, end, false);
              break;
            case kDenseNum:
              good = p == end || IsNum(p, end, true);
              break;
            case kWeightNum:
              good = p == end || IsNum(p, end, false);
              break;
            case kIdsInt:
              // The ids' count; their syntax is checked as they parse, in
              // the second pass.
              sp_out[slot_[c]][r + 1] =
                  p == end ? 0 : 1 + std::count(p, end, seps_[c]);
              break;
          }
        }
        ok[r] = good;
        for (c = 0; c < cols; ++c) {
          const int k = kinds_[c];
          if (k == kSkip) continue;
          const int s = slot_[c];
          const char* p = good ? line + cut[c] : nullptr;
          const char* end = good ? line + cut[c + 1] - 1 : nullptr;
          const bool empty = p == end;
          switch (k) {
            case kIdInt:
              i_out[s][r] = empty ? pads_[c] : ParseCheckedInt(p, end);
              break;
            case kString:
              if (good) {
                s_out[s][r].assign(p, end - p);
              }
              break;
            case kIdsInt:
              if (!good) sp_out[s][r + 1] = 0;
              break;
            case kLabel01:
              f_out[s][r] = good && *p == '1' ? 1.0 : 0.0;
              break;
            default: {  // a number
              double v = 0.0;
              if (empty) {
                v = good ? BitsToDouble(pads_[c]) : 0.0;
              } else if (!FastDecimal(p, end, &v) &&
                         !absl::SimpleAtod(absl::string_view(p, end - p),
                                           &v)) {
                v = 0.0;  // unreachable: the pattern held
              }
              f_out[s][r] = v;
            }
          }
        }
      }
    };
    run(n, 100 * cols + 200, first);
    if (counts_[3] == 0) return;

    // 2. The id lists: prefix sums, then parse into place.
    std::vector<int64_t*> v_out(counts_[3]);
    for (int i = 0; i < counts_[3]; ++i) {
      int64_t* sp = sp_out[i];
      for (int64_t r = 0; r < n; ++r) sp[r + 1] += sp[r];
      tf::Tensor* t = nullptr;
      OP_REQUIRES_OK(ctx, values.allocate(i, tf::TensorShape({sp[n]}), &t));
      v_out[i] = t->flat<int64_t>().data();
    }
    auto second = [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        if (!ok[r]) continue;
        const char* line = lines(r).data();
        const uint32_t* cut = &starts[r * (cols + 1)];
        for (int64_t c = 0; c < cols; ++c) {
          if (kinds_[c] != kIdsInt) continue;
          const int s = slot_[c];
          int64_t* out = v_out[s] + sp_out[s][r];
          if (!ParseIdList(line + cut[c], line + cut[c + 1] - 1, seps_[c],
                           out)) {
            ok[r] = false;
            std::fill(out, v_out[s] + sp_out[s][r + 1], 0);
          }
        }
      }
    };
    run(n, 400, second);
  }

 private:
  char delim_ = ',';
  std::vector<int> kinds_;
  std::vector<char> seps_;
  std::vector<int64_t> pads_;
  std::vector<int> slot_;  // per column: its index in its output list
  int counts_[4] = {0, 0, 0, 0};
};

REGISTER_KERNEL_BUILDER(Name("TnetDecodeRows").Device(tf::DEVICE_CPU),
                        TnetDecodeRowsOp);

}  // namespace tnet
