"""A minimal TF Serving stand-in: PredictionService.Predict over one
SavedModel, in a process that never imports tnet.

    python tests/programs/predict_server.py EXPORT_DIR MODEL_NAME PORT_FILE

Serves every signature of the SavedModel (loaded with tf.saved_model.load)
on 127.0.0.1 at a free port, written to PORT_FILE once it listens. No model
server binary can be installed here; this is what the follower's gRPC
target is tested against.
"""
import os
import sys
from concurrent import futures

import grpc
import tensorflow as tf
from tensorflow_serving.apis import (predict_pb2,
                                     prediction_service_pb2_grpc)


class Service(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, loaded, name):
        self.loaded, self.name = loaded, name

    def Predict(self, request, context):  # noqa: N802
        if request.model_spec.name != self.name:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"no model {request.model_spec.name!r}")
        sig = request.model_spec.signature_name or "serving_default"
        fn = self.loaded.signatures[sig]
        # As TF Serving: the request's inputs must be the signature's.
        want = set(fn.structured_input_signature[1])
        if set(request.inputs) != want:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "input size does not match signature: sent extra: "
                f"{sorted(set(request.inputs) - want)}, missing but required: "
                f"{sorted(want - set(request.inputs))}")
        inputs = {k: tf.constant(tf.make_ndarray(v))
                  for k, v in request.inputs.items()}
        try:
            out = fn(**inputs)
        except tf.errors.OpError as e:
            # The whole message, as TF Serving returns a failed run's
            # status (its first line may be only "Graph execution error:").
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, e.message)
        resp = predict_pb2.PredictResponse()
        for k, v in out.items():
            resp.outputs[k].CopyFrom(tf.make_tensor_proto(v.numpy()))
        return resp


def main():
    export_dir, name, port_file = sys.argv[1:4]
    loaded = tf.saved_model.load(export_dir)
    assert not any(m == "tnet" or m.startswith("tnet.") for m in sys.modules)
    opts = [("grpc.max_send_message_length", 1 << 30),
            ("grpc.max_receive_message_length", 1 << 30)]
    server = grpc.server(futures.ThreadPoolExecutor(4), options=opts)
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        Service(loaded, name), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with open(port_file + ".tmp", "w") as f:
        f.write(str(port))
    os.replace(port_file + ".tmp", port_file)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
