#include "tnet_ops/kernels/table_resource.h"

#include <cmath>
#include <cstring>

#include "tensorflow/core/lib/core/threadpool.h"
#include "tensorflow/core/lib/strings/strcat.h"

namespace tnet {

namespace tf = ::tensorflow;

std::string TableResource::DebugString() const {
  return tf::strings::StrCat("tnet SparseTable shard(dim=", table_.dim(),
                             ", rows=", table_.Size(), ")");
}

tf::Status TableFailure(TableShard* table, const char* doing) {
  bool fatal = true;
  const std::string tier = table->TierError(&fatal);
  if (!tier.empty()) {
    return tf::errors::Unavailable(
        tier, " (while ", doing, ")",
        fatal ? "; restore the table from its checkpoint" : "");
  }
  return tf::errors::ResourceExhausted("sparse table is out of memory while ",
                                       doing);
}

tf::Status LookupTable(tf::OpKernelContext* ctx, int index,
                       int64_t expected_dim,
                       tf::core::RefCountPtr<TableResource>* out) {
  const tf::Tensor& h = ctx->input(index);
  if (h.dtype() != tf::DT_RESOURCE || h.NumElements() != 1) {
    return tf::errors::InvalidArgument(
        "table must be a scalar resource handle of a tnet SparseTable shard");
  }
  tf::Status s = tf::LookupResource(ctx, HandleFromInput(ctx, index), out);
  if (!s.ok()) {
    return tf::errors::InvalidArgument(
        "table handle does not refer to a live tnet SparseTable shard (was it "
        "destroyed, or created on another device?): ",
        s.message());
  }
  if (expected_dim >= 0 && (*out)->table()->dim() != expected_dim) {
    return tf::errors::InvalidArgument(
        "table has dim ", (*out)->table()->dim(), " but this op was built for "
        "dim ", expected_dim, ": the handle belongs to another table");
  }
  return tf::OkStatus();
}

tf::Status GetDimAttr(tf::OpKernelConstruction* ctx, int64_t* dim) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("dim", dim));
  if (*dim < 1) {
    return tf::errors::InvalidArgument("dim must be >= 1 (the table's row "
                                       "width), got ", *dim);
  }
  return tf::OkStatus();
}

ParallelRunner MakeRunner(tf::OpKernelContext* ctx) {
  tf::thread::ThreadPool* pool =
      ctx->device()->tensorflow_cpu_worker_threads()->workers;
  return [pool](int64_t n, int64_t cost,
                const std::function<void(int64_t, int64_t)>& fn) {
    pool->ParallelFor(n, cost, fn);
  };
}

tf::Status CheckFinite(const float* data, int64_t n, const char* what) {
  // A float is not finite iff its exponent bits are all ones. The scan
  // looks at 16 floats per step with GCC vector types (the plain loop over
  // std::isfinite stayed scalar at -O2: it cost a sixth of a push).
  typedef uint32_t U32x4 __attribute__((vector_size(16)));
  const U32x4 exponent = {0x7f800000u, 0x7f800000u, 0x7f800000u, 0x7f800000u};
  U32x4 acc = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    U32x4 v[4];
    std::memcpy(v, data + i, sizeof(v));
    for (int j = 0; j < 4; ++j) {
      acc |= (U32x4)((v[j] & exponent) == exponent);
    }
  }
  bool bad = (acc[0] | acc[1] | acc[2] | acc[3]) != 0;
  for (; i < n; ++i) bad |= !std::isfinite(data[i]);
  if (!bad) return tf::OkStatus();
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(data[i])) {
      return tf::errors::InvalidArgument(
          what, " must be finite; element ", i, " (flat index) is ", data[i],
          ". Nothing was applied; check the loss for overflow or clip "
          "gradients.");
    }
  }
  return tf::OkStatus();
}

}  // namespace tnet
