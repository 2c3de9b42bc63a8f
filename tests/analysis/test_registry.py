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
    # every registered metric is summarised over the seeds from its own key, and nothing that is not registered
    mech_keys = keys(MECHANISM_METRICS)
    finals = [{**{k: float(j + i) for j, k in enumerate(mech_keys)}, "not_a_metric": 1.0} for i in (1, 3)]
    summary = mechanism_summary.summarize(finals)
    assert set(summary) == set(mech_keys) and "not_a_metric" not in summary
    assert [summary[k]["mean"] for k in mech_keys] == [j + 2.0 for j in range(len(mech_keys))]
    assert summary["bos_attn_ordinary"]["values"] == [1.0, 3.0]
    text_keys = keys(TEXT_METRICS, "analysis")
    runs = [{"analysis": {k: float(j + i) for j, k in enumerate(text_keys)}, "tokens_per_s": 10.0 * i,
             "final_loss": 5.0 - i} for i in (1, 3)]
    text_summary = text_run.summarize(runs)
    assert [text_summary[k]["mean"] for k in text_keys] == [j + 2.0 for j in range(len(text_keys))]
    assert text_summary["tokens_per_s"]["mean"] == 20.0 and text_summary["final_train_loss"]["mean"] == 3.0
    # the mechanism report's table: the table metrics' labels, in the registry's order, each value
    # with its own digits; metrics declared table=False are left out
    lines = mechanism_report._summary_table({"baseline": summary}, {"analysis_sequences": 8}, 2)
    assert lines[0].startswith("| variant | BOS attn, ordinary | BOS attn, trigger | prev-token attn, trigger | "
                               "learnable sink, ordinary | F-Attn | Sink^ε |")
    assert "sink logit" not in lines[0] and "bigram floor" not in lines[0] and "| M-Act |" not in lines[0]
    assert lines[0].endswith("| loss, copy | loss, bigram |")
    cells = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert cells[0] == "`baseline`" and len(cells) == 1 + sum(m.table for m in MECHANISM_METRICS)
    assert cells[1:3] == ["2.000 ± 1.414", "3.000 ± 1.414"]  # bos_attn_*: 3 digits, each its own values
    assert cells[6] == "9.00 ± 1.41"  # sink_eps: 8th in the registry (mean 7 + 2, std of 8 and 10), 2 digits
    assert len({m.key for m in TEXT_METRICS}) == len(TEXT_METRICS)
    assert len({m.key for m in MECHANISM_METRICS}) == len(MECHANISM_METRICS)
