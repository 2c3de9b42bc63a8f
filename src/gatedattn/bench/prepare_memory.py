"""Peak memory of `gatedattn data prepare` on a large Parquet file.

Writes a synthetic Parquet file of about --mb megabytes of text (documents of Zipf-
distributed pseudo-words, row groups of --row-group rows), then runs
`gatedattn data prepare --input FILE` in a child process and prints the child's peak
resident memory (its own ``VmHWM``, which does not count what this process holds) next to
the input size. Run it at two sizes to see that the peak does
not grow with the input:

    python -m gatedattn.bench.prepare_memory --mb 100 400

Everything is written under --work (default: a temporary directory, removed at the end).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# the child runs the command, then writes its own peak (VmHWM) to the file its first argument names
CHILD = ("import sys, pathlib; from gatedattn.cli import main; from gatedattn.bench.load import peak_rss_bytes; "
         "code = main(sys.argv[2:]); pathlib.Path(sys.argv[1]).write_text(str(peak_rss_bytes())); sys.exit(code)")


def write_parquet(path: Path, mb: float, row_group: int, seed: int = 0) -> tuple[int, int]:
    """About ``mb`` MB of text in ``path``; returns (documents, text bytes)."""
    import pyarrow as pa  # lazy: heavy (pyarrow)
    import pyarrow.parquet as pq  # lazy: heavy (pyarrow)

    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = np.array(["".join(rng.choice(letters, size=rng.integers(2, 9))) for _ in range(5000)])
    p = 1.0 / np.arange(1, len(vocab) + 1)
    p /= p.sum()
    target, written, docs = int(mb * 1_000_000), 0, 0
    schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
    with pq.ParquetWriter(path, schema) as writer:
        while written < target:
            texts = []
            for _ in range(row_group):
                words = vocab[rng.choice(len(vocab), size=int(rng.integers(50, 600)), p=p)]
                texts.append(" ".join(words.tolist()) + ".")
            writer.write_table(pa.table({"id": np.arange(docs, docs + len(texts)), "text": texts}, schema=schema))
            docs += len(texts)
            written += sum(len(t) for t in texts)
    return docs, written


def run(mb: float, work: Path, vocab_size: int, row_group: int) -> dict:
    src = work / f"corpus_{mb:g}mb.parquet"
    t0 = time.perf_counter()
    docs, text_bytes = write_parquet(src, mb, row_group)
    made = time.perf_counter() - t0
    out = work / f"prepared_{mb:g}mb"
    argv = ["data", "prepare", "--input", str(src), "--out", str(out), "--vocab-size", str(vocab_size), "--force"]
    peak_file = work / f"peak_{mb:g}mb"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", CHILD, str(peak_file), *argv], check=True)
    wall = time.perf_counter() - t0
    peak = int(peak_file.read_text())  # the child's own: ru_maxrss of children would carry this process's peak
    peak_file.unlink()
    manifest = json.loads((out / "manifest.json").read_text())
    result = {
        "input_mb": round(src.stat().st_size / 1e6, 1), "text_mb": round(text_bytes / 1e6, 1), "documents": docs,
        "tokens": manifest["train"]["tokens"] + manifest["val"]["tokens"], "vocab": manifest["vocab_size"],
        "prepare_s": round(wall, 1), "write_input_s": round(made, 1), "peak_rss_mb": round(peak / 2**20, 1),
    }
    shutil.rmtree(out)
    src.unlink()
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, nargs="+", default=[400], help="input text sizes in MB (default 400)")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--row-group", type=int, default=2000, help="rows per Parquet row group (default 2000)")
    parser.add_argument("--work", type=Path, default=None, help="working directory (default: a temporary one)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="gatedattn-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        for mb in sorted(args.mb):
            print(json.dumps(run(mb, work, args.vocab_size, args.row_group)), flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
