"""A new sparse rule with its own hyperparameter takes three places.

The tree (tnet/, tnet_ops/, setup.py) is copied into a temporary directory
and a toy rule, SGD with momentum (one slot: the velocity, dim floats;
a new hyperparameter `momentum`), is added exactly as docs/DESIGN.md's
recipe says: its header tnet_ops/optimizers/momentum.h, its lines in the
registration table tnet_ops/optimizers/rules.h, its class in
tnet/optimizer/sparse.py. The copy's op library is built there, and a
fresh process importing the copy trains tables with the rule, by name and
by instance, on several shards, bit-exact against numpy float32.

Long: it compiles the whole op library (minutes on 2 cores). The cheap
check that the table is the one source: tests/test_sparse_rules.py.
"""
from __future__ import annotations

import filecmp
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.long

ROOT = pathlib.Path(__file__).resolve().parents[1]

HEADER = """\
// SGD with momentum, as Keras SGD(momentum=m) (nesterov=False):
//   v = momentum * v - lr * g;  w += v
// Slots: v[dim], starting at 0.
#ifndef TNET_OPS_OPTIMIZERS_MOMENTUM_H_
#define TNET_OPS_OPTIMIZERS_MOMENTUM_H_

#include "tnet_ops/optimizers/optimizer.h"

namespace tnet {

struct Momentum : RuleBase {
  static constexpr const char* kName = "momentum";
  static constexpr const char* kHparams = "momentum";
  static int NumSlots(int dim) { return dim; }
  template <typename Config>
  static void InitSlots(const Config&, int dim, float* s) {
    for (int j = 0; j < dim; ++j) s[j] = 0.0f;
  }
  template <typename Config>
  static void Apply(const Config& c, float lr, int dim, const float* g,
                    float* w, float* v) {
    for (int j = 0; j < dim; ++j) {
      v[j] = c.momentum * v[j] - lr * g[j];
      w[j] += v[j];
    }
  }
};

}  // namespace tnet

#endif  // TNET_OPS_OPTIMIZERS_MOMENTUM_H_
"""

PY_CLASS = '''

class Momentum(SparseRule):
    """SGD with momentum (one slot, the velocity): v = momentum * v - lr * g;
    w += v."""

    name = "momentum"
    default_learning_rate = 0.01
'''

CHILD = textwrap.dedent('''
    import numpy as np
    import tensorflow as tf
    import tnet as tn
    from tnet.optimizer import sparse

    assert tn.__file__.startswith({root!r}), tn.__file__
    assert sparse.registered()["momentum"] == ("momentum",)
    assert sparse.Momentum().momentum == np.float32(0.9)  # the table's default
    DIM, VOCAB, STEPS = 5, 30, 8
    rng = np.random.default_rng(7)
    all_keys = np.arange(VOCAB, dtype=np.int64) * 7919 - 50
    for rule, lr, m, shards in [("momentum", 0.01, 0.9, 1),
                                (sparse.Momentum(0.05, momentum=0.6), 0.05,
                                 0.6, 3)]:
        table = tn.SparseTable(f"mom{{shards}}", DIM, rule,
                               num_shards=shards)
        assert table.num_slots == DIM
        w = table.pull(all_keys, training=True).numpy()
        v = np.zeros_like(w)
        lr32, m32 = np.float32(lr), np.float32(m)
        for step in range(STEPS):
            pick = rng.choice(VOCAB, size=12, replace=False)
            twice = pick[:4]  # some keys twice in the batch: summed first
            idx = np.concatenate([pick, twice])
            grads = rng.normal(size=(len(idx), DIM)).astype(np.float32)
            table.push(all_keys[idx], grads, learning_rate=lr)
            g = np.zeros_like(w)
            for i, k in enumerate(idx):
                g[k] += grads[i]
            for k in pick:
                v[k] = m32 * v[k] - lr32 * g[k]
                w[k] = w[k] + v[k]
        got = table.pull(all_keys, training=False).numpy()
        np.testing.assert_array_equal(got, w)
        keys, _, slots, _ = table.export()
        order = np.argsort(keys.numpy())
        np.testing.assert_array_equal(
            slots.numpy()[order], v[np.argsort(all_keys)])
    print("momentum trained bit-exact")
''')


def _last_hparam_line(text: str) -> str:
    """The last line of TNET_SPARSE_HPARAMS in rules.h (with its newline)."""
    block = text[text.index("#define TNET_SPARSE_HPARAMS(X)"):]
    block = block[:block.index("\n\n") + 1]
    return block.splitlines(keepends=True)[-1]


def _add_rule(tree: pathlib.Path) -> None:
    (tree / "tnet_ops/optimizers/momentum.h").write_text(HEADER)
    rules = tree / "tnet_ops/optimizers/rules.h"
    text = rules.read_text()
    for old, new in [
        ('#include "tnet_ops/optimizers/sgd.h"\n',
         '#include "tnet_ops/optimizers/sgd.h"\n'
         '#include "tnet_ops/optimizers/momentum.h"\n'),
        (_last_hparam_line(text),
         _last_hparam_line(text)[:-1] + " \\\n"
         "  X(momentum, 0.9, kUnitInterval)\n"),
        ("Adam, Ftrl>;", "Adam, Ftrl, Momentum>;"),
    ]:
        assert old in text, old
        text = text.replace(old, new)
    rules.write_text(text)
    with open(tree / "tnet/optimizer/sparse.py", "a") as f:
        f.write(PY_CLASS)


def _changed(a: pathlib.Path, b: pathlib.Path, rel="") -> list[str]:
    cmp = filecmp.dircmp(a, b, ignore=["__pycache__", "_lib"])
    out = [os.path.join(rel, n) for n in cmp.diff_files + cmp.left_only
           + cmp.right_only]
    for sub in cmp.common_dirs:
        out += _changed(a / sub, b / sub, os.path.join(rel, sub))
    return out


def test_a_rule_with_its_own_hyperparameter_is_three_places(tmp_path):
    tree = tmp_path / "tree"
    for part in ("tnet", "tnet_ops"):
        shutil.copytree(ROOT / part, tree / part,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy2(ROOT / "setup.py", tree / "setup.py")
    _add_rule(tree)
    changed = sorted(_changed(ROOT / "tnet", tree / "tnet", "tnet")
                     + _changed(ROOT / "tnet_ops", tree / "tnet_ops",
                                "tnet_ops"))
    assert changed == ["tnet/optimizer/sparse.py",
                       "tnet_ops/optimizers/momentum.h",
                       "tnet_ops/optimizers/rules.h"], changed
    build = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=tree, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    env = dict(os.environ, PYTHONPATH=str(tree))
    run = subprocess.run([sys.executable, "-c", CHILD.format(root=str(tree))],
                         cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "momentum trained bit-exact" in run.stdout
