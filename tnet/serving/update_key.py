"""The update key of an updatable export: who may change a served model.

`apply_delta` and `apply_rows` take an `update_key` input (a scalar
string). The export stores only a random salt and

    digest = SHA-256(DOMAIN || salt || key)

and the signatures compute the same SHA-256 from the key a request sends,
with stock TensorFlow ops (`sha256`: 32-bit words held in int64, stock
bitwise ops and additions masked to 32 bits, one `tf.while_loop` over the
64-byte blocks and one over the 64 rounds), then compare the 8 words of
the two digests as `sum(a XOR b) == 0`: no early exit, so the time does not
depend on where a wrong digest differs. Every mutation of a signature runs
under a control dependency on that check (`refuse_unless`): a refused
request assigns nothing.

Why a digest and not the key: whoever reads the SavedModel (or
`export_info.json`) learns the salt and the digest; sending a request that
passes needs a string with that digest, a SHA-256 preimage. The generated
key is 32 random bytes (64 hex characters): a search of 2^256 keys.

The key itself lives only on the trainer's side, in a key file beside the
export's base path (`default_key_file`: `/models/ranker.update_key` for
`/models/ranker/1`; owner-only, 0600), and with the follower
(`--update_key_file`, `TNET_UPDATE_KEY`). A key file holds one key a line,
newest first: after a rotation the previous key stays on the second line,
so a follower given the file still updates replicas serving the previous
base. The follower picks, per base, the key whose digest matches.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from typing import Iterable, List, Optional

import numpy as np
import tensorflow as tf

KEY_INPUT = "update_key"
ENV_VAR = "TNET_UPDATE_KEY"
KEY_SUFFIX = ".update_key"
DOMAIN = b"tnet-update-key-v1\x00"
SALT_BYTES = 16
MIN_KEY_CHARS = 32   # 128 bits as hex; generated keys have 64 (256 bits)
MAX_KEY_BYTES = 1024  # longer keys are refused without hashing the rest
KEEP_KEYS = 2        # a key file keeps the newest key and the one before

_M32 = 0xFFFFFFFF
_H0 = np.array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19], np.int64)
_K = np.array([
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
    0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
    0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
    0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
    0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2], np.int64)


class UpdateKeyError(ValueError):
    """A key that cannot be used (too short, unreadable, none matches)."""


# ------------------------------------------------------------ host side
def new_key() -> str:
    """32 random bytes from the OS's CSPRNG, as 64 hex characters."""
    return secrets.token_hex(32)


def check_key(key, what: str = "update_key") -> str:
    if isinstance(key, bytes):
        try:
            key = key.decode("ascii")
        except UnicodeDecodeError:
            raise UpdateKeyError(f"{what}: a key is printable ASCII text "
                                 "(e.g. 64 hex characters)") from None
    if not isinstance(key, str):
        raise UpdateKeyError(f"{what} must be a string, got "
                             f"{type(key).__name__}")
    if not key.isprintable() or any(c.isspace() or c == "," for c in key):
        raise UpdateKeyError(f"{what}: a key is printable ASCII without "
                             "spaces or commas (e.g. 64 hex characters)")
    if not MIN_KEY_CHARS <= len(key) <= MAX_KEY_BYTES or not key.isascii():
        raise UpdateKeyError(
            f"{what}: a key has {MIN_KEY_CHARS} to {MAX_KEY_BYTES} ASCII "
            f"characters (got {len(key)}); omit it to have a random 256-bit "
            "key generated")
    return key


def digest(salt: bytes, key: str) -> bytes:
    """SHA-256(DOMAIN || salt || key): what the export stores."""
    return hashlib.sha256(DOMAIN + salt + key.encode("ascii")).digest()


def entry(key: str) -> dict:
    """The export's record of `key`: a fresh salt and the digest (hex)."""
    salt = secrets.token_bytes(SALT_BYTES)
    return {"salt": salt.hex(), "sha256": digest(salt, key).hex()}


def matches(record: dict, key: str) -> bool:
    return hmac.compare_digest(
        digest(bytes.fromhex(record["salt"]), key),
        bytes.fromhex(record["sha256"]))


def default_key_file(export_dir: str) -> str:
    """Beside the export's base path, never inside a version directory:
    `/models/ranker/1` -> `/models/ranker.update_key`; a non-numeric
    export directory `/tmp/export` -> `/tmp/export.update_key`."""
    export_dir = os.path.abspath(os.fspath(export_dir))
    base = os.path.dirname(export_dir) if os.path.basename(
        export_dir).isdigit() else export_dir
    return base + KEY_SUFFIX


def parse_keys(text: str, what: str) -> List[str]:
    keys = [k for k in text.replace(",", " ").split() if k]
    return [check_key(k, what) for k in keys]


def read_key_file(path: str) -> List[str]:
    """The keys of a key file, newest first."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise UpdateKeyError(f"update key file {path}: {e.strerror or e}"
                             ) from e
    keys = parse_keys(text, f"update key file {path}")
    if not keys:
        raise UpdateKeyError(f"update key file {path} holds no key")
    return keys


def write_key_file(path: str, keys: Iterable[str]) -> None:
    """Owner-only (0600) file of `keys`, one a line; written to a temporary
    name created 0600, fsynced and renamed, so it is never readable by
    others, not even half written."""
    keys = list(dict.fromkeys(keys))[:KEEP_KEYS]
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    if os.path.exists(tmp):
        os.remove(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write("".join(k + "\n" for k in keys))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)  # whatever the umask
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def key_for_export(export_dir: str, update_key=None,
                   update_key_file: Optional[str] = None,
                   rotate: bool = False) -> (str, str, Optional[List[str]]):
    """(key, key file, the file's keys before) for a new updatable export:
    the given key, or a new one when `rotate` or when the key file does
    not exist, else the key file's newest key. A given or new key goes
    first in the key file (the previous newest stays second); an export
    that fails puts the file back (`restore_key_file`), so retrying a
    rotation does not push out the key of the base still served."""
    path = os.path.abspath(os.fspath(update_key_file)) if update_key_file \
        else default_key_file(export_dir)
    inside = os.path.abspath(export_dir) + os.sep
    if path.startswith(inside):
        raise UpdateKeyError(
            f"update_key_file {path} is inside the export {export_dir}, which "
            "the model server reads: keep it outside (default: "
            f"{default_key_file(export_dir)})")
    old = read_key_file(path) if os.path.exists(path) else []
    if update_key is not None:
        key = check_key(update_key)
    elif rotate or not old:
        key = new_key()
    else:
        key = old[0]
    if not old or old[0] != key:
        write_key_file(path, [key] + old)
    elif (os.stat(path).st_mode & 0o077) != 0:
        os.chmod(path, 0o600)
    return key, path, old


def restore_key_file(path: str, before: List[str]) -> None:
    """The key file as it was before `key_for_export` (none: removed)."""
    if before:
        write_key_file(path, before)
    elif os.path.exists(path):
        os.remove(path)


def follower_keys(update_key_file: Optional[str] = None,
                  environ=None) -> List[str]:
    """The follower's keys: the file's, then `TNET_UPDATE_KEY`'s (one or
    more, separated by spaces or commas)."""
    environ = os.environ if environ is None else environ
    keys = read_key_file(update_key_file) if update_key_file else []
    if environ.get(ENV_VAR):
        keys += parse_keys(environ[ENV_VAR], ENV_VAR)
    return list(dict.fromkeys(keys))


def pick(record: Optional[dict], keys: List[str]) -> Optional[str]:
    """The key among `keys` whose digest is `record`'s."""
    if record is None:
        return None
    for k in keys:
        if matches(record, k):
            return k
    return None


# ------------------------------------------------------------ graph side
def _rotr(x, n):
    return tf.bitwise.bitwise_and(
        tf.bitwise.bitwise_or(tf.bitwise.right_shift(x, np.int64(n)),
                              tf.bitwise.left_shift(x, np.int64(32 - n))),
        np.int64(_M32))


def _xor(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = tf.bitwise.bitwise_xor(out, x)
    return out


def _add(*xs):
    return tf.bitwise.bitwise_and(tf.add_n(list(xs)), np.int64(_M32))


def _schedule(block):
    """The 64 message words of one 16-word block."""
    def body(i, w):
        w15, w2 = tf.gather(w, i - 15), tf.gather(w, i - 2)
        s0 = _xor(_rotr(w15, 7), _rotr(w15, 18),
                  tf.bitwise.right_shift(w15, np.int64(3)))
        s1 = _xor(_rotr(w2, 17), _rotr(w2, 19),
                  tf.bitwise.right_shift(w2, np.int64(10)))
        new = _add(tf.gather(w, i - 16), s0, tf.gather(w, i - 7), s1)
        return i + 1, tf.concat([w, tf.reshape(new, [1])], 0)

    _, w = tf.while_loop(lambda i, w: i < 64, body,
                         [tf.constant(16), block],
                         shape_invariants=[tf.TensorShape([]),
                                           tf.TensorShape([None])])
    return w


def _compress(h, block):
    w = _schedule(block)
    k = tf.constant(_K)

    def body(i, a, b, c, d, e, f, g, hh):
        s1 = _xor(_rotr(e, 6), _rotr(e, 11), _rotr(e, 25))
        ch = _xor(tf.bitwise.bitwise_and(e, f), tf.bitwise.bitwise_and(
            tf.bitwise.bitwise_xor(e, np.int64(_M32)), g))
        t1 = _add(hh, s1, ch, tf.gather(k, i), tf.gather(w, i))
        s0 = _xor(_rotr(a, 2), _rotr(a, 13), _rotr(a, 22))
        maj = _xor(tf.bitwise.bitwise_and(a, b), tf.bitwise.bitwise_and(a, c),
                   tf.bitwise.bitwise_and(b, c))
        t2 = _add(s0, maj)
        return i + 1, _add(t1, t2), a, b, c, _add(d, t1), e, f, g

    out = tf.while_loop(lambda i, *_: i < 64, body,
                        [tf.constant(0)] + [h[j] for j in range(8)])
    return _add(h, tf.stack(out[1:]))


def sha256(message) -> tf.Tensor:
    """SHA-256 of a scalar string, as 8 int64 holding its 32-bit words
    (big-endian order, as hashlib's digest), with stock ops only."""
    data = tf.cast(tf.io.decode_raw(message, tf.uint8), tf.int64)
    n = tf.size(data, out_type=tf.int64)
    padded = (n + 8) // 64 * 64 + 64
    bits = n * 8
    length = tf.bitwise.bitwise_and(tf.bitwise.right_shift(
        bits, tf.constant([56, 48, 40, 32, 24, 16, 8, 0], tf.int64)),
        np.int64(0xFF))
    data = tf.concat([data, tf.constant([0x80], tf.int64),
                      tf.zeros([padded - n - 9], tf.int64), length], 0)
    quads = tf.reshape(data, [-1, 4])
    words = (tf.bitwise.left_shift(quads[:, 0], np.int64(24))
             + tf.bitwise.left_shift(quads[:, 1], np.int64(16))
             + tf.bitwise.left_shift(quads[:, 2], np.int64(8))
             + quads[:, 3])
    blocks = tf.reshape(words, [-1, 16])

    def body(i, h):
        return i + 1, _compress(h, blocks[i])

    _, h = tf.while_loop(lambda i, h: i < tf.shape(blocks)[0], body,
                         [tf.constant(0), tf.constant(_H0)],
                         shape_invariants=[tf.TensorShape([]),
                                           tf.TensorShape([8])])
    return h


def words_of(digest_bytes: bytes) -> np.ndarray:
    """A 32-byte digest as the 8 int64 words `sha256` returns."""
    return np.frombuffer(digest_bytes, ">u4").astype(np.int64)


def key_ok(record: dict, key) -> tf.Tensor:
    """Graph: does `key` (a scalar string tensor) have `record`'s digest?
    The key is hashed up to MAX_KEY_BYTES (a longer one is refused), the
    digests compared without an early exit."""
    salt = bytes.fromhex(record["salt"])
    want = tf.constant(words_of(bytes.fromhex(record["sha256"])))
    key = tf.convert_to_tensor(key, tf.string)
    short = tf.strings.length(key) <= MAX_KEY_BYTES
    head = tf.strings.substr(key, 0, MAX_KEY_BYTES)
    got = sha256(tf.strings.join([tf.constant(DOMAIN + salt), head]))
    same = tf.equal(tf.reduce_sum(tf.bitwise.bitwise_xor(got, want)),
                    np.int64(0))
    return tf.logical_and(same, short)


def refuse_unless(ok, signature: str):
    """An op that fails the request with `<signature>: refused: bad update
    key` unless `ok`; put every mutation under a control dependency on
    it."""
    return tf.debugging.Assert(
        ok, [tf.constant(f"{signature}: refused: bad update key")],
        name="update_key_check")
