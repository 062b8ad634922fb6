// The TF resource that owns one TableShard, and helpers shared by the
// kernels (handle lookup, dim checks, thread-pool runner, finiteness checks).
#ifndef TNET_OPS_KERNELS_TABLE_RESOURCE_H_
#define TNET_OPS_KERNELS_TABLE_RESOURCE_H_

#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tnet_ops/table/table_shard.h"

namespace tnet {

class TableResource : public ::tensorflow::ResourceBase {
 public:
  explicit TableResource(const TableConfig& config) : table_(config) {}
  std::string DebugString() const override;
  int64_t MemoryUsed() const override { return table_.MemoryBytes(); }
  TableShard* table() { return &table_; }

 private:
  TableShard table_;
};

// Looks up the table behind input `index` and checks that its dim equals the
// op's `dim` attr (a handle of another table is an InvalidArgument);
// expected_dim < 0 accepts any dim.
::tensorflow::Status LookupTable(::tensorflow::OpKernelContext* ctx, int index,
                                 int64_t expected_dim,
                                 ::tensorflow::core::RefCountPtr<TableResource>* out);

// The op's `dim` attr, which must be >= 1: a negative one would otherwise
// pass LookupTable as "any dim" and reach TensorShape, which aborts the
// process on negative sizes.
::tensorflow::Status GetDimAttr(::tensorflow::OpKernelConstruction* ctx,
                                int64_t* dim);

// The error of a table operation that returned false: the disk tier's
// failure if it failed, else ResourceExhausted("... out of memory while
// <doing>").
::tensorflow::Status TableFailure(TableShard* table, const char* doing);

// Runs work on the op's CPU worker pool.
ParallelRunner MakeRunner(::tensorflow::OpKernelContext* ctx);

// InvalidArgument naming `what` and the first non-finite position, or OK.
::tensorflow::Status CheckFinite(const float* data, int64_t n,
                                 const char* what);

// A scalar input of type T, or InvalidArgument naming it.
template <typename T>
::tensorflow::Status ScalarInput(::tensorflow::OpKernelContext* ctx, int index,
                                 const char* name, T* value) {
  const ::tensorflow::Tensor& t = ctx->input(index);
  if (!::tensorflow::TensorShapeUtils::IsScalar(t.shape())) {
    return ::tensorflow::errors::InvalidArgument(
        name, " must be a scalar, got shape ", t.shape().DebugString());
  }
  *value = t.scalar<T>()();
  return ::tensorflow::OkStatus();
}

}  // namespace tnet

#endif  // TNET_OPS_KERNELS_TABLE_RESOURCE_H_
