"""Ranking models (CTRModel family) and the TwoTower retrieval model, built
on tnet tables."""
from tnet.models.base import CTRModel
from tnet.models.dcn import DCN
from tnet.models.deepfm import DeepFM
from tnet.models.two_tower import TwoTower
from tnet.models.wide_deep import WideDeep

__all__ = ["CTRModel", "WideDeep", "DeepFM", "DCN", "TwoTower"]
