"""The reproduction: train variants alike, analyse them, judge the papers' claims, report."""

from gatedattn.reproduce.claims import CLAIMS, judge_all
from gatedattn.reproduce.report import write_report
from gatedattn.reproduce.runner import ReproduceConfig, reproduce

__all__ = ["CLAIMS", "ReproduceConfig", "judge_all", "reproduce", "write_report"]
