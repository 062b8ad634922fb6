// Op registrations for the data readers' kernels (kernels/text_kernels.cc).
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tnet {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("TnetDecodeIdLists")
    .Input("text: string")
    .Attr("separator: string")
    .Output("values: int64")
    .Output("row_splits: int64")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle text;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &text));
      std::string sep;
      TF_RETURN_IF_ERROR(c->GetAttr("separator", &sep));
      if (sep.size() != 1) {
        return ::tensorflow::errors::InvalidArgument(
            "separator must be one character, got \"", sep, "\"");
      }
      c->set_output(0, c->Vector(c->UnknownDim()));
      ::tensorflow::shape_inference::DimensionHandle rows;
      TF_RETURN_IF_ERROR(c->Add(c->Dim(text, 0), 1, &rows));
      c->set_output(1, c->Vector(rows));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Multi-valued CSV/TSV cells ("12|7|9") to a ragged int64 tensor: values and
row_splits [rows + 1]. Empty parts are dropped; each part parses as
tf.strings.to_number(int64) parses it. Equal to tf.strings.split(text,
separator), dropping empty parts, then tf.strings.to_number(.., int64).
)doc");

REGISTER_OP("TnetDecodeRows")
    .Input("lines: string")
    .Attr("delimiter: string")
    .Attr("kinds: list(int)")
    .Attr("separators: list(string)")
    .Attr("pads: list(int)")
    .Attr("num_floats: int >= 0")
    .Attr("num_ints: int >= 0")
    .Attr("num_strings: int >= 0")
    .Attr("num_lists: int >= 0")
    .Output("ok: bool")
    .Output("floats: num_floats * double")
    .Output("ints: num_ints * int64")
    .Output("strings: num_strings * string")
    .Output("list_values: num_lists * int64")
    .Output("list_splits: num_lists * int64")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle lines;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &lines));
      int counts[4];
      TF_RETURN_IF_ERROR(c->GetAttr("num_floats", &counts[0]));
      TF_RETURN_IF_ERROR(c->GetAttr("num_ints", &counts[1]));
      TF_RETURN_IF_ERROR(c->GetAttr("num_strings", &counts[2]));
      TF_RETURN_IF_ERROR(c->GetAttr("num_lists", &counts[3]));
      ::tensorflow::shape_inference::DimensionHandle plus_one;
      TF_RETURN_IF_ERROR(c->Add(c->Dim(lines, 0), 1, &plus_one));
      int out = 0;
      c->set_output(out++, lines);
      for (int i = 0; i < counts[0] + counts[1] + counts[2]; ++i) {
        c->set_output(out++, lines);
      }
      for (int i = 0; i < counts[3]; ++i) {
        c->set_output(out++, c->Vector(c->UnknownDim()));
      }
      for (int i = 0; i < counts[3]; ++i) c->set_output(out++, c->Vector(plus_one));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The lines of a CSV/TSV batch to their columns, with the reader's row check.
kinds: one per file column (tnet/data/readers.py _ROW_KINDS). ok[i]: line i
matches the row pattern the kinds stand for (the fields' RE2 patterns joined
by the delimiter), exactly as RE2 full-matches it. floats (label, dense,
weight columns, parsed as tf.strings.to_number(float64)), ints (single int
ids), strings (string cells, as they are) and id lists (values, row_splits)
follow the columns' order within each list; empty numbers and ids take
pads[c] (an int64, or a float64's bits). The values of a line that fails
the check are unspecified (no id list is longer than its cell's parts).
)doc");

REGISTER_OP("TnetSplitLines")
    .Input("carry: string")
    .Input("block: string")
    .Input("last: bool")
    .Output("lines: string")
    .Output("rest: string")
    .SetShapeFn([](InferenceContext* c) -> Status {
      for (int i = 0; i < 3; ++i) {
        ShapeHandle unused;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
      }
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The complete lines of carry + block (split on LF, one trailing CR dropped
from each) and the rest: the partial line after the last LF, carried to the
next block. last: this is the file's last block, so a non-empty partial
line is a line too and the rest is empty.
)doc");

}  // namespace tnet
