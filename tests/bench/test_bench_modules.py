"""The benchmarks run as modules (``python -m gatedattn.bench.train_throughput`` and
``python -m gatedattn.bench.prepare_memory``) produce their figures at the smallest sizes."""

import json

from gatedattn.bench import prepare_memory, train_throughput


def test_train_throughput_reports_a_row_per_configuration(capsys):
    argv = ["--presets", "micro", "--variants", "baseline,gated", "--dtypes", "fp32", "--seq-len", "16", "--batch", "2",
            "--warmup", "0", "--steps", "1", "--vocab", "64", "--json"]
    assert train_throughput.main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["preset"], r["variant"], r["dtype"]) for r in rows] == [("micro", "baseline", "fp32"),
                                                                      ("micro", "gated", "fp32")]
    assert all(r["tokens_per_s"] > 0 and r["params"] > 0 for r in rows)
    assert rows[1]["params"] > rows[0]["params"]  # the gate's parameters are counted


def test_prepare_memory_prepares_and_measures_the_child(tmp_path, capsys):
    import torch

    ballast = torch.ones(2**28)  # 1 GiB held here: the child's peak must not count what its parent holds
    prepare_memory.main(["--mb", "0.05", "--vocab-size", "300", "--row-group", "20", "--work", str(tmp_path)])
    del ballast
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["documents"] > 0 and row["tokens"] > 0 and row["vocab"] == 300
    assert 10 < row["peak_rss_mb"] < 1024
    assert list(tmp_path.iterdir()) == []  # its input and output are removed; nothing else was there
