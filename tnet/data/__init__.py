"""Input pipelines: feature specs and readers for your own data (spec,
spec_dataset), Criteo, Avazu and MovieLens readers, synthetic Criteo-like data, exact AUC.

The readers are pure `tf.data` graphs (they run in a ParameterServerStrategy
`dataset_fn`); bad rows fail with file:line or are skipped and counted
(`ReadStats`). See each module's docstring for the formats and the why.
"""
from tnet.data._rows import ReadStats
from tnet.data.avazu import AVAZU_CAT_COLUMNS, avazu_dataset
from tnet.data.criteo import (CRITEO_CAT_COLUMNS, CRITEO_INT_COLUMNS, CRITEO_MISSING_ID,
                              criteo_csv_dataset, criteo_dataset)
from tnet.data import spec
from tnet.data.metrics import auc, calibration, group_auc
from tnet.data.readers import (BadDataError, FileScan, count_records, find_bad_records, parquet_to_tfrecord,
                               scan_files,
                               spec_dataset)
from tnet.data.stream import FileStream, stream_dataset
from tnet.data.stream_cluster import fit_stream
from tnet.data.movielens import MovieLens, load_movielens, movielens_dataset, popularity_recall
from tnet.data.synthetic import (CRITEO_KAGGLE_CARDINALITIES, SyntheticCriteo,
                                 synthetic_cardinalities)

__all__ = [
    "AVAZU_CAT_COLUMNS", "CRITEO_CAT_COLUMNS", "CRITEO_INT_COLUMNS",
    "CRITEO_KAGGLE_CARDINALITIES", "CRITEO_MISSING_ID", "MovieLens", "ReadStats", "SyntheticCriteo",
    "auc", "avazu_dataset", "calibration", "count_records", "find_bad_records", "group_auc",
    "parquet_to_tfrecord", "scan_files", "FileStream", "fit_stream", "stream_dataset", "FileScan", "BadDataError", "spec", "spec_dataset", "criteo_csv_dataset", "criteo_dataset", "load_movielens",
    "movielens_dataset", "popularity_recall", "synthetic_cardinalities",
]
