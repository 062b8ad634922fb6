"""Applies the deltas of an updatable export to serving replicas.

    python -m tnet.serving.follow --export_dir /models/ranker/1 \\
        --target grpc://localhost:8500/ranker --target ... [--once]

Each target is a TF Serving gRPC address (`grpc://HOST:PORT/MODEL_NAME`,
PredictionService.Predict on the export's `apply_delta`, `apply_rows` and
`serving_version` signatures) or, from Python, an in-process SavedModel
(`InProcessTarget`). Per poll and per target the follower asks the target
its `serving_version`, then applies every newer delta in order
(`tnet.serving.deltas.load_delta` checks each one's checksum and base first),
so a replica that restarted (back at version 0) or joined late is replayed
from the base. A gap or a checksum mismatch stops that target with one
line naming the delta; the target keeps serving what it had. A delta is
never applied twice: the target itself refuses any version but its
serving_version + 1. What each target applied is recorded in
`<export_dir>/deltas/followers/<target>.json` (version, base, time).

Update key: `apply_delta` and `apply_rows` refuse a request without the
export's update key (tnet.serving.update_key). The follower reads its keys
from `--update_key_file` (one a line) and the environment variable
`TNET_UPDATE_KEY` (one or more, separated by spaces or commas); given
neither, from the key file the export wrote (`/models/ranker.update_key`
beside the base path, or the `update_key_file` the export recorded) when
it can read it. Per target it sends the
key whose digest is the one recorded for the base the target serves, so a
key file holding the new and the previous key serves replicas on either
base after a rotation. An export written before update keys has none: its
signatures accept anyone's update, and the follower refuses to drive it
unless `--allow_keyless_export` is given (re-export a base to get a key).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Optional

import numpy as np

from tnet.serving import deltas, update_key
from tnet.files import write_json_atomic
from tnet.serving.deltas import DeltaError
from tnet import log as tnet_log

_log = tnet_log.get("serving.follow")

CHUNK_BYTES = 32 << 20  # rows per apply_rows request (gRPC message size)
# Seconds between polls. A poll with nothing new costs a directory listing
# and one serving_version request per target; the interval adds up to its
# length to the freshness (BENCHMARKS.md, "bench_fresh at 10M rows").
DEFAULT_INTERVAL = 1.0


class InProcessTarget:
    """A SavedModel loaded in this process (`tf.saved_model.load`).

    Args:
      loaded: the result of `tf.saved_model.load(export_dir)`.
      name: the target's name in logs and records.

    Example:
        ```python
        served = tf.saved_model.load("/models/ranker/1")
        follow.Follower("/models/ranker/1", [follow.InProcessTarget(served)]).step()
        ```
    """

    def __init__(self, loaded, name: str = "in-process"):
        self.loaded = loaded
        self.name = name

    def call(self, signature: str, inputs: Dict[str, np.ndarray]):
        import tensorflow as tf  # noqa: PLC0415
        fn = self.loaded.signatures[signature]
        out = fn(**{k: tf.constant(v) for k, v in inputs.items()})
        return {k: v.numpy() for k, v in out.items()}


class GrpcTarget:
    """A TF Serving PredictionService at `host:port`, model `model`.

    Args:
      address: "host:port" of TF Serving's gRPC port.
      model: the model name TF Serving serves the export as.
      timeout: seconds per request.

    Example:
        ```python
        target = follow.GrpcTarget("localhost:8500", "ranker")
        print(follow.serving_version(target))    # (delta number, base id)
        ```
    """

    def __init__(self, address: str, model: str, timeout: float = 60.0):
        import grpc  # noqa: PLC0415
        from tensorflow_serving.apis import (  # noqa: PLC0415
            prediction_service_pb2_grpc)
        self.name = f"grpc://{address}/{model}"
        self.model, self.timeout = model, timeout
        opts = [("grpc.max_send_message_length", 1 << 30),
                ("grpc.max_receive_message_length", 1 << 30)]
        self.channel = grpc.insecure_channel(address, options=opts)
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(
            self.channel)

    def call(self, signature: str, inputs: Dict[str, np.ndarray]):
        import tensorflow as tf  # noqa: PLC0415
        from tensorflow_serving.apis import predict_pb2  # noqa: PLC0415
        req = predict_pb2.PredictRequest()
        req.model_spec.name = self.model
        req.model_spec.signature_name = signature
        for k, v in inputs.items():
            req.inputs[k].CopyFrom(tf.make_tensor_proto(v))
        resp = self.stub.Predict(req, timeout=self.timeout)
        return {k: tf.make_ndarray(v) for k, v in resp.outputs.items()}


def parse_target(spec: str):
    """The target of a `--target` flag.

    Args:
      spec: "grpc://HOST:PORT/MODEL_NAME".

    Returns:
      A `GrpcTarget`.

    Example:
        ```python
        target = follow.parse_target("grpc://localhost:8500/ranker")
        ```
    """
    if spec.startswith("grpc://"):
        rest = spec[len("grpc://"):]
        if "/" not in rest:
            raise ValueError(f"--target {spec!r}: expected "
                             "grpc://HOST:PORT/MODEL_NAME")
        address, model = rest.split("/", 1)
        return GrpcTarget(address, model)
    raise ValueError(f"--target {spec!r}: expected grpc://HOST:PORT/MODEL")


def serving_version(target) -> (int, str):
    """What a replica serves, from its `serving_version` signature.

    Args:
      target: an `InProcessTarget` or `GrpcTarget`.

    Returns:
      (the number of the newest delta applied, 0 for none; the id of the
      base it serves).

    Example:
        ```python
        version, base = follow.serving_version(follow.InProcessTarget(served))
        ```
    """
    out = target.call(deltas.SERVING_VERSION, {})
    base = np.asarray(out["base_id"]).reshape(-1)[0]
    base = base.decode() if isinstance(base, bytes) else str(base)
    return int(np.asarray(out["version"]).reshape(-1)[0]), base


class Follower:
    """Applies the deltas of `export_dir` to `targets` (see module doc).

    Example:
        ```python
        from tnet.serving import follow
        targets = [follow.GrpcTarget("localhost:8500", "ranker")]
        follow.Follower("/models/ranker/1", targets).step()  # apply newer deltas once
        ```

    Args:
      export_dir: the updatable export (a version directory or the base path).
      targets: `InProcessTarget`s and `GrpcTarget`s.
      chunk_bytes: rows per `apply_rows` request at most.
      say: a function taking progress lines (default: the tnet logger).
      update_keys: update keys to choose from (see the module docstring).
      update_key_file: a key file to read them from.
      allow_keyless: drive an export written before update keys.
    """

    def __init__(self, export_dir: str, targets: List,
                 chunk_bytes: int = CHUNK_BYTES, say=None,
                 update_keys: Optional[List[str]] = None,
                 update_key_file: Optional[str] = None,
                 allow_keyless: bool = False):
        self.export_dir = deltas.newest_export(export_dir)
        self.info = deltas.read_info(self.export_dir)
        # The keys to pick from per base (see the module doc): given, from
        # the key file (re-read when no key matches: a rotated file or a
        # renewed Secret), from TNET_UPDATE_KEY; with none of these, from
        # the key file beside the export if this process can read it.
        self.given_keys = [update_key.check_key(k)
                           for k in (update_keys or [])]
        self.key_file = update_key_file
        if update_keys is None and update_key_file is None and not \
                os.environ.get(update_key.ENV_VAR):
            recorded = (self.info.get("update_key") or {}).get("file")
            for path in (update_key.default_key_file(export_dir), recorded):
                if path and os.access(path, os.R_OK):
                    self.key_file = path
                    break
        self.allow_keyless = allow_keyless
        self.update_keys = self._load_keys()
        self.targets = targets
        self.chunk_bytes = chunk_bytes
        self.say = say or (lambda m: _log.info(f"[tnet.follow] {m}"))
        self.state_dir = os.path.join(deltas.deltas_dir(self.export_dir),
                                      "followers")
        self.metrics = None  # a tn.monitoring.FollowerMetrics, or None

    def _load_keys(self) -> List[str]:
        return list(dict.fromkeys(self.given_keys + update_key.follower_keys(
            self.key_file)))

    def _record(self, target, version: int) -> None:
        self.state_dir = os.path.join(deltas.deltas_dir(self.export_dir),
                                      "followers")
        os.makedirs(self.state_dir, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "-_." else "_"
                       for c in target.name)
        write_json_atomic(os.path.join(self.state_dir, f"{safe}.json"),
                          {"target": target.name, "version": version,
                           "base_id": self.info["base_id"],
                           "time": time.time()})

    def recorded(self, target) -> Optional[int]:
        """The delta version last recorded as applied to `target`, or None.

        Args:
          target: a target of this follower.
        """
        self.state_dir = os.path.join(deltas.deltas_dir(self.export_dir),
                                      "followers")
        safe = "".join(c if c.isalnum() or c in "-_." else "_"
                       for c in target.name)
        try:
            with open(os.path.join(self.state_dir, f"{safe}.json")) as f:
                return int(json.load(f)["version"])
        except (OSError, ValueError, KeyError):
            return None

    def step(self) -> Dict[str, int]:
        """One poll: brings every target to the newest delta. Returns
        {target: version}; raises DeltaError (first bad target) after
        trying all."""
        out, errors = {}, []
        for target in self.targets:
            try:
                out[target.name] = self._follow(target)
            except DeltaError as e:
                errors.append(f"{target.name}: {e}")
                if self.metrics is not None:
                    self.metrics.refused(target.name)
            except Exception:
                if self.metrics is not None:
                    self.metrics.error(target.name)
                raise
            if self.metrics is not None and target.name in out:
                published = deltas.list_deltas(self.export_dir)
                self.metrics.polled(target.name, out[target.name],
                                    published[-1] if published else 0)
        if errors:
            raise DeltaError("; ".join(errors))
        return out

    def _export_of(self, base_id: str):
        """(export dir, info) of the version whose base a target serves:
        after a compaction, a replica serves the old base until TF Serving
        has loaded the new version directory."""
        if base_id == self.info["base_id"]:
            return self.export_dir, self.info
        parent = os.path.dirname(self.export_dir)
        for v in reversed(deltas.versions_of(parent)):
            path = os.path.join(parent, str(v))
            info = deltas.read_info(path, full=True).get("updatable")
            if info and info["base_id"] == base_id:
                return path, info
        raise DeltaError(f"serves base {base_id}, which no export in "
                         f"{parent} has")

    def _follow(self, target) -> int:
        # The newest base beside ours (a compaction may have written one).
        newest = deltas.newest_export(self.export_dir)
        if newest != self.export_dir:
            self.export_dir, self.info = newest, deltas.read_info(newest)
        current, base = serving_version(target)
        export_dir, info = self._export_of(base)
        return self._follow_export(target, current, export_dir, info)

    def _follow_export(self, target, current, export_dir, info) -> int:
        saved = self.export_dir, self.info
        self.export_dir, self.info = export_dir, info
        try:
            return self._apply_newer(target, current)
        finally:
            self.export_dir, self.info = saved

    def _apply_newer(self, target, current) -> int:
        recorded = self.recorded(target)
        if recorded is not None and current < recorded:
            self.say(f"{target.name} is at version {current} (recorded "
                     f"{recorded}): it restarted; replaying from "
                     f"{current + 1}")
        versions = deltas.list_deltas(self.export_dir)
        newer = [v for v in versions if v > current]
        for expected, v in enumerate(newer, start=current + 1):
            if v != expected:
                raise DeltaError(
                    f"{deltas.delta_name(expected)} is missing in "
                    f"{deltas.deltas_dir(self.export_dir)} (gap before "
                    f"{deltas.delta_name(v)}); staying at version "
                    f"{expected - 1}")
            payload = deltas.load_delta(self.export_dir, v,
                                       self.info["base_id"])
            self.apply(target, v, payload)
            self._record(target, v)
            current = v
        if recorded != current:
            self._record(target, current)
        return current

    def key_for(self, info=None) -> Optional[str]:
        """The key to send for the base `info` (default: the current
        one); None for a keyless export when allowed. DeltaError if no
        key of the follower's matches.

        Args:
          info: a base's export_info (default: the current base's).
        """
        info = self.info if info is None else info
        record = info.get("update_key")
        if record is None:
            if self.allow_keyless:
                return None
            raise DeltaError(
                f"base {info['base_id']} ({self.export_dir}) has no update "
                "key (exported before update keys): anyone who reaches the "
                "model server can change it. Export a new updatable base "
                "(it gets a key), or pass --allow_keyless_export "
                "(Follower(allow_keyless=True)) to keep updating this one")
        key = update_key.pick(record, self.update_keys)
        if key is None and self.key_file is not None:
            self.update_keys = self._load_keys()
            key = update_key.pick(record, self.update_keys)
        if key is None:
            raise DeltaError(
                f"no update key of the follower's ({len(self.update_keys)} "
                f"given) matches base {info['base_id']} ({self.export_dir}): "
                "pass --update_key_file or TNET_UPDATE_KEY with the key the "
                "export wrote (default "
                f"{update_key.default_key_file(self.export_dir)})")
        return key

    def apply(self, target, version: int, payload) -> None:
        """Applies one delta to `target`: its rows in `apply_rows` requests of at most `chunk_bytes`, then `apply_delta`.

        Args:
          target: the target.
          version: the delta's number (the target must be at `version - 1`).
          payload: the delta's arrays (`tnet.serving.deltas.load_delta`).
        """
        start = time.perf_counter()
        self._apply(target, version, payload)
        if self.metrics is not None:
            self.metrics.applied(target.name, version,
                                 time.perf_counter() - start)
        self.say(f"{target.name}: applied {deltas.delta_name(version)}")

    def _apply(self, target, version: int, payload) -> None:
        tables = self.info["tables"]
        version_arr = np.array(version, np.int64)
        key = self.key_for()
        total = sum(payload[f"{e['prefix']}_rows"].nbytes
                    for e in tables.values())
        pieces = max(1, -(-total // self.chunk_bytes))
        for i in range(pieces):
            inputs = {"version": version_arr}
            if key is not None:
                inputs[update_key.KEY_INPUT] = np.array(key.encode(),
                                                        dtype=object)
            for e in tables.values():
                p = e["prefix"]
                for part in ("keys", "rows", "deleted"):
                    arr = payload[f"{p}_{part}"]
                    inputs[f"{p}_{part}"] = np.array_split(arr, pieces)[i]
            if i + 1 < pieces:
                target.call(deltas.APPLY_ROWS, inputs)
            else:
                for j in range(len(self.info["dense"])):
                    inputs[f"dense_{j}"] = payload[f"dense_{j}"]
                target.call(deltas.APPLY_DELTA, inputs)


def main(argv=None) -> int:
    """`python -m tnet.serving.follow`: applies new deltas to every `--target`, once (`--once`) or every `--interval` seconds.

    Args:
      argv: the command line (default: sys.argv[1:]).

    Returns:
      The exit status: 0, 1 after a target's DeltaError, 2 for bad flags.

    Example:
        ```python
        from tnet.serving import follow
        follow.main(["--export_dir", "/models/ranker/1", "--once",
                     "--target", "grpc://localhost:8500/ranker"])
        ```
    """
    parser = argparse.ArgumentParser(
        prog="python -m tnet.serving.follow",
        description="Apply an updatable export's deltas to serving replicas")
    parser.add_argument("--export_dir", required=True)
    parser.add_argument("--target", action="append", required=True,
                        help="grpc://HOST:PORT/MODEL_NAME (repeatable)")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL,
                        help="seconds between polls (adds up to this much "
                             "to the freshness)")
    parser.add_argument("--once", action="store_true",
                        help="apply what is there and exit")
    parser.add_argument("--update_key_file", default=None,
                        help="file of the export's update key(s), one a "
                             "line (also: env TNET_UPDATE_KEY; default: the "
                             "key file beside the export's base path)")
    parser.add_argument("--allow_keyless_export", action="store_true",
                        help="also update exports written before update "
                             "keys (anyone can change those)")
    parser.add_argument("--metrics_port", type=int, default=-1,
                        help="serve Prometheus metrics on this port (0: "
                             "any free port, logged; -1: off)")
    parser.add_argument("--metrics_addr", default="0.0.0.0",
                        help="the address the metrics endpoint listens on")
    tnet_log.add_verbosity_flag(parser)
    args = parser.parse_args(argv)
    tnet_log.set_verbosity(args.verbosity)
    try:
        follower = Follower(args.export_dir,
                            [parse_target(t) for t in args.target],
                            update_key_file=args.update_key_file,
                            allow_keyless=args.allow_keyless_export)
        follower.key_for()  # a missing or wrong key: one line, exit 2
        if args.metrics_port >= 0:
            from tnet.monitoring import FollowerMetrics  # noqa: PLC0415
            follower.metrics = FollowerMetrics()
            port = follower.metrics.serve(args.metrics_port,
                                          addr=args.metrics_addr)
            _log.info(f"tnet.serving.follow: metrics on "
                      f"http://{args.metrics_addr}:{port}/metrics")
    except (DeltaError, ValueError, OSError) as e:
        _log.error(f"tnet.serving.follow: {e}")
        return 2
    while True:
        try:
            follower.step()
        except DeltaError as e:
            _log.error(f"tnet.serving.follow: {e}")
            if args.once:
                return 1
        except Exception as e:  # noqa: BLE001  (a replica down: retry)
            line = (str(e).strip().splitlines() or [repr(e)])[0][:300]
            _log.error(f"tnet.serving.follow: {type(e).__name__}: {line}")
            if args.once:
                return 1
        if args.once:
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
