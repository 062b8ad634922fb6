// SparseTableSize, SparseTableMemoryBytes, SparseTableStats,
// SparseTableMarkChanges, SparseTableChanges, SparseTableEvict and the
// admission state's export/import. These take no dim attr: they work on any
// tnet table handle.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tnet_ops/kernels/table_resource.h"

namespace tnet {

namespace tf = ::tensorflow;

// SparseTableSize and SparseTableMemoryBytes: one int64 scalar the table
// reports through `Stat`.
template <int64_t (TableShard::*Stat)() const>
class SparseTableScalarOp : public tf::OpKernel {
 public:
  using tf::OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, /*expected_dim=*/-1, &res));
    tf::Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {}, &out));
    out->scalar<int64_t>()() = (res->table()->*Stat)();
  }
};

class SparseTableStatsOp : public tf::OpKernel {
 public:
  static constexpr int kNumStats = 14;
  using tf::OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, /*expected_dim=*/-1, &res));
    const TableStats t = res->table()->Stats();
    tf::Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {kNumStats}, &out));
    auto v = out->vec<int64_t>();
    v(0) = t.rows;
    v(1) = t.admitted;
    v(2) = t.rejected;
    v(3) = t.evicted;
    v(4) = t.bytes;
    v(5) = t.pending;
    v(6) = t.pending_dropped;
    v(7) = t.cap_evicted;
    v(8) = t.tier_lookups;
    v(9) = t.tier_misses;
    v(10) = t.tier_resident;
    v(11) = t.tier_on_disk;
    v(12) = t.tier_disk_bytes;
    v(13) = t.tier_writebacks;
  }
};

class SparseTableMarkChangesOp : public tf::OpKernel {
 public:
  using tf::OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, /*expected_dim=*/-1, &res));
    bool enable = false;
    OP_REQUIRES_OK(ctx, ScalarInput<bool>(ctx, 1, "enable", &enable));
    const int64_t generation = res->table()->MarkChanges(enable);
    const ChangeInfo c = res->table()->Changes(nullptr);
    tf::Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {2}, &out));
    out->vec<int64_t>()(0) = generation;
    out->vec<int64_t>()(1) = c.mark;
  }
};

class SparseTableChangesOp : public tf::OpKernel {
 public:
  using tf::OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, /*expected_dim=*/-1, &res));
    std::vector<int64_t> deleted;
    const ChangeInfo c = res->table()->Changes(&deleted);
    tf::Tensor *info, *keys;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {4}, &info));
    auto v = info->vec<int64_t>();
    v(0) = c.generation;
    v(1) = c.mark;
    v(2) = c.untracked;
    v(3) = c.dropped;
    const int64_t n = static_cast<int64_t>(deleted.size());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, {n}, &keys));
    if (n > 0) {
      std::memcpy(keys->flat<int64_t>().data(), deleted.data(), n * 8);
    }
  }
};

class SparseTableEvictOp : public tf::OpKernel {
 public:
  explicit SparseTableEvictOp(tf::OpKernelConstruction* ctx)
      : tf::OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("compact", &compact_));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, /*expected_dim=*/-1, &res));
    float decay = 0.0f, threshold = 0.0f;
    int64_t ttl = 0, step = 0;
    OP_REQUIRES_OK(ctx, ScalarInput<float>(ctx, 1, "show_decay_rate", &decay));
    OP_REQUIRES_OK(ctx, ScalarInput<float>(ctx, 2, "show_threshold", &threshold));
    OP_REQUIRES_OK(ctx, ScalarInput<int64_t>(ctx, 3, "ttl_steps", &ttl));
    OP_REQUIRES_OK(ctx, ScalarInput<int64_t>(ctx, 4, "current_step", &step));
    OP_REQUIRES(ctx, decay >= 0.0f && decay <= 1.0f,
                tf::errors::InvalidArgument(
                    "show_decay_rate must be in [0, 1], got ", decay));
    OP_REQUIRES(ctx, std::isfinite(threshold),
                tf::errors::InvalidArgument(
                    "show_threshold must be finite, got ", threshold));
    OP_REQUIRES(ctx, ttl >= 0,
                tf::errors::InvalidArgument(
                    "ttl_steps must be >= 0 (0 disables TTL), got ", ttl));
    OP_REQUIRES(ctx, step >= 0,
                tf::errors::InvalidArgument("current_step must be >= 0, got ",
                                            step));
    const EvictStats stats =
        res->table()->Evict(decay, threshold, ttl, step, compact_,
                            MakeRunner(ctx));
    OP_REQUIRES(ctx, res->table()->TierError().empty(),
                tf::errors::Unavailable(res->table()->TierError(),
                                        " while evicting rows"));
    tf::Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {}, &out));
    out->scalar<int64_t>()() = stats.evicted;
  }

 private:
  bool compact_ = true;
};

REGISTER_KERNEL_BUILDER(Name("SparseTableSize").Device(tf::DEVICE_CPU),
                        SparseTableScalarOp<&TableShard::Size>);
REGISTER_KERNEL_BUILDER(Name("SparseTableMemoryBytes").Device(tf::DEVICE_CPU),
                        SparseTableScalarOp<&TableShard::MemoryBytes>);
REGISTER_KERNEL_BUILDER(Name("SparseTableStats").Device(tf::DEVICE_CPU),
                        SparseTableStatsOp);
REGISTER_KERNEL_BUILDER(Name("SparseTableMarkChanges").Device(tf::DEVICE_CPU),
                        SparseTableMarkChangesOp);
REGISTER_KERNEL_BUILDER(Name("SparseTableChanges").Device(tf::DEVICE_CPU),
                        SparseTableChangesOp);
REGISTER_KERNEL_BUILDER(Name("SparseTableEvict").Device(tf::DEVICE_CPU),
                        SparseTableEvictOp);


// SparseTableExportPending / SparseTableImportPending: the admission state
// (pending keys, counts, ages) and the lifecycle counters, for checkpoints.
class SparseTableExportPendingOp : public tf::OpKernel {
 public:
  using tf::OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, /*expected_dim=*/-1, &res));
    std::vector<int64_t> keys, ages;
    std::vector<float> counts;
    res->table()->ExportPending(&keys, &counts, &ages);
    const int64_t n = static_cast<int64_t>(keys.size());
    tf::Tensor *k, *c, *a, *ctr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {n}, &k));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, {n}, &c));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, {n}, &a));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            3, {TableShard::kNumCounters}, &ctr));
    if (n > 0) {
      std::memcpy(k->flat<int64_t>().data(), keys.data(), n * sizeof(int64_t));
      std::memcpy(c->flat<float>().data(), counts.data(), n * sizeof(float));
      std::memcpy(a->flat<int64_t>().data(), ages.data(), n * sizeof(int64_t));
    }
    res->table()->Counters(ctr->flat<int64_t>().data());
  }
};

class SparseTableImportPendingOp : public tf::OpKernel {
 public:
  explicit SparseTableImportPendingOp(tf::OpKernelConstruction* ctx)
      : tf::OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("replace", &replace_));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, /*expected_dim=*/-1, &res));
    const tf::Tensor& keys = ctx->input(1);
    const tf::Tensor& counts = ctx->input(2);
    const tf::Tensor& ages = ctx->input(3);
    const tf::Tensor& counters = ctx->input(4);
    OP_REQUIRES(ctx,
                tf::TensorShapeUtils::IsVector(keys.shape()) &&
                    tf::TensorShapeUtils::IsVector(counts.shape()) &&
                    tf::TensorShapeUtils::IsVector(ages.shape()) &&
                    counts.dim_size(0) == keys.dim_size(0) &&
                    ages.dim_size(0) == keys.dim_size(0),
                tf::errors::InvalidArgument(
                    "keys, counts and ages must be vectors of one length, got ",
                    keys.shape().DebugString(), ", ",
                    counts.shape().DebugString(), " and ",
                    ages.shape().DebugString()));
    OP_REQUIRES(ctx,
                tf::TensorShapeUtils::IsVector(counters.shape()) &&
                    (counters.dim_size(0) == 0 ||
                     counters.dim_size(0) == TableShard::kNumCounters),
                tf::errors::InvalidArgument(
                    "counters must be empty (unchanged) or have shape [",
                    TableShard::kNumCounters, "], got ",
                    counters.shape().DebugString()));
    const int64_t n = keys.dim_size(0);
    const float* c = counts.flat<float>().data();
    const int64_t* a = ages.flat<int64_t>().data();
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, std::isfinite(c[i]) && c[i] >= 0.0f,
                  tf::errors::InvalidArgument(
                      "counts[", i, "] = ", c[i],
                      " is not a finite count >= 0"));
      OP_REQUIRES(ctx,
                  a[i] >= 0 && a[i] <= std::numeric_limits<uint32_t>::max(),
                  tf::errors::InvalidArgument("ages[", i, "] = ", a[i],
                                              " is not in [0, 2^32)"));
    }
    const int64_t* ctr = counters.flat<int64_t>().data();
    for (int64_t i = 0; i < counters.dim_size(0); ++i) {
      OP_REQUIRES(ctx, ctr[i] >= 0,
                  tf::errors::InvalidArgument("counters[", i, "] = ", ctr[i],
                                              " is negative"));
    }
    res->table()->ImportPending(keys.flat<int64_t>().data(), c, a, n,
                                replace_);
    if (counters.dim_size(0) > 0) res->table()->SetCounters(ctr);
  }

 private:
  bool replace_ = false;
};

REGISTER_KERNEL_BUILDER(
    Name("SparseTableExportPending").Device(tf::DEVICE_CPU),
    SparseTableExportPendingOp);
REGISTER_KERNEL_BUILDER(
    Name("SparseTableImportPending").Device(tf::DEVICE_CPU),
    SparseTableImportPendingOp);

}  // namespace tnet
