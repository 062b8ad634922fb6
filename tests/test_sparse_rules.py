"""The registration table of the sparse rules (tnet_ops/optimizers/rules.h)
is the one source of each rule's hyperparameters.

Every rule of the table has its C++ header and its Python class (and no
Python class lacks a rule); the SparseTableHandle attrs, the Python
classes' arguments and defaults come from the table; nothing else in tnet/
or tnet_ops/ lists a hyperparameter (checked by reading the sources). That
adding a rule really takes only those three places, built and trained:
tests/test_sparse_rule_recipe.py (long).
"""
from __future__ import annotations

import ast
import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf

import tnet as tn  # noqa: F401  (loads the op library)
from tnet import _ops
from tnet.optimizer import sparse

ROOT = pathlib.Path(__file__).resolve().parents[1]
RULES_H = ROOT / "tnet_ops" / "optimizers" / "rules.h"

# Where tnet's code may name a hyperparameter besides the table and the
# rules that read it, and why: the Adagrad rows' own accumulator start
# (sparse.ROW_INITIAL_ACCUMULATOR_VALUE, a measured tnet default that
# differs from Keras'), the Keras Adagrad's dense/rows split of that start
# (and its epsilon, passed on to tf_keras), the Keras Adagrad's argument
# for the rows' count-dependent start (no Keras optimizer has it, so it
# is taken before tf_keras sees the rest), LinearFeatures' wide FTRL
# start, and the rows' batch-aware start (start_reference_batch: a row
# default differing from the attr's "off", None for off in Python, taken
# before tf_keras sees the rest). A name used anywhere else is a second
# list to keep in step.
ALLOWED = {
    "tnet/optimizer/sparse.py": {"initial_accumulator_value",
                                 "accumulator_floor",
                                 "start_reference_batch"},
    "tnet/optimizer/keras.py": {"initial_accumulator_value", "epsilon",
                                "accumulator_floor", "start_reference_batch"},
    "tnet/layers/linear_features.py": {"initial_accumulator_value"},
}


def _table_hparams_text() -> dict[str, tuple[str, str]]:
    """TNET_SPARSE_HPARAMS as written in rules.h: name -> (default, range)."""
    text = RULES_H.read_text()
    block = text[text.index("#define TNET_SPARSE_HPARAMS(X)"):]
    block = block[:block.index("\n\n")]
    return {m[1]: (m[2], m[3]) for m in re.finditer(
        r"X\((\w+), ([-+.\w]+), (\w+)\)", block)}


def _header_of(rule: str) -> str:
    return (ROOT / "tnet_ops" / "optimizers" / f"{rule}.h").read_text()


def test_every_rule_has_its_header_and_its_python_class_and_nothing_else():
    table = sparse.registered()
    assert table, "the op library lists no rule"
    assert set(table) == set(sparse._BY_NAME)
    listed = re.search(r"using SparseRules = RuleList<([^>]*)>;",
                       RULES_H.read_text())[1]
    assert len(listed.split(",")) == len(table)
    for name, hparams in table.items():
        header = _header_of(name)
        assert f'kName = "{name}"' in header, name
        assert f'#include "tnet_ops/optimizers/{name}.h"' in \
            RULES_H.read_text(), name
        cls = sparse._BY_NAME[name]
        assert cls.hparams() == hparams
        assert set(cls.defaults()) == set(hparams)
        rule = cls()
        assert set(rule.table_attrs()) == {"optimizer", *hparams}
        # Every config field a rule's header reads is one it declares.
        read = set(re.findall(r"\bc\.(\w+)", header))
        if name == "rowwise_adagrad":  # declares Adagrad's, calls its Check
            read |= set(re.findall(r"\bc\.(\w+)", _header_of("adagrad")))
        assert read <= set(hparams), (name, read - set(hparams))


def test_handle_attrs_and_python_defaults_come_from_the_table():
    written = _table_hparams_text()
    rules, rule_hparams, names, defaults = (
        [v.decode() for v in t.numpy()] for t in _ops.tnet_sparse_rules())
    assert dict(zip(names, defaults)) == {k: v[0] for k, v in written.items()}
    assert set(" ".join(rule_hparams).split()) == set(names)
    from tensorflow.python.framework import op_def_registry
    op = op_def_registry.get("SparseTableHandle")
    attrs = list(op.attr)
    at = [a.name for a in attrs].index("optimizer") + 1
    hparam_attrs = attrs[at:at + len(written)]
    assert [a.name for a in hparam_attrs] == list(written)
    assert all(a.type == "float" for a in hparam_attrs)
    assert [a.default_value.f for a in hparam_attrs] == [
        pytest.approx(np.float32(float(v[0]))) for v in written.values()]
    # The only other float attr is the admission's.
    assert {a.name for a in attrs if a.type == "float"} - set(written) == {
        "min_count"}
    for name, hparams in sparse.registered().items():
        cls = sparse._BY_NAME[name]
        for k, value in cls.defaults().items():
            assert value == float(cls.row_defaults.get(k, written[k][0]))


def test_rules_op_describes_one_rule_or_rejects_an_unknown_one():
    rules, rule_hparams, _, _ = _ops.tnet_sparse_rules(optimizer="adam")
    assert [r.decode() for r in rules.numpy()] == ["adam"]
    assert rule_hparams.numpy()[0].decode().split() == [
        "beta_1", "beta_2", "epsilon"]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="unknown optimizer 'nope'.*sgd, adagrad"):
        _ops.tnet_sparse_rules(optimizer="nope")


def test_rule_arguments_keep_their_order_and_reject_unknown_names():
    a = sparse.Ftrl(0.1, -0.25, 0.2, l2_regularization_strength=0.5)
    assert (a.learning_rate_power, a.initial_accumulator_value,
            a.l2_regularization_strength, a.beta) == (-0.25, 0.2, 0.5, 0.0)
    assert sparse.SGD().learning_rate == 0.01
    assert sparse.Adam().learning_rate == 0.001
    assert sparse.Adam().epsilon == 1e-7
    with pytest.raises(TypeError, match="unexpected keyword argument 'eps'"):
        sparse.Adam(0.1, eps=1.0)
    with pytest.raises(TypeError, match="multiple values"):
        sparse.Adam(0.1, 0.8, beta_1=0.7)
    with pytest.raises(TypeError, match="at most 1 positional"):
        sparse.SGD(0.1, 0.9)
    with pytest.raises(TypeError, match="must be a number"):
        sparse.Adam(0.1, beta_1="0.9")
    # Keras twins take Keras' arguments and hand the rule its hyperparameters.
    opt = tn.optimizer.Ftrl(0.1, l1_regularization_strength=0.01)
    assert opt.sparse_rule.l1_regularization_strength == pytest.approx(0.01)
    assert tn.optimizer.Adam(0.1, beta_2=0.99).sparse_rule.beta_2 == \
        pytest.approx(0.99)


def _names_in_python(path: pathlib.Path) -> set[str]:
    """The names a module could list hyperparameters with: its string
    constants (docstrings excluded), parameters and keyword arguments."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                             ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and \
                    isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings:
            names.add(node.value)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
    return names


def _names_in_cpp(text: str) -> set[str]:
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'R"doc\(.*?\)doc"', "", text, flags=re.S)
    return set(re.findall(r"\w+", text))


def test_nothing_else_lists_a_hyperparameter():
    hparams = set(_table_hparams_text())
    assert hparams
    found = {}
    for path in sorted((ROOT / "tnet").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        hits = _names_in_python(path) & hparams
        if hits - ALLOWED.get(rel, set()):
            found[rel] = sorted(hits - ALLOWED.get(rel, set()))
    headers = {f"tnet_ops/optimizers/{r}.h": set(h)
               for r, h in sparse.registered().items()}
    for path in sorted((ROOT / "tnet_ops").rglob("*")):
        if path.suffix not in (".h", ".cc", ".c") or path == RULES_H:
            continue
        rel = str(path.relative_to(ROOT))
        hits = _names_in_cpp(path.read_text()) & hparams
        if hits - headers.get(rel, set()):
            found[rel] = sorted(hits - headers.get(rel, set()))
    assert not found, (
        "hyperparameters named outside the registration table "
        "(tnet_ops/optimizers/rules.h) and the rule that reads them: "
        f"{found}")
