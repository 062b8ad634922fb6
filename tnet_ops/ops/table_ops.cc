// Op registrations for the sparse table: signatures and shape functions only.
// Kernels live in kernels/, storage in table/.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tnet_ops/optimizers/rules.h"

namespace tnet {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

Status ScalarInput(InferenceContext* c, int i) {
  ShapeHandle unused;
  return c->WithRank(c->input(i), 0, &unused);
}

// The `dim` attr, validated as the table kernel does. A shape function must
// return an error, never build a shape from a negative value: InferenceContext
// CHECK-fails (aborting the process) on negative dimensions.
constexpr int64_t kMaxDim = 65536;

Status DimAttr(InferenceContext* c, int64_t* dim) {
  TF_RETURN_IF_ERROR(c->GetAttr("dim", dim));
  if (*dim < 1 || *dim > kMaxDim) {
    return ::tensorflow::errors::InvalidArgument(
        "dim must be in [1, ", kMaxDim, "], got ", *dim);
  }
  return ::tensorflow::OkStatus();
}

// A [N, dim] input: rank 2, and its second dimension `dim` when known.
Status RowsInput(InferenceContext* c, int i, int64_t dim, ShapeHandle* out) {
  TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 2, out));
  DimensionHandle unused;
  return c->WithValue(c->Dim(*out, 1), dim, &unused);
}

// SparseTablePull(V2) and SparseTablePush(V2): the V2 ops add one scalar
// input, batch_size, after the V1 inputs.
Status PullShape(InferenceContext* c) {
  ShapeHandle keys;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
  TF_RETURN_IF_ERROR(ScalarInput(c, 2));
  if (c->num_inputs() > 3) TF_RETURN_IF_ERROR(ScalarInput(c, 3));
  int64_t dim;
  TF_RETURN_IF_ERROR(DimAttr(c, &dim));
  c->set_output(0, c->Matrix(c->Dim(keys, 0), dim));
  return ::tensorflow::OkStatus();
}

Status PushShape(InferenceContext* c) {
  int64_t dim;
  TF_RETURN_IF_ERROR(DimAttr(c, &dim));
  ShapeHandle keys, grads;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
  TF_RETURN_IF_ERROR(RowsInput(c, 2, dim, &grads));
  DimensionHandle unused;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(keys, 0), c->Dim(grads, 0), &unused));
  TF_RETURN_IF_ERROR(ScalarInput(c, 3));
  TF_RETURN_IF_ERROR(ScalarInput(c, 4));
  ShapeHandle v;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(5), 1, &v));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(6), 1, &v));
  if (c->num_inputs() > 7) TF_RETURN_IF_ERROR(ScalarInput(c, 7));
  return ::tensorflow::OkStatus();
}

// `.Attr("epsilon: float = 1e-7")` for each hyperparameter of rules.h.
#define TNET_HPARAM_ATTR(name, value, range) .Attr(#name ": float = " #value)

}  // namespace

REGISTER_OP("SparseTableHandle")
    .Output("table: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("dim: int")
    .Attr("optimizer: string")
    // One float attr per hyperparameter of rules.h, with its default.
    TNET_SPARSE_HPARAMS(TNET_HPARAM_ATTR)
    .Attr("initializer: string = 'truncated_normal'")
    .Attr("initializer_params: list(float) = [0.0, 0.05]")
    .Attr("seed: int = 0")
    .Attr("num_stripes: int = 64")
    .Attr("min_count: float = 1.0")
    .Attr("admission_capacity: int = 1048576")
    .Attr("max_rows: int = 0")
    .Attr("memory_budget_bytes: int = 0")
    .Attr("storage_dir: string = ''")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      int64_t dim;
      TF_RETURN_IF_ERROR(DimAttr(c, &dim));
      c->set_output(0, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Creates (or finds, by container/shared_name) one shard of a sparse embedding
table and returns its handle. The optimizer and its hyperparameters (Keras
names, one float attr each: TNET_SPARSE_HPARAMS in
tnet_ops/optimizers/rules.h) are fixed at creation because the row layout
depends on them; every attr is range-checked whichever rule reads it.
optimizer: a rule of tnet_ops/optimizers/rules.h (sgd, adagrad, ...).
initializer: zeros | constant [value] | uniform [minval, maxval] |
  normal [mean, stddev] | truncated_normal [mean, stddev]; seeded by key.
min_count: shows a key needs (summed over pushes) before it gets a row;
  <= 1 admits every key at once. Not-admitted keys read zeros and get no
  update.
admission_capacity: keys whose counts the shard keeps while they wait for
  admission (split over stripes; a full stripe drops its lower-count half).
max_rows: rows this shard may hold (0: unbounded); beyond it the lowest-show
  rows are freed. Must be 0 or >= num_stripes.
memory_budget_bytes: > 0 gives the shard a disk tier: at most this many bytes
  of rows (weights, slots, meta) stay in memory between operations, the rest
  live in an unlinked file in storage_dir (row_tier.h). 0: all in memory.
storage_dir: a writable local directory; required with memory_budget_bytes.
)doc");

REGISTER_OP("SparseTablePull")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("training: bool")
    .Output("values: float")
    .Attr("dim: int")
    .SetIsStateful()
    .SetShapeFn(PullShape)
    .Doc(R"doc(
Reads the rows of `keys`. training=true inserts missing keys (weights from
the key-seeded initializer); training=false inserts nothing and returns zeros
for missing keys.
)doc");

REGISTER_OP("SparseTablePush")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("grads: float")
    .Input("learning_rate: float")
    .Input("step: int64")
    .Input("shows: float")
    .Input("clicks: float")
    .Attr("dim: int")
    .Attr("unique_keys: bool = false")
    .SetIsStateful()
    .SetShapeFn(PushShape)
    .Doc(R"doc(
Applies the table's optimizer to the rows of `keys` with `grads` [N, dim].
Duplicate keys are summed first (unique_keys = true: the caller promises
the keys are distinct and the summing pass is skipped; a repeated key then
gets each of its updates in turn). shows / clicks are per-key counts ([N]) or
empty (each key then counts one show, no click). `step` is recorded in each
row as its last update step (for TTL eviction).
)doc");

REGISTER_OP("SparseTablePullV2")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("training: bool")
    .Input("batch_size: int64")
    .Output("values: float")
    .Attr("dim: int")
    .SetIsStateful()
    .SetShapeFn(PullShape)
    .Doc(R"doc(
SparseTablePull with `batch_size`: the examples in the batch the keys come
from (0: unknown). A row this pull inserts starts its accumulator at
initial_accumulator_value * (start_reference_batch / batch_size)^2 when the
table's start_reference_batch is > 0 and batch_size > 0 (rules.h,
StartScale); otherwise at initial_accumulator_value.
)doc");

REGISTER_OP("SparseTablePushV2")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("grads: float")
    .Input("learning_rate: float")
    .Input("step: int64")
    .Input("shows: float")
    .Input("clicks: float")
    .Input("batch_size: int64")
    .Attr("dim: int")
    .Attr("unique_keys: bool = false")
    .SetIsStateful()
    .SetShapeFn(PushShape)
    .Doc(R"doc(
SparseTablePush with `batch_size`, as SparseTablePullV2: the rows it inserts
start their accumulator scaled for that batch.
)doc");

REGISTER_OP("SparseTableSize")
    .Input("table: resource")
    .Output("size: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

REGISTER_OP("SparseTableMemoryBytes")
    .Input("table: resource")
    .Output("bytes: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

REGISTER_OP("SparseTableStats")
    .Input("table: resource")
    .Output("stats: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      c->set_output(0, c->Vector(14));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Lifecycle counters of one shard: [rows, admitted, rejected, evicted, bytes,
pending, pending_dropped, cap_evicted, tier_lookups, tier_misses,
tier_resident, tier_on_disk, tier_disk_bytes, tier_writebacks], as in
the C++ table's Stats(); the tier's are 0 without a disk tier.
)doc");

REGISTER_OP("SparseTableExportPending")
    .Input("table: resource")
    .Output("keys: int64")
    .Output("counts: float")
    .Output("ages: int64")
    .Output("counters: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      auto n = c->UnknownDim();
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Vector(n));
      c->set_output(2, c->Vector(n));
      c->set_output(3, c->Vector(5));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
One shard's admission state: every key waiting for admission with its show
count and age (ticks since its count changed), and the lifecycle counters
[admitted, rejected, evicted, pending_dropped, cap_evicted].
)doc");

REGISTER_OP("SparseTableImportPending")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("counts: float")
    .Input("ages: int64")
    .Input("counters: int64")
    .Attr("replace: bool = true")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      for (int i = 1; i <= 4; ++i) {
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &unused));
      }
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Restores admission state (SparseTableExportPending's outputs): replace
empties the shard's pending maps first; keys that have a row are skipped.
counters: [5] sets the lifecycle counters, empty leaves them.
)doc");

// SparseTableExport and SparseTableExportSince: one signature after their
// scalar inputs (cursor, max_rows[, since_step]), one shape function.
#define TNET_EXPORT_OUTPUTS                \
  Output("keys: int64")                    \
      .Output("weights: float")            \
      .Output("slots: float")              \
      .Output("meta: double")              \
      .Output("next_cursor: int64")        \
      .Attr("dim: int")                    \
      .Attr("weights_only: bool = false")  \
      .SetIsStateful()                     \
      .SetShapeFn(ExportShape)

namespace {

Status ExportShape(InferenceContext* c) {
  for (int i = 1; i < c->num_inputs(); ++i) {
    TF_RETURN_IF_ERROR(ScalarInput(c, i));
  }
  int64_t dim;
  TF_RETURN_IF_ERROR(DimAttr(c, &dim));
  DimensionHandle n = c->UnknownDim();
  c->set_output(0, c->Vector(n));
  c->set_output(1, c->Matrix(n, dim));
  bool weights_only = false;
  TF_RETURN_IF_ERROR(c->GetAttr("weights_only", &weights_only));
  c->set_output(2, c->Matrix(n, weights_only ? c->MakeDim(0)
                                             : c->UnknownDim()));
  c->set_output(3, c->Matrix(n, weights_only ? 0 : 3));
  c->set_output(4, c->Scalar());
  return ::tensorflow::OkStatus();
}

}  // namespace

REGISTER_OP("SparseTableExport")
    .Input("table: resource")
    .Input("cursor: int64")
    .Input("max_rows: int64")
    .TNET_EXPORT_OUTPUTS
    .Doc(R"doc(
Copies up to max_rows live rows from `cursor` (0 starts, -1 means done).
meta columns: show, click, last_step. next_cursor is -1 when the table has
no more rows. Rows never move, so a row live for a whole multi-call export is
returned exactly once. weights_only: slots and meta come back with no
columns ([n, 0]), for readers that drop them (the serving export, deltas):
under ParameterServerStrategy they then never leave the ps.
)doc");

REGISTER_OP("SparseTableExportSince")
    .Input("table: resource")
    .Input("cursor: int64")
    .Input("max_rows: int64")
    .Input("since_step: int64")
    .TNET_EXPORT_OUTPUTS
    .Doc(R"doc(
SparseTableExport restricted to rows whose last_step > since_step (-1: every
row). Skipped rows do not count against max_rows, so one call can scan a
whole shard and return only what changed since a checkpoint's mark.
)doc");

#undef TNET_EXPORT_OUTPUTS

REGISTER_OP("SparseTableMarkChanges")
    .Input("table: resource")
    .Input("enable: bool")
    .Output("mark: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(ScalarInput(c, 1));
      c->set_output(0, c->Vector(2));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Starts (enable) or stops change tracking: empties the deletion log and the
untracked counter and sets the mark to the largest last_step written so far.
Returns [generation, mark] (mark -1: not tracking), as the table's
MarkChanges describes.
)doc");

REGISTER_OP("SparseTableChanges")
    .Input("table: resource")
    .Output("info: int64")
    .Output("deleted: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      c->set_output(0, c->Vector(4));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Changes since the last SparseTableMarkChanges: info = [generation, mark,
untracked, dropped] and the keys freed since (the deletion log).
)doc");

REGISTER_OP("SparseTableImport")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("weights: float")
    .Input("slots: float")
    .Input("meta: double")
    .Attr("dim: int")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      int64_t dim;
      TF_RETURN_IF_ERROR(DimAttr(c, &dim));
      ShapeHandle keys, m;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
      DimensionHandle n = c->Dim(keys, 0);
      TF_RETURN_IF_ERROR(RowsInput(c, 2, dim, &m));
      TF_RETURN_IF_ERROR(c->Merge(n, c->Dim(m, 0), &n));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 2, &m));
      TF_RETURN_IF_ERROR(c->Merge(n, c->Dim(m, 0), &n));
      TF_RETURN_IF_ERROR(RowsInput(c, 4, 3, &m));
      TF_RETURN_IF_ERROR(c->Merge(n, c->Dim(m, 0), &n));
      return ::tensorflow::OkStatus();
    })
    .Doc("Inserts or overwrites rows exactly as given (weights, slots, meta).");

REGISTER_OP("SparseTableEvict")
    .Input("table: resource")
    .Input("show_decay_rate: float")
    .Input("show_threshold: float")
    .Input("ttl_steps: int64")
    .Input("current_step: int64")
    .Output("evicted: int64")
    .Attr("compact: bool = true")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      for (int i = 1; i <= 4; ++i) TF_RETURN_IF_ERROR(ScalarInput(c, i));
      c->set_output(0, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
show *= show_decay_rate on every row, then frees the rows whose show is below
show_threshold, and (ttl_steps > 0) the rows whose last update step is more
than ttl_steps before current_step. Freed memory is reused or released.
compact: move surviving rows into the holes so whole arena chunks are
  released. It moves rows: an export cursor spanning a compacting eviction
  may miss moved rows (never repeats one). Use compact=false while exports
  run concurrently.
)doc");

REGISTER_OP("TnetSparseRuleSlots")
    .Output("num_slots: int32")
    .Attr("optimizer: string")
    .Attr("dim: int")
    .SetShapeFn([](InferenceContext* c) {
      int64_t dim = 0;
      TF_RETURN_IF_ERROR(DimAttr(c, &dim));
      c->set_output(0, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The number of optimizer slots a table row holds for rule `optimizer` at
width `dim` (tnet/optimizer/sparse.py reads it instead of mirroring C++).
)doc");

REGISTER_OP("TnetSparseRules")
    .Output("rules: string")
    .Output("rule_hparams: string")
    .Output("hparams: string")
    .Output("hparam_defaults: string")
    .Attr("optimizer: string = ''")
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < 4; ++i) c->set_output(i, c->Vector(c->UnknownDim()));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The registration table of tnet_ops/optimizers/rules.h, for
tnet/optimizer/sparse.py: each rule's name and its hyperparameters
(space-separated, in its Python class's argument order), and every
hyperparameter's name and default (the literal written there).
optimizer: '' for every rule, or the one rule to describe.
)doc");

REGISTER_OP("TnetSumRows")
    .Input("values: float")
    .Input("indices: int32")
    .Input("num_rows: int64")
    .Output("sums: float")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle values, indices;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &values));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &indices));
      TF_RETURN_IF_ERROR(ScalarInput(c, 2));
      DimensionHandle unused;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(values, 0), c->Dim(indices, 0),
                                  &unused));
      c->set_output(0, c->Matrix(c->UnknownDim(), c->Dim(values, 1)));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
sums[n] = sum of values[i] over the i with indices[i] == n, for n in
[0, num_rows): the per-key gradient of an embedding gather (what
unsorted_segment_sum computes, without its per-row overhead).
)doc");

REGISTER_OP("TnetUnique")
    .Input("keys: int64")
    .Input("valid: bool")
    .Output("unique: int64")
    .Output("idx: int32")
    .Output("counts: float")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle keys, valid;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &valid));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, keys);
      c->set_output(2, c->Vector(c->UnknownDim()));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
tf.unique(keys) and each unique key's count in one parallel pass: unique
keys in order of first occurrence (exactly tf.unique's order), idx[i] the
position of keys[i] in `unique`. valid: [N] (false: padding, idx -1, not
counted) or empty (every key valid).
)doc");

REGISTER_OP("TnetEmbedCombine")
    .Input("rows: float")
    .Input("idx: int32")
    .Input("widths: int32")
    .Input("combiners: int32")
    .Output("out: float")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle rows, idx, v;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &rows));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &idx));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &v));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &v));
      DimensionHandle width;
      TF_RETURN_IF_ERROR(c->Multiply(c->Dim(v, 0), c->Dim(rows, 1), &width));
      c->set_output(0, c->Matrix(c->Dim(idx, 0), width));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Per example b and column c: combiners[c] (0 sum, 1 mean, 2 sqrtn) of the
rows[idx[b, j]] over column c's span of idx (widths[c] entries, columns
side by side), idx -1 = padding (an all-padding span gives zeros). Output
[B, C * dim]: column c at [:, c * dim : (c + 1) * dim].
)doc");

REGISTER_OP("TnetEmbedCombineGrad")
    .Input("grad: float")
    .Input("idx: int32")
    .Input("widths: int32")
    .Input("combiners: int32")
    .Input("num_rows: int64")
    .Output("rows_grad: float")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle grad, idx, v;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &grad));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &idx));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &v));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &v));
      TF_RETURN_IF_ERROR(ScalarInput(c, 4));
      c->set_output(0, c->Matrix(c->UnknownDim(), c->UnknownDim()));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The gradient of TnetEmbedCombine with respect to rows: [num_rows, dim],
each row the sum of the gradients of every id that read it.
)doc");

REGISTER_OP("TnetSegmentCombine")
    .Input("rows: float")
    .Input("idx: int32")
    .Input("segments: int64")
    .Input("num_segments: int64")
    .Input("combiners: int32")
    .Output("out: float")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle rows, v;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &rows));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &v));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &v));
      TF_RETURN_IF_ERROR(ScalarInput(c, 3));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &v));
      c->set_output(0, c->Matrix(c->UnknownDim(), c->Dim(rows, 1)));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
out[s] = combiners[s % C] (0 sum, 1 mean, 2 sqrtn) of rows[idx[k]] over the
entries k with segments[k] == s (any order; idx -1 skipped); [num_segments,
dim]. With segments = example * C + column, out reshapes to [B, C * dim].
)doc");

REGISTER_OP("TnetRowIds")
    .Input("row_splits: Tsplits")
    .Output("row_ids: int64")
    .Attr("Tsplits: {int32, int64} = DT_INT64")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle v;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &v));
      c->set_output(0, c->Vector(c->UnknownDim()));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The row of every value of a ragged tensor with these row_splits (what
RaggedTensor.value_rowids() returns, as int64): row_ids[k] = r for
row_splits[r] <= k < row_splits[r + 1]. row_splits must start at 0 and
never decrease; the output has row_splits[-1] entries.
)doc");

REGISTER_OP("TnetCompactIds")
    .Input("ids: T")
    .Output("values: T")
    .Output("row_ids: int64")
    .Attr("T: {int32, int64, string}")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle v;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &v));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The ids of a [B, L] tensor padded with -1 (or "") without the padding, in
row-major order, and the row of each: what a RaggedTensor built by
tf.ragged.boolean_mask(ids, ids != padding) holds as flat_values and
value_rowids(), in one pass.
)doc");

REGISTER_OP("TnetFlattenKeys")
    .Input("block: N * int64")
    .Input("values: M * int64")
    .Input("splits: M * int64")
    .Output("keys: int64")
    .Output("valid: bool")
    .Output("segments: int64")
    .Attr("N: int >= 0")
    .Attr("M: int >= 0")
    .Attr("salts: list(int) = []")
    .Attr("slots: list(int)")
    .Attr("num_slots: int >= 1")
    .Attr("compact: bool")
    .Attr("names: list(string) = []")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle v;
      int64_t n = 0, m = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      TF_RETURN_IF_ERROR(c->GetAttr("M", &m));
      for (int64_t i = n; i < n + 2 * m; ++i) {
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &v));
      }
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      c->set_output(2, c->Vector(c->UnknownDim()));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The table keys of several int64 id columns of one batch in one pass, in the
order the columns' own ops would concatenate them: first the N `block`
columns (each B ids: [B] or [B, 1]) row-major as one [B, N] block, then
each of the M ragged columns' values (row_splits `splits[j]`, B + 1 of
them). A key is the id XOR its column's salt (`salts`: empty, or one per
column, block columns first). -1 is padding.
compact = false: keys and valid (false at padding) for every id; segments
is empty. compact = true: the ids that are not padding only, with
segments[k] = example * num_slots + slots[column]; valid is empty.
`names` (one per column, optional) name the columns in error messages.
)doc");

REGISTER_OP("TnetShardOrder")
    .Input("keys: int64")
    .Input("idx: int32")
    .Input("counts: float")
    .Output("grouped_keys: int64")
    .Output("grouped_idx: int32")
    .Output("grouped_counts: float")
    .Output("sizes: int64")
    .Attr("num_shards: int >= 1")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle keys, idx, counts;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &idx));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &counts));
      int64_t n = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("num_shards", &n));
      c->set_output(0, keys);
      c->set_output(1, idx);
      c->set_output(2, counts);
      c->set_output(3, c->Vector(n));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
A dedup's result (unique keys, each id's index into them, each key's count)
with the keys grouped by shard: the keys of shard 0 (key mod num_shards,
as tf.math.floormod) first, then shard 1's, ..., each group in its input
order; idx is renumbered to match (-1 stays -1) and sizes[s] is shard s's
count, so each shard's keys are one contiguous slice.
)doc");

REGISTER_OP("TnetSegmentCombineGrad")
    .Input("grad: float")
    .Input("idx: int32")
    .Input("segments: int64")
    .Input("num_segments: int64")
    .Input("combiners: int32")
    .Input("num_rows: int64")
    .Output("rows_grad: float")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle grad, v;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &grad));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &v));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &v));
      TF_RETURN_IF_ERROR(ScalarInput(c, 3));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &v));
      TF_RETURN_IF_ERROR(ScalarInput(c, 5));
      c->set_output(0, c->Matrix(c->UnknownDim(), c->Dim(grad, 1)));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The gradient of TnetSegmentCombine with respect to rows: [num_rows, dim].
)doc");

}  // namespace tnet
