"""tnet optimizers.

`tn.optimizer.SGD / Adagrad / RowwiseAdagrad / Adam / Ftrl` are tf_keras
optimizers for the dense variables that also carry the matching in-table
rule (`.sparse_rule`) for the embedding tables, whose slots live in the table
rows on the parameter servers. The bare in-table rules are in
`tn.optimizer.sparse`.
"""
from tnet.optimizer import sparse
from tnet.optimizer.keras import (SGD, Adagrad, Adam, Ftrl, RowwiseAdagrad,
                                  by_name, names, sparse_rule_of)

__all__ = ["SGD", "Adagrad", "RowwiseAdagrad", "Adam", "Ftrl", "sparse",
           "sparse_rule_of", "by_name", "names"]
