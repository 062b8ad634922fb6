"""The SPARSE-HEAVY configuration of docs/BENCHMARK_PROTOCOL.md, shared by
tools/bench_train.py, tools/bench_pss.py and tools/_pss_chief.py.

SPARSE-HEAVY (embedding-bound): the 26 synthetic Criteo columns plus 4
multi-valued columns M1..M4 (tnet.data.SyntheticCriteo(multi_valued=4):
1 to 50 ids per row, mean 20, Zipf 1.1 over 1M ids per column at scale 1;
int64 [B, 50] padded with -1), dim 16 for every column, DNN 128-64, batch
4096, Wide&Deep, Adagrad lr 0.05 for both models (as WD-400).

- tnet: tn.models.WideDeep over 30 embedding columns of dim 16 in the one
  shared table "embedding" (as WD-400), combiner mean (the multi-valued
  ones average their ids; the single ones have one id), wide part
  LinearFeatures (in-table FTRL, its default; it sums a column's ids),
  tn.optimizer.Adagrad.
- stock: tnet.models.stock.stock_wide_deep with 2**20 floormod bins per
  column and per table, the multi-valued columns pooled by
  `PooledEmbedding` (mean deep, sum wide: the same model as tnet's),
  tf_keras Adagrad (sparse row updates). `pooling` "ragged" (look up only
  the real ids) or "masked" (look up all 50 slots, zero the padding).

Imports TensorFlow only inside the builders (tnet must come first).
"""
from __future__ import annotations

MULTI_VALUED = 4
EMBEDDING_DIM = 16
HIDDEN = (128, 64)
# How the stock model gets and pools M1..M4: a RaggedTensor (only real ids
# looked up); padded [B, 50] with the padding dropped by boolean_mask;
# padded with all 50 slots looked up and the padding zeroed.
STOCK_FORMS = ("ragged", "padded", "masked")


def columns():
    """(single-valued id columns, multi-valued id columns, dense columns)."""
    from tnet.data import CRITEO_CAT_COLUMNS, CRITEO_INT_COLUMNS  # noqa: PLC0415
    from tnet.data.synthetic import multi_valued_columns  # noqa: PLC0415
    return (CRITEO_CAT_COLUMNS, multi_valued_columns(MULTI_VALUED),
            CRITEO_INT_COLUMNS)


def deep_width() -> int:
    """Width of the DNN's input: 30 embeddings of dim 16 + 13 dense."""
    cats, multi, ints = columns()
    return (len(cats) + len(multi)) * EMBEDDING_DIM + len(ints)


def build_tnet(lr: float, hidden=HIDDEN, dim: int = EMBEDDING_DIM,
               initializer=None, wide_optimizer=None, optimizer=None):
    """tn.models.WideDeep, compiled with tn.optimizer.Adagrad(lr) (or
    `optimizer`); `initializer` (the deep rows') and `wide_optimizer`
    (the wide part's rule) default to tnet's defaults."""
    import tnet as tn  # noqa: PLC0415
    from tnet import feature_column as fc  # noqa: PLC0415
    cats, multi, ints = columns()
    cols = [fc.embedding_column(fc.category_column(n), dim, combiner="mean",
                                table="embedding", initializer=initializer)
            for n in cats + multi]
    model = tn.models.WideDeep(cols, ints, embedding_dim=dim,
                               hidden_units=tuple(hidden), train_metrics=False,
                               wide_optimizer=wide_optimizer)
    model.compile(optimizer or tn.optimizer.Adagrad(lr))
    return model


def build_stock(lr: float, bins: int, form: str = "ragged",
                hidden=HIDDEN, dim: int = EMBEDDING_DIM):
    """Stock tf_keras Wide&Deep, floormod bins, compiled with Adagrad.
    form: how M1..M4 arrive and are pooled (see STOCK_FORMS)."""
    import tf_keras  # noqa: PLC0415
    from tnet.data.synthetic import MULTI_VALUED_MAX_LENGTH  # noqa: PLC0415
    from tnet.models.stock import stock_wide_deep  # noqa: PLC0415
    cats, multi, ints = columns()
    model = stock_wide_deep(cats, ints, embedding_dim=dim, num_bins=bins,
                            hidden_units=tuple(hidden), multi_valued=multi,
                            max_length=MULTI_VALUED_MAX_LENGTH,
                            ragged=form == "ragged",
                            pooling="masked" if form == "masked" else "ragged")
    model.compile(tf_keras.optimizers.Adagrad(lr),
                  tf_keras.losses.BinaryCrossentropy(from_logits=True))
    return model
