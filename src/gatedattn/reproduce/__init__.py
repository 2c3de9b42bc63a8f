"""The reproduction: train variants alike, analyse them, judge the papers' claims, report.
``reproduce(cfg)`` runs the registered study whose config ``cfg`` is
(:mod:`gatedattn.reproduce.studies`)."""

from gatedattn.reproduce.claims import CLAIMS, judge_all
from gatedattn.reproduce.lr_study import LrConfig
from gatedattn.reproduce.rank_sweep import RankConfig
from gatedattn.reproduce.report import write_report
from gatedattn.reproduce.main_job import ReproduceConfig
from gatedattn.reproduce.text.config import TextConfig
from gatedattn.reproduce.studies import STUDIES, run as reproduce

__all__ = ["CLAIMS", "LrConfig", "RankConfig", "ReproduceConfig", "STUDIES", "TextConfig", "judge_all", "reproduce",
           "write_report"]
