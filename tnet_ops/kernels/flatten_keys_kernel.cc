// TnetFlattenKeys: the keys of all int64 id columns of one table in one
// pass, in place of the per-column chain of a layer (slice each [B] column
// to [B, 1], concat the block, compare with the padding, XOR the salts, the
// ragged row ids, their segments, and a concat of every column's keys,
// masks and segments: ~20 small ops and four copies of the batch's ids).
//
// Output order is the order that chain produces: the N block columns as
// one row-major [B, N] block, then each ragged column's values in turn.
// With `compact` the padding (-1) is dropped and each key comes with its
// combine segment (example * num_slots + the column's slot); without it
// every id keeps its place and `valid` marks the padding.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tnet {

namespace tf = ::tensorflow;

namespace {

constexpr int64_t kPadding = -1;
constexpr int64_t kUnitIds = 32768;  // ids per unit of parallel work

// A contiguous piece of the output: block rows [begin, end), or the values
// [begin, end) of ragged column `column`; `out` is its first output slot.
struct Unit {
  bool block;
  int64_t column;
  int64_t begin;
  int64_t end;
  int64_t out;
};

// Block rows [r0, r1) of the N columns `ids` from output slot o.
template <bool Compact>
void WriteBlock(const int64_t* const* ids, int64_t n, const int64_t* salt,
                const int64_t* slot, int64_t width, int64_t r0, int64_t r1,
                int64_t o, int64_t* __restrict keys, bool* __restrict valid,
                int64_t* __restrict seg) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t base = r * width;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t id = ids[j][r];
      if (Compact) {
        if (id == kPadding) continue;
        seg[o] = base + slot[j];
      } else {
        valid[o] = id != kPadding;
      }
      keys[o++] = id ^ salt[j];
    }
  }
}

// Values [v0, v1) of one ragged column (row_splits s) from output slot o.
template <bool Compact>
void WriteRagged(const int64_t* p, const int64_t* s, int64_t batch,
                 int64_t salt, int64_t slot, int64_t width, int64_t v0,
                 int64_t v1, int64_t o, int64_t* __restrict keys,
                 bool* __restrict valid, int64_t* __restrict seg) {
  // The example holding value v0: the last r with s[r] <= v0.
  int64_t r = std::upper_bound(s, s + batch + 1, v0) - s - 1;
  int64_t next = s[r + 1];
  int64_t base = r * width + slot;
  for (int64_t v = v0; v < v1; ++v) {
    while (next <= v) {
      ++r;
      next = s[r + 1];
      base = r * width + slot;
    }
    const int64_t id = p[v];
    if (Compact) {
      if (id == kPadding) continue;
      seg[o] = base;
    } else {
      valid[o] = id != kPadding;
    }
    keys[o++] = id ^ salt;
  }
}

}  // namespace

class TnetFlattenKeysOp : public tf::OpKernel {
 public:
  explicit TnetFlattenKeysOp(tf::OpKernelConstruction* ctx)
      : tf::OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("M", &m_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("salts", &salts_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slots", &slots_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_slots", &num_slots_));
    OP_REQUIRES(ctx, num_slots_ >= 1 && num_slots_ <= (int64_t{1} << 20),
                tf::errors::InvalidArgument("num_slots must be in [1, 2^20], "
                                            "got ", num_slots_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("compact", &compact_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("names", &names_));
    const int64_t columns = n_ + m_;
    OP_REQUIRES(ctx, columns >= 1,
                tf::errors::InvalidArgument("no id columns (N + M = 0)"));
    OP_REQUIRES(ctx,
                salts_.empty() ||
                    static_cast<int64_t>(salts_.size()) == columns,
                tf::errors::InvalidArgument("salts must be empty or hold one "
                                            "salt per column (", columns,
                                            "), got ", salts_.size()));
    OP_REQUIRES(ctx, static_cast<int64_t>(slots_.size()) == columns,
                tf::errors::InvalidArgument("slots must hold one slot per "
                                            "column (", columns, "), got ",
                                            slots_.size()));
    for (int64_t s : slots_) {
      OP_REQUIRES(ctx, s >= 0 && s < num_slots_,
                  tf::errors::InvalidArgument("slot ", s, " is outside [0, ",
                                              num_slots_, ")"));
    }
    OP_REQUIRES(ctx,
                names_.empty() ||
                    static_cast<int64_t>(names_.size()) == columns,
                tf::errors::InvalidArgument("names must be empty or hold one "
                                            "name per column (", columns,
                                            "), got ", names_.size()));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    tf::OpInputList block, values, splits;
    OP_REQUIRES_OK(ctx, ctx->input_list("block", &block));
    OP_REQUIRES_OK(ctx, ctx->input_list("values", &values));
    OP_REQUIRES_OK(ctx, ctx->input_list("splits", &splits));

    // 1. Shapes: every column has the same number of examples B.
    int64_t batch = -1;
    int64_t first = 0;  // the column that fixed B
    auto rows_of = [&](int64_t column, int64_t rows) -> bool {
      if (batch < 0) {
        batch = rows;
        first = column;
        return true;
      }
      if (rows == batch) return true;
      ctx->CtxFailure(tf::errors::InvalidArgument(
          Name(column), " has ", rows, " examples but ", Name(first), " has ",
          batch, ": every feature of a batch needs one entry per example"));
      return false;
    };
    for (int64_t j = 0; j < n_; ++j) {
      const tf::TensorShape& s = block[j].shape();
      OP_REQUIRES(ctx,
                  s.dims() == 1 || (s.dims() == 2 && s.dim_size(1) == 1),
                  tf::errors::InvalidArgument(
                      Name(j), ": block ids must be [batch] or [batch, 1], "
                      "got shape ", s.DebugString()));
      if (!rows_of(j, s.dim_size(0))) return;
    }
    std::vector<const int64_t*> vals(m_), spl(m_);
    std::vector<int64_t> lens(m_);
    for (int64_t j = 0; j < m_; ++j) {
      const int64_t column = n_ + j;
      const tf::Tensor& v = values[j];
      const tf::Tensor& s = splits[j];
      OP_REQUIRES(ctx,
                  tf::TensorShapeUtils::IsVector(v.shape()) &&
                      tf::TensorShapeUtils::IsVector(s.shape()) &&
                      s.dim_size(0) >= 1,
                  tf::errors::InvalidArgument(
                      Name(column), ": ragged values and row_splits must be "
                      "vectors (row_splits non-empty), got shapes ",
                      v.shape().DebugString(), " and ",
                      s.shape().DebugString()));
      if (!rows_of(column, s.dim_size(0) - 1)) return;
      const int64_t* p = s.flat<int64_t>().data();
      const int64_t rows = s.dim_size(0) - 1;
      OP_REQUIRES(ctx, p[0] == 0,
                  tf::errors::InvalidArgument(Name(column),
                                              ": row_splits[0] must be 0, "
                                              "got ", p[0]));
      for (int64_t r = 0; r < rows; ++r) {
        OP_REQUIRES(ctx, p[r + 1] >= p[r],
                    tf::errors::InvalidArgument(
                        Name(column), ": row_splits must not decrease; "
                        "row_splits[", r + 1, "] = ", p[r + 1],
                        " < row_splits[", r, "] = ", p[r]));
      }
      OP_REQUIRES(ctx, p[rows] == v.dim_size(0),
                  tf::errors::InvalidArgument(
                      Name(column), ": row_splits[-1] = ", p[rows],
                      " but there are ", v.dim_size(0), " values"));
      vals[j] = v.flat<int64_t>().data();
      spl[j] = p;
      lens[j] = v.dim_size(0);
    }
    if (batch < 0) batch = 0;
    int64_t total = batch * n_;
    for (int64_t len : lens) total += len;
    OP_REQUIRES(ctx, total <= std::numeric_limits<int32_t>::max(),
                tf::errors::InvalidArgument(
                    total, " ids in one batch: at most 2^31 - 1; split the "
                    "batch"));

    std::vector<const int64_t*> ids(n_);
    for (int64_t j = 0; j < n_; ++j) ids[j] = block[j].flat<int64_t>().data();
    std::vector<int64_t> salt(n_ + m_, 0);
    for (size_t j = 0; j < salts_.size(); ++j) salt[j] = salts_[j];

    // 2. Units of work and (compact: after counting) their output offsets.
    std::vector<Unit> units;
    int64_t out = 0;
    if (n_ > 0) {
      const int64_t step = std::max<int64_t>(1, kUnitIds / n_);
      for (int64_t r = 0; r < batch; r += step) {
        const int64_t e = std::min(batch, r + step);
        units.push_back({true, 0, r, e, out});
        out += (e - r) * n_;
      }
    }
    for (int64_t j = 0; j < m_; ++j) {
      for (int64_t v = 0; v < lens[j]; v += kUnitIds) {
        const int64_t e = std::min(lens[j], v + kUnitIds);
        units.push_back({false, j, v, e, out});
        out += e - v;
      }
    }
    const int64_t num_units = static_cast<int64_t>(units.size());
    auto parallel = [&](const std::function<void(int64_t, int64_t)>& fn) {
      ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(
          num_units, kUnitIds * 6, fn);
    };
    int64_t kept = total;
    if (compact_) {
      std::vector<int64_t> counts(num_units, 0);
      parallel([&](int64_t u0, int64_t u1) {
        for (int64_t u = u0; u < u1; ++u) {
          const Unit& x = units[u];
          int64_t c = 0;
          if (x.block) {
            for (int64_t j = 0; j < n_; ++j) {
              const int64_t* p = ids[j];
              for (int64_t r = x.begin; r < x.end; ++r) c += p[r] != kPadding;
            }
          } else {
            const int64_t* p = vals[x.column];
            for (int64_t v = x.begin; v < x.end; ++v) c += p[v] != kPadding;
          }
          counts[u] = c;
        }
      });
      kept = 0;
      for (int64_t u = 0; u < num_units; ++u) {
        units[u].out = kept;
        kept += counts[u];
      }
    }

    tf::Tensor* keys_t = nullptr;
    tf::Tensor* valid_t = nullptr;
    tf::Tensor* seg_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({kept}),
                                             &keys_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            1, tf::TensorShape({compact_ ? 0 : total}),
                            &valid_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            2, tf::TensorShape({compact_ ? kept : 0}),
                            &seg_t));
    if (num_units == 0) return;
    int64_t* keys = keys_t->flat<int64_t>().data();
    bool* valid = valid_t->flat<bool>().data();
    int64_t* seg = seg_t->flat<int64_t>().data();

    // 3. Write (the loops take their inputs by value: stores through the
    // int64 outputs would otherwise reload every captured int64 each id).
    const int64_t* salt_p = salt.data();
    const int64_t* slot_p = slots_.data();
    const int64_t* const* id_p = ids.data();
    const int64_t n = n_;
    parallel([&, n, salt_p, slot_p, id_p, keys, valid, seg,
              batch](int64_t u0, int64_t u1) {
      for (int64_t u = u0; u < u1; ++u) {
        const Unit& x = units[u];
        if (x.block) {
          if (compact_) {
            WriteBlock<true>(id_p, n, salt_p, slot_p, num_slots_, x.begin,
                             x.end, x.out, keys, valid, seg);
          } else {
            WriteBlock<false>(id_p, n, salt_p, slot_p, num_slots_, x.begin,
                              x.end, x.out, keys, valid, seg);
          }
          continue;
        }
        const int64_t column = n + x.column;
        if (compact_) {
          WriteRagged<true>(vals[x.column], spl[x.column], batch,
                            salt_p[column], slot_p[column], num_slots_,
                            x.begin, x.end, x.out, keys, valid, seg);
        } else {
          WriteRagged<false>(vals[x.column], spl[x.column], batch,
                             salt_p[column], slot_p[column], num_slots_,
                             x.begin, x.end, x.out, keys, valid, seg);
        }
      }
    });
  }

 private:
  std::string Name(int64_t column) const {
    if (!names_.empty()) return "feature '" + names_[column] + "'";
    return "id column " + std::to_string(column);
  }

  int64_t n_ = 0;
  int64_t m_ = 0;
  std::vector<int64_t> salts_;
  std::vector<int64_t> slots_;
  int64_t num_slots_ = 1;
  bool compact_ = false;
  std::vector<std::string> names_;
};

REGISTER_KERNEL_BUILDER(Name("TnetFlattenKeys").Device(tf::DEVICE_CPU),
                        TnetFlattenKeysOp);

}  // namespace tnet
