"""The metric registry: every declared metric is produced by its source, and the tables read it."""

import torch

from gatedattn.analysis import analyze
from gatedattn.analysis.registry import MECHANISM_METRICS, TEXT_METRICS, columns, keys
from gatedattn.data.backcopy import FALLBACK_TEXT, BigramBackcopy
from gatedattn.models.lm import GatedLM, ModelConfig
from gatedattn.reproduce import mechanism, mechanism_report, report
from gatedattn.reproduce.text import run as text_run
from gatedattn.reproduce.mechanism_probe import measure


def test_every_analysis_metric_is_produced_by_analyze():
    torch.manual_seed(0)
    model = GatedLM(ModelConfig.from_preset("micro", "sink", vocab_size=50)).eval()
    r = analyze(model, [torch.randint(0, 50, (2, 17))], layers_for_maps=[])
    assert set(keys(TEXT_METRICS, "analysis")) <= set(r)


def test_every_mechanism_metric_is_produced_by_the_probe():
    task = BigramBackcopy.from_text(FALLBACK_TEXT, source="test passage")
    cfg = ModelConfig.from_preset("toy", "gated", vocab_size=task.vocab_size, qk_norm=False)
    m = measure(GatedLM(cfg).eval(), task.sample(4, 16, seed=0), task)
    assert set(keys(MECHANISM_METRICS)) <= set(m)


def test_summaries_and_tables_read_the_registry():
    assert text_run.SUMMARY_METRICS == keys(TEXT_METRICS, "analysis")
    assert report.SUMMARY_COLUMNS == columns(TEXT_METRICS)
    assert mechanism.SUMMARY_KEYS == keys(MECHANISM_METRICS)
    assert mechanism_report.COLUMNS == columns(MECHANISM_METRICS)
    assert len({m.key for m in TEXT_METRICS}) == len(TEXT_METRICS)
    assert len({m.key for m in MECHANISM_METRICS}) == len(MECHANISM_METRICS)
