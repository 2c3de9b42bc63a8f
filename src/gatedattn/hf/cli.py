"""``gatedattn generate`` and ``gatedattn convert``.

``generate`` samples text from any importable model directory or GGUF file with the KV
cache; ``convert`` imports a directory (any supported format) or a GGUF file, optionally
retrofits a gate, and writes gatedattn's format (optionally with its modelling code) or a
transformers checkpoint (stock, Qwen3-Next or the paper's official layout), atomically,
with the tokenizer (a GGUF file's embedded one saved as ``tokenizer.json``).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch

from gatedattn.hf.export import export_hf, hf_config_for
from gatedattn.hf.gguf import gguf_file_of, gguf_hf_tokenizer, gguf_tokenizer
from gatedattn.hf.load import load_config, load_model, verify_model_dir
from gatedattn.hf.retrofit import add_gates
from gatedattn.infra.device import model_device
from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.inputs import input_options
from gatedattn.infra.integrity import check_finite, check_tokenizer, record, tokenizer_fingerprint
from gatedattn.infra.io import (argv_text, check_no_overlap, check_writable, discard_dir, interruptible, public_mode,
                                replace_dir, temp_dir_beside)
from gatedattn.infra.outputs import check_model_output
from gatedattn.infra.sizes import check_memory, kv_cache_bytes_per_token, model_params
from gatedattn.models.decode import is_backend

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja")
# --format -> export layout (gatedattn.hf.export.LAYOUTS); None: pick by the model
EXPORT_LAYOUTS = {"hf": None, "qwen3-next": "qwen3-next", "official": "official"}
FORMATS = ("gatedattn", *EXPORT_LAYOUTS)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# --------------------------------------------------------------------------- generate
def _load_tokenizer(path: Path):
    """A tokenizers ``Tokenizer`` with at least two tokens (:func:`gatedattn.infra.integrity.check_tokenizer`)."""
    if not path.is_file():
        raise GatedAttnError(f"tokenizer {path} is missing; pass --tokenizer PATH/tokenizer.json")
    return check_tokenizer(path)


def _check_tokenizer_matches(model_dir: Path, tokenizer: Path, force: bool) -> None:
    """A ``--tokenizer`` other than the model's own ``tokenizer.json`` (or a GGUF file's
    embedded tokenizer) must tokenize alike (vocabulary, merges, added tokens) unless ``force``."""
    if force:
        return
    gguf = gguf_file_of(model_dir)
    own = model_dir / "tokenizer.json"
    if gguf is not None:
        embedded = gguf_tokenizer(gguf)
        if embedded is None:
            return
        with tempfile.TemporaryDirectory() as d:
            own = Path(d) / "tokenizer.json"
            embedded.save(str(own))
            if tokenizer_fingerprint(own) != tokenizer_fingerprint(tokenizer):
                raise GatedAttnError(f"--tokenizer {tokenizer} is not the tokenizer embedded in {gguf}; pass --force "
                                     f"to use it")
        return
    if not own.is_file() or own.resolve() == tokenizer.resolve():
        return
    if tokenizer_fingerprint(own) != tokenizer_fingerprint(tokenizer):
        raise GatedAttnError(f"--tokenizer {tokenizer} is not the model's tokenizer ({own}); pass --force to use it")


def _model_tokenizer(model: Path, tokenizer: str | Path | None, force: bool):
    """The tokenizer ``generate`` uses: ``--tokenizer`` (checked against the model's own),
    else the model's ``tokenizer.json`` or a GGUF file's embedded tokenizer."""
    if tokenizer:
        tok = _load_tokenizer(Path(tokenizer))
        _check_tokenizer_matches(model, Path(tokenizer), force)
        return tok
    gguf = gguf_file_of(model)
    if gguf is None:
        return _load_tokenizer(model / "tokenizer.json")
    tok = gguf_tokenizer(gguf)
    if tok is None:
        raise GatedAttnError(f"{gguf} has no embedded tokenizer (no tokenizer.ggml.model); pass --tokenizer "
                             f"PATH/tokenizer.json")
    return tok


TEMPERATURE_RANGE = (1e-4, 1e4)  # beyond it logits / T overflows float32 (or sampling is uniform noise)


def generate_text(model_dir: str | Path, prompt: str, *, max_new_tokens: int | None = None, temperature: float = 0.8,
                  top_k: int | None = None, seed: int = 0, tokenizer: str | Path | None = None,
                  device: str = "cpu", force: bool = False, compile: str = "auto") -> str:
    """Prompt plus continuation, decoded. BOS is prepended when the model config has one.
    ``max_new_tokens`` (default: 64, or what the model's context leaves) must fit the context.
    ``compile``: ``auto``, ``on``, ``off`` or a ``torch.compile`` backend's name
    (``GatedLM.generate``'s ``compile``: ``on`` is True, ``off`` False)."""
    prompt = argv_text(prompt)  # UTF-8 bytes that a C locale decoded as surrogates
    _check_sampling(prompt, max_new_tokens, temperature, top_k, seed)
    compile_mode = _compile_mode(compile)
    model_dir = Path(model_dir)
    if not model_dir.is_dir() and gguf_file_of(model_dir) is None:
        raise GatedAttnError(f"--model {model_dir} is not a directory or a .gguf file (no model there)")
    dev = model_device(device)
    verify_model_dir(model_dir)  # the model's own tokenizer.json is checked with the rest
    cfg = load_config(model_dir)  # the sizes, checked before the weights are read
    _check_decoding_size(cfg, max_new_tokens, dev)
    tok = _model_tokenizer(model_dir, tokenizer, force)
    model = load_model(model_dir, device=dev)
    cfg = model.cfg
    tok.encode_special_tokens = True  # as data prepare encodes: "<|eos|>" typed in a prompt is text, not the id
    ids = tok.encode(prompt, add_special_tokens=False).ids
    if cfg.bos_token_id is not None:
        ids = [cfg.bos_token_id] + ids
    if not ids:
        raise GatedAttnError("the prompt is empty and the model has no bos_token_id to start from")
    context = getattr(cfg, "max_seq_len", None)
    if max_new_tokens is None:
        max_new_tokens = 64 if context is None else max(0, min(64, context - len(ids)))
    if context is not None and len(ids) + max_new_tokens > context:
        raise GatedAttnError(f"--max-new-tokens {max_new_tokens}: the prompt ({len(ids)} tokens) plus the new tokens "
                             f"exceed the model's context of {context} tokens")
    bad = [i for i in ids if i >= cfg.vocab_size]
    if bad:
        raise GatedAttnError(f"the tokenizer produced id {bad[0]} but the model's vocab_size is {cfg.vocab_size}; "
                             f"wrong tokenizer?")
    generator = torch.Generator(device=dev).manual_seed(seed)
    out = model.generate(torch.tensor([ids], device=dev), max_new_tokens, temperature=temperature, top_k=top_k,
                         generator=generator, use_cache=True, eos_token_id=cfg.eos_token_id, compile=compile_mode)
    start = 1 if cfg.bos_token_id is not None else 0
    return tok.decode(out[0, start:].tolist(), skip_special_tokens=True)


def _compile_mode(compile: str) -> bool | str:
    """``--compile`` as ``GatedLM.generate`` takes it, or one line naming the allowed values."""
    modes = {"on": True, "off": False, "auto": "auto"}
    if compile in modes:
        return modes[compile]
    if is_backend(compile):
        return compile
    raise GatedAttnError(f"--compile {compile}: allowed: auto (compile where the new tokens pay for it), on, off, "
                         f"or the name of a torch.compile backend (e.g. inductor, aot_eager)")


def _check_decoding_size(cfg, max_new_tokens: int | None, device) -> None:
    """``--max-new-tokens`` within the model's context and, with the weights, its KV cache
    (every layer's keys and values for each new position) within the memory of ``device``."""
    if max_new_tokens is None:
        return
    context = getattr(cfg, "max_seq_len", None)
    if context is not None and max_new_tokens > context:
        raise GatedAttnError(f"--max-new-tokens {max_new_tokens} exceeds the model's context of {context} tokens")
    check_memory("decoding", {"weights": 4 * model_params(cfg),
                              "KV cache": kv_cache_bytes_per_token(cfg) * (max_new_tokens + 1)},
                 {"--max-new-tokens": max_new_tokens}, device)


def _check_sampling(prompt: str, max_new_tokens: int | None, temperature: float, top_k: int | None,
                    seed: int) -> None:
    """The sampling options and the prompt, before anything is loaded."""
    if max_new_tokens is not None and max_new_tokens < 0:
        raise GatedAttnError(f"--max-new-tokens {max_new_tokens} must be >= 0")
    lo, hi = TEMPERATURE_RANGE
    if not math.isfinite(temperature) or not (temperature == 0 or lo <= temperature <= hi):
        raise GatedAttnError(f"--temperature {temperature} must be 0 (greedy) or in [{lo:g}, {hi:g}]")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise GatedAttnError(f"--prompt is not valid UTF-8 text (byte {prompt[e.start]!r} at {e.start}); "
                             f"give the prompt as UTF-8") from None
    if top_k is not None and top_k < 1:
        raise GatedAttnError(f"--top-k {top_k} must be >= 1")
    if not 0 <= seed < 2**63:
        raise GatedAttnError(f"--seed {seed} must be an integer in [0, 2**63)")


def _generate(args: argparse.Namespace) -> int:
    print(generate_text(args.model, args.prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                        top_k=args.top_k, seed=args.seed, tokenizer=args.tokenizer, device=args.device,
                        force=args.force, compile=args.compile))
    return 0


# --------------------------------------------------------------------------- convert
def _is_nonempty(path: Path) -> bool:
    return path.exists() and (not path.is_dir() or any(path.iterdir()))


def _add_file(src: Path, dst_dir: Path) -> None:
    """Copy ``src`` into ``dst_dir`` (public mode) and enter it in its manifest."""
    shutil.copy2(src, dst_dir / src.name)
    public_mode(dst_dir / src.name)
    record(dst_dir / src.name)


def _save_tokenizer(tok, dst: Path) -> None:
    """A transformers tokenizer (a GGUF file's embedded one) written into ``dst`` as
    transformers saves it: those of ``TOKENIZER_FILES`` it writes (``tokenizer.json``,
    ``tokenizer_config.json``, the chat template), each recorded."""
    with tempfile.TemporaryDirectory() as d:
        tok.save_pretrained(d)
        for name in TOKENIZER_FILES:
            if (Path(d) / name).is_file():
                _add_file(Path(d) / name, dst)


def _write_tokenizer(src: Path, gguf_tok, dst: Path, fmt: str) -> None:
    """The tokenizer beside the converted model: a GGUF file's embedded one (``gguf_tok``)
    saved, or the source directory's tokenizer files (and, for a transformers format, its
    ``generation_config.json``) copied; each recorded in the manifest."""
    if gguf_tok is not None:
        _save_tokenizer(gguf_tok, dst)
        return
    extra = TOKENIZER_FILES + (("generation_config.json",) if fmt != "gatedattn" else ())
    for name in extra:
        if (src / name).is_file():
            _add_file(src / name, dst)


def _check_convert_options(fmt: str, save_code: bool, dtype: str) -> None:
    if fmt not in FORMATS:
        raise GatedAttnError(f"--format {fmt!r} is not allowed; choose one of {', '.join(FORMATS)}")
    if not isinstance(save_code, bool):
        raise GatedAttnError(f"convert: save_code must be True or False, got {save_code!r}")
    if dtype not in DTYPES:
        raise GatedAttnError(f"--dtype {dtype!r} is not allowed; choose one of {', '.join(DTYPES)}")


def convert(src: str | Path, dst: str | Path, *, variant: str | None = None, init: str = "identity",
            fmt: str = "gatedattn", force: bool = False, dtype: str = "float32", seed: int = 0,
            save_code: bool = True, self_contained: bool | None = None) -> Path:
    """Import ``src`` (a model directory or a GGUF file), optionally add the gate of
    ``variant``, write ``dst`` atomically (a temporary directory beside it, renamed into
    place). Tokenizer files are copied; a GGUF file's embedded tokenizer is saved as
    ``tokenizer.json`` (with ``tokenizer_config.json``), so ``dst`` is self-sufficient.

    ``fmt``: ``gatedattn`` (any variant; with ``save_code``, the default, the modelling
    code is written beside the weights, as every save writes it), ``hf`` (stock
    Qwen3/Llama/Qwen2 for a gate-free model, Qwen3-Next for a ``gated`` one),
    ``qwen3-next`` or ``official`` (the paper's layout), which run on transformers' own
    code and carry none. ``self_contained`` is the old name of ``save_code``."""
    if self_contained is not None:
        warnings.warn("convert(self_contained=...) is now save_code=... (and the modelling code is written by "
                      "default)", DeprecationWarning, stacklevel=2)
        save_code = self_contained
    if os.fspath(dst) == "" or os.fspath(src) == "":
        raise GatedAttnError(f"{'--to' if os.fspath(dst) == '' else '--from'}: an empty path; give a directory")
    src, dst = Path(src), Path(dst)
    _check_convert_options(fmt, save_code, dtype)
    check_no_overlap(dst, "--to", [("--from", src)])
    if _is_nonempty(dst) and not force:
        raise GatedAttnError(f"--to {dst} exists and is not empty; pass --force to replace it")
    check_writable(dst, "--to", kind="dir")
    check_model_output(dst, "--to")  # never a checkpoint, a run's final/ or a directory of others' files
    gguf = gguf_file_of(src)
    if gguf is None and not src.is_dir():
        raise GatedAttnError(f"--from {src} is not a directory or a .gguf file (no model there)")
    model = load_model(src)  # verified: config, weights and tokenizer against its checksums.json
    gguf_tok = gguf_hf_tokenizer(gguf) if gguf is not None else None  # built before anything is written
    if variant is not None:
        torch.manual_seed(seed)
        add_gates(model, variant, init)
    model = model.to(DTYPES[dtype])
    layout = EXPORT_LAYOUTS.get(fmt)
    if fmt != "gatedattn":
        hf_config_for(model.cfg, layout)  # refuses (before writing anything) what the layout cannot express
    check_finite(model.state_dict(), f"the converted model ({dtype})")  # e.g. a float16 cast that overflowed
    tmp = temp_dir_beside(dst)  # a killed earlier convert's temporaries are removed here
    try:
        if fmt != "gatedattn":
            export_hf(model, tmp, layout)
        else:
            model.save_pretrained(tmp, save_code=save_code)
        _write_tokenizer(src, gguf_tok, tmp, fmt)
        replace_dir(tmp, dst)
    except BaseException:
        discard_dir(tmp)
        raise
    return dst


def _convert(args: argparse.Namespace) -> int:
    if args.init is not None and args.variant is None:
        raise GatedAttnError("--init needs --variant (it initialises the added gate)")
    if args.no_code and args.self_contained:
        raise GatedAttnError("--no-code and --self-contained contradict each other; give one (the code is written "
                             "by default)")
    for flag, given in (("--no-code", args.no_code), ("--self-contained", args.self_contained)):
        if given and args.format != "gatedattn":
            raise GatedAttnError(f"{flag} applies to --format gatedattn only ({args.format} checkpoints run on "
                                 f"transformers' own code and carry none)")
    save_code = not args.no_code
    stopped = (f"stopped before --to {args.to} was written (the partial copy beside it is removed; an earlier "
               f"--to is kept as it was); run the same command again")
    with interruptible(stopped):
        dst = convert(args.from_dir, args.to, variant=args.variant, init=args.init or "identity", fmt=args.format,
                      force=args.force, dtype=args.dtype, seed=args.seed, save_code=save_code)
    extra = {True: ", with its modelling code: loads with trust_remote_code=True where gatedattn is not installed",
             False: ", without modelling code: loads where gatedattn is installed"}
    print(f"wrote {dst} ({args.format} format{extra[save_code] if args.format == 'gatedattn' else ''})")
    return 0


# --------------------------------------------------------------------------- registration
def register(sub) -> None:
    g = sub.add_parser("generate", help="sample text from a model directory (gatedattn or HF format), KV-cached",
                       description="Sample a continuation of --prompt. The tokenizer is DIR/tokenizer.json unless "
                                   "--tokenizer is given; BOS is prepended when the model config has one.")
    g.add_argument("--model", required=True, metavar="DIR",
                   help="gatedattn or importable HF model directory, or a .gguf file (its tokenizer is embedded)")
    g.add_argument("--prompt", required=True, metavar="TEXT")
    g.add_argument("--max-new-tokens", type=int, default=None, metavar="N",
                   help="tokens to sample (default 64, or fewer where the model's context ends)")
    g.add_argument("--temperature", type=float, default=0.8, metavar="T", help="0 is greedy (default 0.8)")
    g.add_argument("--top-k", type=int, default=None, metavar="K")
    g.add_argument("--seed", type=int, default=0, metavar="S")
    g.add_argument("--tokenizer", default=None, metavar="PATH", help="tokenizer.json (default DIR/tokenizer.json)")
    g.add_argument("--device", default="cpu", help="torch device (default cpu)")
    g.add_argument("--force", action="store_true", help="use a --tokenizer other than the model's tokenizer.json")
    g.add_argument("--compile", default="auto", metavar="MODE",
                   help="auto (default: one compiled decoding step over a static cache from 4,096 new tokens, "
                        "where the compile pays for itself), on, off, or a torch.compile backend's name")
    g.set_defaults(func=_generate, **input_options(("--model", "model"), ("--tokenizer", "tokenizer")))

    c = sub.add_parser("convert", help="import a model directory, optionally add a gate, save it (atomically)",
                       description="Import --from (gatedattn, Qwen3, Llama, Qwen2 or official gated-attention "
                                   "checkpoint), optionally retrofit the gate of --variant, and write --to in "
                                   "gatedattn format (with the modelling code and its auto_map, loadable with "
                                   "trust_remote_code=True where gatedattn is not installed, as every save "
                                   "writes it; --no-code leaves it out) or as a transformers "
                                   "checkpoint: --format hf (stock Qwen3/Llama/Qwen2 for a gate-free model, "
                                   "Qwen3-Next for a 'gated' one), qwen3-next, or official (the paper's gated "
                                   "Qwen3 layout).")
    c.add_argument("--from", dest="from_dir", required=True, metavar="DIR",
                   help="model directory, or a .gguf file (llama, qwen2, qwen3)")
    c.add_argument("--to", required=True, metavar="DIR")
    c.add_argument("--variant", default=None, metavar="NAME", help="retrofit this gate preset (see `gatedattn variants`)")
    c.add_argument("--init", choices=("identity", "random"), default=None,
                   help="gate init: identity keeps the model's function (default), random does not")
    c.add_argument("--format", choices=FORMATS, default="gatedattn",
                   help="gatedattn (any variant); hf (stock Qwen3/Llama/Qwen2 for a gate-free model, Qwen3-Next "
                        "for a 'gated' one); qwen3-next; official (gated / gated-headwise in the paper's layout)")
    c.add_argument("--no-code", action="store_true",
                   help="with --format gatedattn: write the weights and config without the modelling code and its "
                        "auto_map (the directory then loads only where gatedattn is installed)")
    c.add_argument("--self-contained", action="store_true",
                   help="with --format gatedattn: write the modelling code (the default; kept for scripts that "
                        "pass it)")
    c.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    c.add_argument("--seed", type=int, default=0, help="seed for --init random")
    c.add_argument("--force", action="store_true",
                   help="replace an earlier output of convert at --to (a directory with checksums.json; never "
                        "another directory, nor --from)")
    c.set_defaults(func=_convert, **input_options(("--from", "from_dir")))
