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

}  // namespace tnet
