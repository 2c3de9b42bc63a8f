"""The metric registry: every declared metric is produced by its source, and the tables read it."""

import torch

from gatedattn.analysis import analyze
from gatedattn.analysis.registry import MECHANISM_METRICS, TEXT_METRICS, keys
from gatedattn.data.backcopy import FALLBACK_TEXT, BigramBackcopy
from gatedattn.models.lm import GatedLM, ModelConfig
from gatedattn.reproduce.mechanism import report as mechanism_report, summary as mechanism_summary
from gatedattn.reproduce.text import run as text_run
from gatedattn.reproduce.mechanism.probe import measure


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
    # every registered metric is summarised over the seeds, and nothing that is not registered
    finals = [{**{k: float(i) for k in keys(MECHANISM_METRICS)}, "not_a_metric": 1.0} for i in (1, 3)]
    summary = mechanism_summary.summarize(finals)
    assert set(summary) == set(keys(MECHANISM_METRICS)) and all(s["mean"] == 2.0 for s in summary.values())
    runs = [{"analysis": {k: float(i) for k in keys(TEXT_METRICS, "analysis")}, "tokens_per_s": 1.0,
             "final_loss": 1.0} for i in (1, 3)]
    text_summary = text_run.summarize(runs)
    assert all(text_summary[k]["mean"] == 2.0 for k in keys(TEXT_METRICS, "analysis"))
    # the mechanism report's table has one column per table metric, with its label, and its values
    lines = mechanism_report._summary_table({"baseline": summary}, {"analysis_sequences": 8}, 2)
    labels = [m.label for m in MECHANISM_METRICS if m.table]
    assert lines[0] == "| variant | " + " | ".join(labels) + " |"
    assert lines[2].count("|") == len(labels) + 2 and "2" in lines[2]
    assert len({m.key for m in TEXT_METRICS}) == len(TEXT_METRICS)
    assert len({m.key for m in MECHANISM_METRICS}) == len(MECHANISM_METRICS)
