"""``gatedattn analyze`` and ``gatedattn extrapolate``.

    gatedattn analyze --model DIR [--data DATA_DIR | --text PATH...] [--first-token auto|bos|none|ID]
                      [--seq-len N] [--batches K] [--batch-size B] [--seed S]
                      [--layers 2,3] [--eps 0.3] [--device D] [--json] [--out FILE] [--plots DIR]
    gatedattn extrapolate --model DIR [--data DATA_DIR] [--train-len N]
                      [--multiples 1,2,4,8] [--methods plain,ntk,yarn] [--tokens N]
                      [--batch-size B] [--device D] [--json] [--out FILE] [--plot FILE]

``--model`` is any checkpoint the project loads (our format, or HF / official layouts
through ``gatedattn.hf``). ``--data`` is a directory written by ``gatedattn data prepare``
whose tokenizer matches the model; it may be left out for a model that ``gatedattn train``
wrote (``RUN/final`` or ``RUN/checkpoints/step_N``): the data directory recorded in the
run (``train.data_dir`` of the model's ``checkpoint.json`` or of ``RUN/config.json``) is
used. ``analyze --text`` reads raw text instead (``.txt`` / ``.md`` files, one document
each, or a ``.jsonl`` with a ``text`` field) and tokenizes it with the model's own
tokenizer; no data directory is needed.

``analyze`` windows hold one document stretch each, with ``--first-token`` first and no
separator inside (:mod:`gatedattn.analysis.windows`): ``--batches x --batch-size`` windows
of ``--seq-len`` positions, drawn by ``--seed`` from the data's validation documents or
the texts. ``extrapolate`` measures loss on the data's fixed ``val_batches``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from gatedattn.analysis.analyze import (analyze, extrapolate, extrapolation_curves, format_analysis,
                                        format_extrapolation, load_any)
from gatedattn.analysis.result import AnalysisResult
from gatedattn.analysis.windows import (document_windows, model_tokenizer, parse_first_token, resolve_first_token,
                                        text_documents, tokenize_documents, tokenizer_bos, tokenizer_convention,
                                        val_documents)
from gatedattn.data import TokenData
from gatedattn.hf.load import load_config, verify_model_dir
from gatedattn.hf.load import model_tokenizer as hf_model_tokenizer
from gatedattn.infra.device import model_device
from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.inputs import check_input, input_options
from gatedattn.infra.integrity import tokenizer_fingerprint
from gatedattn.infra.io import atomic_write_json, check_no_overlap, check_writable, interruptible, loads_json
from gatedattn.infra.outputs import check_file_output
from gatedattn.infra.sizes import check_memory, forward_bytes
from gatedattn.train.rundir import CONFIG as RUN_CONFIG

CHECKPOINT_INFO = "checkpoint.json"  # gatedattn.train.checkpoint.INFO_FILE
_STOPPED = "stopped before any result was written (the model and data are untouched); run the same command again"
MAX_DEFAULT_SEQ_LEN = 2048  # analyze materialises B*H*T*T probabilities per layer


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _number_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not 0 < v < math.inf for v in values):
        raise argparse.ArgumentTypeError(f"expected positive finite numbers, got {text!r}")
    return [int(v) if v == int(v) else v for v in values]


def _word_list(text: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values:
        raise argparse.ArgumentTypeError("expected at least one name")
    return values


def _int_at_least(low: int):
    """An argparse type: an integer >= ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse


_positive_int, _non_negative_int = _int_at_least(1), _int_at_least(0)


def _recorded_data_dir(model_dir: Path) -> tuple[Path | None, list[Path]]:
    """The data directory a training run recorded for ``model_dir``, and the files looked at.

    A trainer's checkpoint (``RUN/checkpoints/step_N/``) or final model (``RUN/final/``)
    has the run identity -- a JSON object whose ``train`` object holds ``data_dir`` -- in
    its own ``checkpoint.json`` or in the run directory's ``config.json``.
    """
    candidates = [model_dir / CHECKPOINT_INFO, model_dir.parent / RUN_CONFIG, model_dir.parent.parent / RUN_CONFIG]
    for path in candidates:
        if not path.is_file():
            continue
        try:
            record = loads_json(path.read_bytes(), path)
        except (GatedAttnError, OSError):
            continue
        train = record.get("train") if isinstance(record, dict) else None
        entry = train.get("data_dir") if isinstance(train, dict) else None
        if isinstance(entry, str) and entry:
            return Path(entry), candidates
    return None, candidates


def _data_dir(args: argparse.Namespace) -> Path:
    if args.data is not None:
        return Path(args.data)
    found, looked = _recorded_data_dir(Path(args.model).resolve())
    if found is None:
        raise GatedAttnError(
            f"--data is required: no training run record ({', '.join(str(p) for p in looked)}) names a data_dir"
        )
    if not found.is_dir():
        raise GatedAttnError(f"the training run used data directory {found}, which is not there; pass --data")
    check_input(found, "the training run's data directory")  # as --data would be checked
    return found


def _load(args: argparse.Namespace):
    device = model_device(args.device)
    if not Path(args.model).is_dir():
        raise GatedAttnError(f"model directory not found: {args.model}")
    verify_model_dir(args.model)  # config, tokenizer and the manifest's other files (weights: as they are read)
    _check_extrapolation_memory(args, load_config(args.model), device)
    # before the (possibly large) model: fail fast; the val stream and tokenizer checked against the manifest
    data = TokenData(_data_dir(args), verify=("val",))
    _check_same_tokenizer(Path(args.model), data, args.force)
    model = load_any(args.model, device=device)
    vocab = getattr(model.cfg, "vocab_size", None)
    if vocab is not None and data.vocab_size > vocab:
        raise GatedAttnError(
            f"the data's tokenizer has {data.vocab_size} tokens but the model's vocabulary has {vocab}; "
            f"prepare the data with the model's tokenizer (gatedattn data prepare --tokenizer ...)"
        )
    return model, data


def _check_analysis_memory(args: argparse.Namespace, cfg, seq_len: int, device) -> None:
    """``analyze``'s sizes against the memory of ``device``, before any window is built:
    the windows (--batches x --batch-size x (T + 1) token ids) and one batch's forward
    pass, with the attention probabilities the analysis reads."""
    parts = forward_bytes(cfg, args.batch_size, seq_len, attention_probs=True)
    parts["windows"] = 8 * args.batches * args.batch_size * (seq_len + 1)
    check_memory("the analysis", parts, {"--batch-size": args.batch_size, "--seq-len": seq_len,
                                         "--batches": args.batches}, device)


def _check_extrapolation_memory(args: argparse.Namespace, cfg, device) -> None:
    """``extrapolate``'s sizes against the memory of ``device``, before the model is read:
    every forward pass holds --batch-size windows of the longest length (round(largest
    of --multiples x --train-len)) or as many tokens in more, shorter windows."""
    train_len = args.train_len or cfg.max_seq_len
    longest = max(1, round(max(args.multiples) * train_len))
    options = {"--batch-size": args.batch_size, "--train-len": train_len,
               "--multiples": ",".join(map(str, args.multiples))}
    check_memory("the extrapolation", forward_bytes(cfg, args.batch_size, longest), options, device)


def _check_same_tokenizer(model: Path, data, force: bool) -> None:
    """The model's tokenizer (a directory's ``tokenizer.json`` or a GGUF file's own), when it
    has one, must tokenize like the data's: same vocabulary, merges and added tokens.
    ``--force`` skips the check."""
    if force:
        return
    theirs = data.data_dir / data.manifest.tokenizer_file
    mine = model / "tokenizer.json"
    if model.is_dir() and mine.is_file():
        same, shown_as = tokenizer_fingerprint(mine) == tokenizer_fingerprint(theirs), mine
    else:
        tokenizer = hf_model_tokenizer(model)  # a GGUF file's embedded tokenizer; None: the model has none
        if tokenizer is None:
            return
        same, shown_as = tokenizer_fingerprint(tokenizer) == tokenizer_fingerprint(theirs), f"the one inside {model}"
        if not same:
            mine_size, their_size = tokenizer.get_vocab_size(), data.tokenizer().get_vocab_size()
            shown_as = f"{shown_as}, {mine_size} tokens; the data's has {their_size}"
    if not same:
        raise GatedAttnError(f"{theirs} is not the tokenizer the model was trained with ({shown_as}); the token ids "
                             f"would mean other text. Use data prepared with the model's tokenizer, or pass --force")


def _check_outputs(args: argparse.Namespace) -> None:
    """Every output location can be written, before any work."""
    texts = getattr(args, "text", None) or []
    inputs = [("--model", getattr(args, "model", None)), ("--data", getattr(args, "data", None)),
              *(("--text", t) for t in (texts if isinstance(texts, list) else [texts]))]
    if args.out is not None:
        check_file_output(args.out, "--out", inputs)
    if getattr(args, "plots", None) is not None:
        check_writable(args.plots, "--plots", kind="dir")
        check_no_overlap(args.plots, "--plots", [(f, p) for f, p in inputs if p is not None])
    if getattr(args, "plot", None) is not None:
        check_file_output(args.plot, "--plot", inputs)


def _emit(args: argparse.Namespace, result: dict[str, Any], text: str) -> None:
    if args.out is not None:
        atomic_write_json(args.out, result)
    print(json.dumps(result) if args.json else text)


def _text_source(args: argparse.Namespace, cfg):
    """(the model's tokenizer, the ``TokenData`` of ``--data`` or None for ``--text``); the
    data is checked as ``_load`` checks it: val stream, tokenizer, vocabulary."""
    if args.text is not None:
        return model_tokenizer(args.model), None
    data = TokenData(_data_dir(args), verify=("val",))
    _check_same_tokenizer(Path(args.model), data, args.force)
    if data.vocab_size > cfg.vocab_size:
        raise GatedAttnError(
            f"the data's tokenizer has {data.vocab_size} tokens but the model's vocabulary has {cfg.vocab_size}; "
            f"prepare the data with the model's tokenizer (gatedattn data prepare --tokenizer ...)"
        )
    return data.tokenizer(), data


def _analysis_windows(args: argparse.Namespace, device="cpu"):
    """Everything ``analyze`` checks and builds before the weights are read: the model
    directory and config, the first token, the documents, the windows. Returns
    (windows (N, T+1), FirstToken, where the windows came from)."""
    if not Path(args.model).exists():  # a directory, or a GGUF file
        raise GatedAttnError(f"model directory not found: {args.model}")
    verify_model_dir(args.model)  # config, tokenizer and the manifest's other files (weights: as they are read)
    cfg = load_config(args.model)
    seq_len = args.seq_len or min(cfg.max_seq_len, MAX_DEFAULT_SEQ_LEN)
    _check_analysis_memory(args, cfg, seq_len, device)
    tokenizer, data = _text_source(args, cfg)
    first = resolve_first_token(args.first_token, cfg, tokenizer_bos=tokenizer_bos(args.model, tokenizer),
                                convention=tokenizer_convention(args.model, tokenizer))
    if data is not None:
        docs, source = val_documents(data), {"source": "data", "data": str(data.data_dir)}
    else:
        docs = tokenize_documents(tokenizer, text_documents(args.text))
        source = {"source": "text", "text": [str(p) for p in args.text]}
    windows = document_windows(docs, seq_len, args.batches * args.batch_size, first.id, seed=args.seed)
    return windows, first, {**source, "documents": len(docs), "seed": args.seed}


def _run_analyze(args: argparse.Namespace) -> int:
    if not 0.0 < args.eps < 1.0:
        raise GatedAttnError(f"--eps {args.eps}: the sink threshold is an attention weight, in (0, 1)")
    _check_outputs(args)
    with interruptible(_STOPPED):
        device = model_device(args.device)
        windows, first, source = _analysis_windows(args, device)
        model = load_any(args.model, device=device)
        result = analyze(model, windows.split(args.batch_size), layers_for_maps=args.layers, eps=args.eps,
                         first_token=first)
    result["model"] = str(args.model)
    result["data"] = source.get("data")
    result["windows"].update(source)
    if args.plots is not None:
        result["plots"] = [str(p) for p in _analysis_plots(result, Path(args.plots))]
    _emit(args, result, format_analysis(result))
    return 0


def _analysis_plots(r: AnalysisResult, out: Path) -> list[Path]:
    from gatedattn.analysis import plots  # lazy: heavy (matplotlib)

    name = r["variant"]
    paths = [
        plots.plot_per_layer({name: r["f_attn_per_layer"]}, out / "f_attn_per_layer.png",
                             ylabel="F-Attn", title="Attention on the first token"),
        plots.plot_per_layer({name: r["m_act_per_layer"]}, out / "m_act_per_layer.png",
                             ylabel="max |h|", title="Massive activation", log=True),
        plots.plot_first_token_map(r, out / "first_token_map.png"),
        plots.plot_sink_profile(r, out / "sink_profile.png"),
    ]
    if r["attention_maps"]:
        maps = {f"layer {i}": np.asarray(m, dtype=np.float64) for i, m in r["attention_maps"].items()}
        paths.append(plots.plot_attention_maps(maps, out / "attention_maps.png",
                                               title=f"{name}: head-averaged attention, first sequence"))
    if r["gate_histogram"] is not None:
        h = r["gate_histogram"]
        paths.append(plots.plot_gate_histograms({name: (h["edges"], h["counts"])}, out / "gate_histogram.png"))
    return paths


def _run_extrapolate(args: argparse.Namespace) -> int:
    _check_outputs(args)
    with interruptible(_STOPPED):
        model, data = _load(args)
        result = extrapolate(model, data, train_len=args.train_len, multiples=args.multiples, methods=args.methods,
                             tokens=args.tokens, batch_size=args.batch_size)
    result["model"] = str(args.model)
    result["data"] = str(data.data_dir)
    if args.plot is not None:
        from gatedattn.analysis import plots  # lazy: heavy (matplotlib)

        path = plots.plot_extrapolation({result["variant"]: extrapolation_curves(result)}, args.plot,
                                        result["train_len"])
        result["plot"] = str(path)
    _emit(args, result, format_extrapolation(result))
    return 0


def _first_token_arg(text: str) -> str | int:
    try:
        return parse_first_token(text)
    except GatedAttnError as e:
        raise argparse.ArgumentTypeError(str(e).split(": ", 1)[-1]) from None  # argparse names the flag


def _common(p: argparse.ArgumentParser, *, text: bool = False) -> None:
    p.add_argument("--model", required=True, metavar="DIR",
                   help="checkpoint directory (gatedattn format, or HF/official layouts via gatedattn.hf)")
    source = p.add_mutually_exclusive_group() if text else p
    source.add_argument("--data", default=None, metavar="DATA_DIR",
                        help="prepared data directory (default: the one recorded by the training run that wrote "
                             "--model)")
    if text:
        source.add_argument("--text", nargs="+", default=None, metavar="PATH",
                            help="raw text instead of --data: .txt/.md files (one document each) or a .jsonl with "
                                 "a 'text' field, tokenized with the model's own tokenizer.json")
    p.add_argument("--device", default="auto", help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--out", default=None, metavar="FILE", help="also write the JSON result to FILE")
    p.add_argument("--force", action="store_true",
                   help="use --data even when its tokenizer differs from the model's tokenizer.json")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "analyze",
        help="measure a checkpoint: F-Attn, attention sinks, massive activations, gate scores, val loss",
        description="Run a checkpoint with hooks attached over windows of one document each (the chosen "
                    "first token, then text; no separator inside) and report F-Attn (per layer and head), "
                    "Sink^eps, M-Act and the channels carrying it, the value drain and residual peak at the "
                    "first position, gate score statistics and loss (docs/design.md section 4).",
    )
    _common(p, text=True)
    p.add_argument("--first-token", type=_first_token_arg, default="auto", metavar="auto|bos|none|ID",
                   help="position 0 of every window: auto (what the model's tokenizer puts before text: its BOS "
                        "where it adds one, else none; default), bos (the model's own BOS), none (an ordinary "
                        "text token) or a token id")
    p.add_argument("--seq-len", type=_positive_int, default=None,
                   help=f"window length (default: the model's max_seq_len, at most {MAX_DEFAULT_SEQ_LEN})")
    p.add_argument("--batches", type=_positive_int, default=8, help="number of batches of windows (default 8)")
    p.add_argument("--batch-size", type=_positive_int, default=4, help="windows per batch (default 4)")
    p.add_argument("--seed", type=_non_negative_int, default=0,
                   help="which document stretches become windows when there are more than asked (default 0)")
    p.add_argument("--layers", type=_int_list, default=None,
                   help="layers whose attention map is returned, e.g. 0,3 (default: first, middle, last)")
    p.add_argument("--eps", type=float, default=0.3, help="sink threshold for Sink^eps (default 0.3)")
    p.add_argument("--plots", default=None, metavar="DIR",
                   help="also write per-layer, first-token map, sink profile, attention-map and gate-histogram "
                        "PNGs to DIR")
    p.set_defaults(func=_run_analyze, **input_options(("--model", "model"), ("--data", "data"), ("--text", "text")))

    p = subparsers.add_parser(
        "extrapolate",
        help="validation loss at multiples of the training length, plain RoPE vs NTK / YaRN",
        description="Validation loss at multiples of the training context with plain RoPE and with "
                    "RoPE scaling (factor = multiple, original length = training length).",
    )
    _common(p)
    p.add_argument("--train-len", type=_positive_int, default=None,
                   help="training context (default: the model's max_seq_len)")
    p.add_argument("--multiples", type=_number_list, default=[1, 2, 4, 8],
                   help="lengths as multiples of --train-len (default 1,2,4,8)")
    p.add_argument("--methods", type=_word_list, default=["plain", "ntk", "yarn"],
                   help="RoPE methods: plain, linear, ntk, yarn (default plain,ntk,yarn)")
    p.add_argument("--tokens", type=_positive_int, default=None,
                   help="tokens evaluated at every length (default: --batch-size windows of the longest length)")
    p.add_argument("--batch-size", type=_positive_int, default=4,
                   help="windows per forward pass at the longest length (default 4)")
    p.add_argument("--plot", default=None, metavar="FILE", help="also write a loss-vs-length PNG to FILE")
    p.set_defaults(func=_run_extrapolate, **input_options(("--model", "model"), ("--data", "data")))
