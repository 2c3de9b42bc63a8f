"""Every bad invocation, of every command and of the Python API, is refused before any work:
a non-zero exit, one line on stderr, no traceback and no new file.

The cases run in-process through ``gatedattn.cli.main`` on tiny fixtures (a 300-token
vocabulary, a micro model trained for two steps), so the whole table takes seconds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from gatedattn.cli import main
from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.integrity import record

WORDS = "the gate sink softmax token layer head query key value attention model loss".split()


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> dict[str, Path]:
    """Tiny inputs, good and damaged: data directories, a trained model directory, files."""
    from gatedattn.data.prepare import prepare
    from gatedattn.train import TrainConfig, train

    root = tmp_path_factory.mktemp("fixtures")
    rng = random.Random(0)
    texts = root / "texts"
    texts.mkdir()
    for i in range(12):
        (texts / f"d{i}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(120)))
    data = root / "data"
    prepare([str(texts)], data, vocab_size=300, val_fraction=0.25, progress=False)
    run = root / "run"
    train(TrainConfig(data_dir=str(data), out_dir=str(run), preset="micro", variant="gated", seq_len=16,
                      micro_batch=2, steps=2, warmup_steps=1, eval_batches=1, progress=False, tensorboard=False,
                      dtype="fp32", device="cpu"))
    model = run / "final"
    f = {"root": root, "texts": texts, "data": data, "run": run, "model": model}

    def copy(src: Path, name: str) -> Path:
        dst = root / name
        shutil.copytree(src, dst)
        return dst

    # data: one bit flipped in train.bin; a manifest vocabulary below the largest id;
    # a garbage tokenizer.json; a tokenizer of another corpus
    flipped = copy(data, "data_flipped")
    b = bytearray((flipped / "train.bin").read_bytes())
    b[10] ^= 0x01
    (flipped / "train.bin").write_bytes(bytes(b))
    small_vocab = copy(data, "data_small_vocab")
    m = json.loads((small_vocab / "manifest.json").read_text())
    (small_vocab / "manifest.json").write_text(json.dumps({**m, "vocab_size": 270}))
    garbage_tok = copy(data, "data_garbage_tok")
    (garbage_tok / "tokenizer.json").write_text("{ not a tokenizer")
    other_texts = root / "other_texts"
    other_texts.mkdir()
    for i in range(4):
        (other_texts / f"a{i}.txt").write_text(" ".join(rng.choice(["zebra", "quartz", "violin", "nebula"])
                                                         for _ in range(200)))
    other = root / "data_other_tok"
    prepare([str(other_texts)], other, vocab_size=300, val_fraction=0.3, progress=False)
    f.update(flipped=flipped, small_vocab=small_vocab, garbage_tok=garbage_tok, other=other)

    # models: one bit flipped in the weights (0.018 -> 6e36 style); a non-finite weight
    # with a matching checksum; config.json with a wrong field type; 1-token tokenizer
    bad_w = copy(model, "model_flipped")
    b = bytearray((bad_w / "model.safetensors").read_bytes())
    b[-2] ^= 0x40
    (bad_w / "model.safetensors").write_bytes(bytes(b))
    inf_w = copy(model, "model_inf")
    state = load_file(inf_w / "model.safetensors")
    name = next(k for k in state if k.endswith("weight"))
    state[name][0, 0] = float("inf") if state[name].dim() > 1 else float("inf")
    save_file(state, inf_w / "model.safetensors", metadata={"format": "pt"})
    record(inf_w / "model.safetensors")
    bad_cfg = copy(model, "model_bad_config")
    cfg = json.loads((bad_cfg / "config.json").read_text())
    (bad_cfg / "config.json").write_text(json.dumps({**cfg, "n_layers": "two"}))
    record(bad_cfg / "config.json")
    one_tok = root / "one_token.json"
    tok = json.loads((model / "tokenizer.json").read_text())
    tok["model"]["vocab"] = {"a": 0}
    tok["model"]["merges"] = []
    tok["added_tokens"] = []
    one_tok.write_text(json.dumps(tok))
    (root / "a_file").write_text("x")
    (root / "existing.png").write_text("x")
    nonempty = root / "nonempty"
    nonempty.mkdir()
    (nonempty / "keep").write_text("x")
    f.update(bad_w=bad_w, inf_w=inf_w, bad_cfg=bad_cfg, one_tok=one_tok, file=root / "a_file",
             png=root / "existing.png", nonempty=nonempty)
    f.update(_outputs(root, model, copy))
    f.update(_damaged_models(root, model, copy))
    f.update(_damaged_data(root, data, texts, copy))
    f.update(_damaged_runs(root, run, copy))
    return f


def _outputs(root: Path, model: Path, copy) -> dict[str, Path]:
    """Paths an output may not be: a FIFO, a model directory with a file of the user's, a
    study directory of the user's own report."""
    import os

    fifo = root / "a_fifo"
    os.mkfifo(fifo)
    os.mkfifo(root / "fifo.txt")  # an input with a text file's name: never opened (it would block)
    (root / "loop_a.txt").symlink_to(root / "loop_b.txt")
    (root / "loop_b.txt").symlink_to(root / "loop_a.txt")
    user_file = copy(model, "model_with_user_file")
    (user_file / "notes.md").write_text("mine")
    foreign = root / "foreign_study"
    foreign.mkdir()
    (foreign / "report.md").write_text("my own report")
    (foreign / "results.json").write_text("{}")
    (root / "to_stdout.json").symlink_to("/proc/self/fd/1")  # an output there would replace the link
    other = root / "mechanism_study"  # another study's output, marker and all
    other.mkdir()
    (other / ".gatedattn-study").write_text('{"command": "reproduce", "study": "mechanism"}\n')
    (other / "results.json").write_text('{"study": "mechanism"}')
    (other / "report.md").write_text("the mechanism study's report")
    return dict(fifo=fifo, model_user_file=user_file, foreign_study=foreign, other_study=other)


def _rotate_merges(path: Path) -> None:
    """Another tokenizer of the same size: the same vocabulary, the merges in another order."""
    tok = json.loads(path.read_text())
    merges = tok["model"]["merges"]
    tok["model"]["merges"] = merges[1:] + merges[:1]
    path.write_text(json.dumps(tok))


def _flip(path: Path, pos: int) -> None:
    b = bytearray(path.read_bytes())
    b[pos] ^= 0x01
    path.write_bytes(bytes(b))


def _edit_config(d: Path, change, keep_manifest: bool) -> Path:
    cfg = json.loads((d / "config.json").read_text())
    change(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    if keep_manifest:
        record(d / "config.json")
    else:
        (d / "checksums.json").unlink()
    return d


def _damaged_models(root: Path, model: Path, copy) -> dict[str, Path]:
    """Model directories in gatedattn and HF format, each damaged in one way."""
    from gatedattn.hf.cli import convert

    hf = convert(model, root / "hf", fmt="hf")
    hf_flipped = copy(hf, "hf_flipped")
    _flip(hf_flipped / "model.safetensors", -3)
    hf_unlisted = copy(hf, "hf_unlisted_config")
    sums = json.loads((hf_unlisted / "checksums.json").read_text())
    sums.pop("config.json", None)  # (unlisted either way)
    (hf_unlisted / "checksums.json").write_text(json.dumps(sums))
    hf_inf = copy(hf, "hf_inf")
    state = load_file(hf_inf / "model.safetensors")
    state["model.embed_tokens.weight"][1, 1] = float("inf")
    save_file(state, hf_inf / "model.safetensors", metadata={"format": "pt"})
    record(hf_inf / "model.safetensors")
    hf_int8 = copy(hf, "hf_int8")
    state = load_file(hf_int8 / "model.safetensors")
    state["model.norm.weight"] = state["model.norm.weight"].to(torch.int8)
    save_file(state, hf_int8 / "model.safetensors", metadata={"format": "pt"})
    record(hf_int8 / "model.safetensors")
    int32 = copy(model, "model_int32")
    state = load_file(int32 / "model.safetensors")
    state["norm.weight"] = state["norm.weight"].to(torch.int32)
    save_file(state, int32 / "model.safetensors", metadata={"format": "pt"})
    record(int32 / "model.safetensors")
    sums_dir = copy(model, "model_checksums_dir")
    (sums_dir / "checksums.json").unlink()
    (sums_dir / "checksums.json").mkdir()
    tok_swapped = copy(model, "model_tok_swapped")
    _rotate_merges(tok_swapped / "tokenizer.json")
    deep = copy(model, "model_deep_config")
    (deep / "config.json").write_text("[" * 50000 + "]" * 50000)
    (deep / "checksums.json").unlink()
    deep_obj = copy(model, "model_deep_object")
    (deep_obj / "config.json").write_text('{"a":' * 300 + "1" + "}" * 300)
    record(deep_obj / "config.json")
    att = _edit_config(copy(model, "model_attention_str"), lambda c: c.update(attention="gated"), True)
    big = _edit_config(copy(model, "model_vocab_1e12"), lambda c: c.update(vocab_size=10**12), True)
    layers = _edit_config(copy(model, "model_layers_1e12"), lambda c: c.update(n_layers=10**12), False)
    sizes = {name: _edit_config(copy(model, f"model_{name}"), change, True) for name, change in [
        ("vocab_5e7", lambda c: c.update(vocab_size=5 * 10**7)),
        ("layers_1e5", lambda c: c.update(n_layers=10**5)),
        ("head_dim_1e6", lambda c: c["attention"].update(head_dim=10**6)),
        ("heads_1e6", lambda c: c["attention"].update(n_heads=10**6, n_kv_heads=10**6)),
        ("learned_1e12", lambda c: c.update(max_seq_len=10**12, position_embedding="learned")),
    ]}
    rope = _edit_config(copy(hf, "hf_rope_abc"), lambda c: c["rope_parameters"].update(rope_theta="abc"), False)
    wm = copy(hf, "hf_weight_map_int")
    (wm / "checksums.json").unlink()
    names = list(load_file(wm / "model.safetensors"))
    (wm / "model.safetensors").rename(wm / "shard.safetensors")
    (wm / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: 5 for n in names}}))
    return dict(hf=hf, hf_flipped=hf_flipped, hf_unlisted=hf_unlisted, hf_inf=hf_inf, hf_int8=hf_int8,
                model_int32=int32, sums_dir=sums_dir, tok_swapped=tok_swapped, deep_cfg=deep, deep_obj=deep_obj,
                att_str=att, big_vocab=big, big_layers=layers, rope_abc=rope, wm_int=wm, **sizes)


def _damaged_data(root: Path, data: Path, texts: Path, copy) -> dict[str, Path]:
    """Data directories damaged in one way, and inputs that overlap outputs."""
    data_tok = copy(data, "data_tok_swapped")
    _rotate_merges(data_tok / "tokenizer.json")
    val_flipped = copy(data, "data_val_flipped")
    _flip(val_flipped / "val.bin", 7)
    deep = copy(data, "data_deep_manifest")
    (deep / "manifest.json").write_text("[" * 50000 + "]" * 50000)
    deep_tok = copy(data, "data_deep_tokenizer")
    (deep_tok / "tokenizer.json").write_text('{"model": ' * 20000 + "1" + "}" * 20000)
    nest = root / "nest"
    shutil.copytree(texts, nest / "docs")
    (root / "texts_link").symlink_to(texts, target_is_directory=True)
    mixed = root / "mixed"
    mixed.mkdir()
    for name in ("d0.txt", "d1.txt"):
        shutil.copy(texts / name, mixed / name)
    (mixed / "more.jsonl").write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(4)))
    return dict(data_tok=data_tok, val_flipped=val_flipped, deep_manifest=deep, deep_tok=deep_tok, nest=nest,
                texts_link=root / "texts_link", mixed=mixed)


def _damaged_runs(root: Path, run: Path, copy) -> dict[str, Path]:
    """Run directories whose latest checkpoint is damaged (with matching checksums)."""
    from gatedattn.train.checkpoint import latest_checkpoint

    info_list = copy(run, "run_info_list")
    ckpt = latest_checkpoint(info_list)
    (ckpt / "checkpoint.json").write_text("[1, 2]")
    record(ckpt / "checkpoint.json")
    state_keys = copy(run, "run_state_keys")
    ckpt = latest_checkpoint(state_keys)
    state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
    del state["rng"], state["optimizer"]
    torch.save(state, ckpt / "trainer_state.pt")
    record(ckpt / "trainer_state.pt")
    deep = copy(run, "run_deep_config")
    (deep / "config.json").write_text("[" * 50000 + "]" * 50000)
    no_manifest = copy(run, "run_no_manifest")
    ckpt = latest_checkpoint(no_manifest)
    (ckpt / "checksums.json").unlink()
    _flip(ckpt / "model.safetensors", -3)

    def weights_of(name: str, **identity: str) -> Path:
        """The latest checkpoint's weights as another run's or step's (metadata changed), manifest re-signed."""
        d = copy(run, name)
        path = latest_checkpoint(d) / "model.safetensors"
        with safe_open(path, "pt") as f:
            meta = f.metadata()
        save_file(load_file(path), path, metadata={**meta, **{f"gatedattn.{k}": v for k, v in identity.items()}})
        record(path)
        return d

    other_run = weights_of("run_other_seed_weights", run="0" * 64)
    earlier = weights_of("run_earlier_step_weights", step="1")
    return dict(run_info_list=info_list, run_state_keys=state_keys, run_deep=deep, run_no_manifest=no_manifest,
                run_other_weights=other_run, run_earlier_weights=earlier)


TRAIN_FAST = ["--preset", "micro", "--set", "seq_len=16", "--set", "micro_batch=2", "--set", "steps=2",
              "--set", "warmup_steps=1", "--set", "progress=false", "--set", "eval_batches=1",
              "--set", "tensorboard=false", "--set", "dtype=fp32"]

# --set values that are wrong for their key: (key, value)
BAD_SETS = [
    ("seq_len", "0"), ("seq_len", "-3"), ("seq_len", "1.5"), ("seq_len", "many"), ("micro_batch", "0"),
    ("grad_accum", "0"), ("steps", "0"), ("steps", "x"), ("max_tokens", "0"), ("lr", "0"), ("lr", "-1"),
    ("lr", "nan"), ("lr", "inf"), ("min_lr_ratio", "2"), ("min_lr_ratio", "-0.1"), ("warmup_steps", "-1"),
    ("warmup_steps", "5"), ("schedule", "step"), ("weight_decay", "-1"), ("betas", "0.9"), ("betas", "1.0,0.9"),
    ("betas", "a,b"), ("eps", "0"), ("grad_clip", "-1"), ("optimizer", "sgd"), ("muon_momentum", "1"),
    ("dtype", "fp8"), ("compile", "maybe"), ("device", "tpu"), ("seed", "-1"), ("seed", "1e30x"),
    ("eval_every", "-1"), ("eval_batches", "0"), ("ckpt_every", "-2"), ("keep_checkpoints", "-1"),
    ("log_every", "0"), ("skip_nonfinite", "2"), ("spike_margin", "0"), ("spike_window", "0"),
    ("diverge_factor", "1"), ("overfit_batches", "-1"), ("stop_at_step", "0"), ("fsdp", "yes-please"),
    ("progress", "sometimes"), ("tensorboard", "3"), ("model.n_layers", "0"), ("model.ffn_dim", "-4"),
    ("model.max_seq_len", "8"), ("model.tie_embeddings", "perhaps"), ("model.norm_eps", "x"),
    ("attention.kv", "kvq"), ("attention.kernel", "magic"), ("gate.activation", "relu6x"),
    ("gate.position", "g9"), ("gate.granularity", "pixel"), ("rope.theta", "-1"), ("rope.fraction", "2"),
    ("rope.scaling", "linearish"), ("rope.factor", "0.5"),
    # a run's identity comes from its flags only
    ("out_dir", "elsewhere"), ("data_dir", "elsewhere"), ("variant", "gated"), ("model.size", "small"),
    # not keys at all
    ("learning_rate", "1"), ("model.nope", "1"), ("", "1"),
]


def train_cases(f):
    d, out = str(f["data"]), str(f["root"] / "new_run")
    base = ["train", "--data", d, "--out", out, *TRAIN_FAST]
    cases = [(f"train --set {k}={v}", [*base, "--set", f"{k}={v}" if k else "=1"]) for k, v in BAD_SETS]
    cases += [
        ("train --set without =", [*base, "--set", "lr"]),
        ("train unknown variant", [*base, "--variant", "gatd"]),
        ("train unknown preset", [*base, "--preset", "huge"]),
        ("train no --data", ["train", "--out", out]),
        ("train no --out", ["train", "--data", d]),
        ("train missing data", ["train", "--data", str(f["root"] / "nope"), "--out", out, *TRAIN_FAST]),
        ("train data is a file", ["train", "--data", str(f["file"]), "--out", out, *TRAIN_FAST]),
        ("train flipped train.bin", ["train", "--data", str(f["flipped"]), "--out", out, *TRAIN_FAST]),
        ("train manifest vocab below ids", ["train", "--data", str(f["small_vocab"]), "--out", out, *TRAIN_FAST]),
        ("train garbage tokenizer", ["train", "--data", str(f["garbage_tok"]), "--out", out, *TRAIN_FAST]),
        ("train out under a file", ["train", "--data", d, "--out", str(f["file"] / "run"), *TRAIN_FAST]),
        ("train out is a file", ["train", "--data", d, "--out", str(f["file"]), *TRAIN_FAST]),
        ("train out not UTF-8", ["train", "--data", d, "--out", os.fsdecode(os.fsencode(str(f["root"])) + b"/r\xff"),
                                 *TRAIN_FAST]),
        ("train out not a run", ["train", "--data", d, "--out", str(f["nonempty"]), *TRAIN_FAST]),
        ("train out holds a run", ["train", "--data", d, "--out", str(f["run"]), *TRAIN_FAST]),
        ("train seq_len beyond data", [*base, "--set", "seq_len=100000"]),
        ("train --resume missing dir", ["train", "--resume", str(f["root"] / "nope")]),
        ("train --resume not a run", ["train", "--resume", str(f["nonempty"])]),
        ("train --resume with other --out", ["train", "--resume", str(f["run"]), "--out", out]),
        ("train --resume other variant", ["train", "--resume", str(f["run"]), "--variant", "baseline"]),
        ("train --resume other model", ["train", "--resume", str(f["run"]), "--set", "model.n_layers=3"]),
        ("train --resume other lr", ["train", "--resume", str(f["run"]), "--set", "lr=0.5"]),
        ("train swapped data tokenizer", ["train", "--data", str(f["data_tok"]), "--out", out, *TRAIN_FAST]),
        ("train micro_batch 1e12", [*base, "--set", "micro_batch=1000000000000"]),
        ("train grad_accum 1e12", [*base, "--set", "grad_accum=1000000000000"]),
        ("train n_layers 1e12", [*base, "--set", "model.n_layers=1000000000000"]),
        ("train ffn_dim 1e12", [*base, "--set", "model.ffn_dim=1000000000000"]),
        ("train spike_window 1e20", [*base, "--set", "spike_window=100000000000000000000"]),
        ("train seed 2**64", [*base, "--set", f"seed={2**64}"]),
        ("train out inside data", ["train", "--data", d, "--out", str(f["data"] / "run"), *TRAIN_FAST]),
        ("train --resume checkpoint.json a list", ["train", "--resume", str(f["run_info_list"])]),
        ("train --resume state without rng", ["train", "--resume", str(f["run_state_keys"])]),
        ("train --resume deep config.json", ["train", "--resume", str(f["run_deep"])]),
        ("train deep data tokenizer", ["train", "--data", str(f["deep_tok"]), "--out", out, *TRAIN_FAST]),
        ("train --resume checkpoint without checksums.json", ["train", "--resume", str(f["run_no_manifest"])]),
        ("train --resume another run's weights", ["train", "--resume", str(f["run_other_weights"])]),
        ("train --resume an earlier step's weights", ["train", "--resume", str(f["run_earlier_weights"])]),
    ]
    return cases


def sweep_cases(f):
    d, out = str(f["data"]), str(f["root"] / "new_sweep")
    base = ["sweep", "--data", d, "--out", out, *TRAIN_FAST]
    return [
        ("sweep bad lr", [*base, "--variants", "gated", "--lr", "x"]),
        ("sweep empty lr", [*base, "--variants", "gated", "--lr", ""]),
        ("sweep zero lr", [*base, "--variants", "gated", "--lr", "0"]),
        ("sweep bad variant", [*base, "--variants", "gated,nope", "--lr", "1e-3"]),
        ("sweep negative seed", [*base, "--variants", "gated", "--lr", "1e-3", "--seeds", "-1"]),
        ("sweep --set seed with --seeds", [*base, "--variants", "gated", "--lr", "1e-3", "--seeds", "1,2",
                                           "--set", "seed=5"]),
        ("sweep --set lr", [*base, "--variants", "gated", "--lr", "1e-3", "--set", "lr=3e-3"]),
        ("sweep --set variant", [*base, "--variants", "gated", "--lr", "1e-3", "--set", "variant=baseline"]),
        ("sweep --set out_dir", [*base, "--variants", "gated", "--lr", "1e-3", "--set", "out_dir=x"]),
        ("sweep out under a file", ["sweep", "--data", d, "--out", str(f["file"] / "s"), *TRAIN_FAST,
                                    "--variants", "gated", "--lr", "1e-3"]),
        ("sweep missing data", ["sweep", "--data", str(f["root"] / "nope"), "--out", out, *TRAIN_FAST,
                                "--variants", "gated", "--lr", "1e-3"]),
        ("sweep --resume DIR", [*base, "--variants", "gated", "--lr", "1e-3", "--resume", str(f["run"])]),
        ("sweep no --variants", [*base, "--lr", "1e-3"]),
        ("sweep lrs printing alike", [*base, "--variants", "gated", "--lr", "0.001,0.0010000001"]),
        ("sweep out inside data", ["sweep", "--data", d, "--out", str(f["data"] / "s"), *TRAIN_FAST,
                                   "--variants", "gated", "--lr", "1e-3"]),
    ]


def data_cases(f):
    texts, out = str(f["texts"]), str(f["root"] / "new_data")
    prep = ["data", "prepare", "-q", "--input", texts, "--out", out]
    return [
        ("prepare vocab 1e9", [*prep, "--vocab-size", "1000000000"]),
        ("prepare vocab too small", [*prep, "--vocab-size", "10"]),
        ("prepare vocab not int", [*prep, "--vocab-size", "lots"]),
        ("prepare val 0", [*prep, "--val-fraction", "0"]),
        ("prepare val 1", [*prep, "--val-fraction", "1"]),
        ("prepare val nan", [*prep, "--val-fraction", "nan"]),
        ("prepare seed -1", [*prep, "--seed", "-1"]),
        ("prepare out under a file", ["data", "prepare", "-q", "--input", texts, "--out", str(f["file"] / "d")]),
        ("prepare out is a file", ["data", "prepare", "-q", "--input", texts, "--out", str(f["file"])]),
        ("prepare out not empty", ["data", "prepare", "-q", "--input", texts, "--out", str(f["nonempty"])]),
        ("prepare missing input", ["data", "prepare", "-q", "--input", str(f["root"] / "nope"), "--out", out]),
        ("prepare garbage tokenizer", [*prep, "--tokenizer", str(f["garbage_tok"] / "tokenizer.json")]),
        ("prepare missing tokenizer", [*prep, "--tokenizer", str(f["root"] / "nope.json")]),
        ("prepare no --out", ["data", "prepare", "--input", texts]),
        ("data info missing", ["data", "info", str(f["root"] / "nope")]),
        ("data info flipped", ["data", "info", str(f["flipped"])]),
        ("data info small vocab", ["data", "info", str(f["small_vocab"])]),
        ("data info not data", ["data", "info", str(f["nonempty"])]),
        ("data unknown subcommand", ["data", "frobnicate"]),
        ("prepare out is input --force", ["data", "prepare", "-q", "--input", texts, "--out", texts, "--force"]),
        ("prepare out parent of input --force", ["data", "prepare", "-q", "--input", str(f["nest"] / "docs"),
                                                 "--out", str(f["nest"]), "--force"]),
        ("prepare out inside input", ["data", "prepare", "-q", "--input", texts, "--out", str(f["texts"] / "d")]),
        ("prepare out links to input", ["data", "prepare", "-q", "--input", texts, "--out", str(f["texts_link"]),
                                        "--force"]),
        ("prepare out holds the tokenizer", ["data", "prepare", "-q", "--input", texts, "--out", str(f["data"]),
                                             "--tokenizer", str(f["data"] / "tokenizer.json"), "--force"]),
        ("prepare out '' --force", ["data", "prepare", "-q", "--input", texts, "--out", "", "--force"]),
        ("prepare --force over a non-data dir", ["data", "prepare", "-q", "--input", texts, "--out",
                                                 str(f["nonempty"]), "--force"]),
        ("prepare mixed .txt and .jsonl", ["data", "prepare", "-q", "--input", str(f["mixed"]), "--out", out]),
        ("data info garbage tokenizer", ["data", "info", str(f["garbage_tok"])]),
        ("data info swapped tokenizer", ["data", "info", str(f["data_tok"])]),
        ("data info deep manifest", ["data", "info", str(f["deep_manifest"])]),
        ("data info deep tokenizer", ["data", "info", str(f["deep_tok"])]),
        ("prepare deep tokenizer", [*prep, "--tokenizer", str(f["deep_tok"] / "tokenizer.json")]),
        ("prepare input is a FIFO", ["data", "prepare", "-q", "--input", str(f["root"] / "fifo.txt"), "--out", out]),
        ("prepare input is a symlink loop", ["data", "prepare", "-q", "--input", str(f["root"] / "loop_a.txt"),
                                             "--out", out]),
    ]


def analysis_cases(f):
    m, d, out = str(f["model"]), str(f["data"]), f["root"] / "new"
    an = ["analyze", "--model", m, "--data", d, "--batches", "1", "--batch-size", "1", "--device", "cpu"]
    ex = ["extrapolate", "--model", m, "--data", d, "--tokens", "64", "--device", "cpu"]
    cases = [
        ("analyze eps 2", [*an, "--eps", "2"]),
        ("analyze eps 0", [*an, "--eps", "0"]),
        ("analyze eps nan", [*an, "--eps", "nan"]),
        ("analyze batches 0", [*an, "--batches", "0"]),
        ("analyze batch-size -1", [*an, "--batch-size", "-1"]),
        ("analyze bad layers", [*an, "--layers", "x"]),
        ("analyze out under a file", [*an, "--out", str(f["file"] / "r.json")]),
        ("analyze out is a dir", [*an, "--out", str(f["root"])]),
        ("analyze plots under a file", [*an, "--plots", str(f["file"] / "p")]),
        ("analyze plots on a file", [*an, "--plots", str(f["png"])]),
        ("analyze missing model", ["analyze", "--model", str(out), "--data", d]),
        ("analyze missing data", ["analyze", "--model", m, "--data", str(out)]),
        ("analyze flipped weights", ["analyze", "--model", str(f["bad_w"]), "--data", d]),
        ("analyze inf weights", ["analyze", "--model", str(f["inf_w"]), "--data", d]),
        ("analyze bad config type", ["analyze", "--model", str(f["bad_cfg"]), "--data", d]),
        ("analyze other tokenizer", ["analyze", "--model", m, "--data", str(f["other"])]),
        ("analyze bad device", [*an, "--device", "tpu"]),
        ("extrapolate plot under a file", [*ex, "--plot", str(f["file"] / "x.png")]),
        ("extrapolate plot is a dir", [*ex, "--plot", str(f["root"])]),
        ("extrapolate out under a file", [*ex, "--out", str(f["file"] / "x.json")]),
        ("extrapolate bad multiples", [*ex, "--multiples", "a,b"]),
        ("extrapolate bad method", [*ex, "--methods", "plain,warp"]),
        ("extrapolate tokens 0", [*ex, "--tokens", "0"]),
        ("extrapolate other tokenizer", ["extrapolate", "--model", m, "--data", str(f["other"])]),
        ("extrapolate flipped weights", ["extrapolate", "--model", str(f["bad_w"]), "--data", d]),
        ("analyze flipped val.bin", [*an[:4], str(f["val_flipped"]), *an[5:]]),
        ("extrapolate flipped val.bin", [*ex[:4], str(f["val_flipped"]), *ex[5:]]),
        ("analyze swapped model tokenizer", ["analyze", "--model", str(f["tok_swapped"]), "--data", d]),
        ("analyze device meta", [*an[:-2], "--device", "meta"]),
        ("analyze deep config", ["analyze", "--model", str(f["deep_cfg"]), "--data", d]),
        ("analyze hf flipped", ["analyze", "--model", str(f["hf_flipped"]), "--data", d]),
        ("analyze hf config unlisted", ["analyze", "--model", str(f["hf_unlisted"]), "--data", d]),
        ("analyze hf inf", ["analyze", "--model", str(f["hf_inf"]), "--data", d]),
        ("extrapolate hf int8", ["extrapolate", "--model", str(f["hf_int8"]), "--data", d]),
        # a file output over an input, a file of another output, or a special file
        ("analyze out is the model's config.json", [*an, "--out", str(f["model"] / "config.json")]),
        ("analyze out is the data manifest", [*an, "--out", str(f["data"] / "manifest.json")]),
        ("analyze out is the model dir", [*an, "--out", m]),
        ("extrapolate plot is the model's weights", [*ex, "--plot", str(f["model"] / "model.safetensors")]),
        ("extrapolate out is the data's train.bin", [*ex, "--out", str(f["data"] / "train.bin")]),
        ("analyze out is a FIFO", [*an, "--out", str(f["fifo"])]),
        ("extrapolate plot is a FIFO", [*ex, "--plot", str(f["fifo"])]),
        ("analyze out is another model's checksums.json", [*an, "--out", str(f["hf"] / "checksums.json")]),
        ("analyze out is a run's config.json", [*an, "--out", str(f["run"] / "config.json")]),
    ]
    return cases


def hf_cases(f):
    m = str(f["model"])
    gen = ["generate", "--model", m, "--prompt", "the gate"]
    to = str(f["root"] / "converted")
    return [
        ("generate temperature nan", [*gen, "--temperature", "nan"]),
        ("generate temperature inf", [*gen, "--temperature", "inf"]),
        ("generate temperature -1", [*gen, "--temperature", "-1"]),
        ("generate seed -1", [*gen, "--seed", "-1"]),
        ("generate max-new-tokens 1e6", [*gen, "--max-new-tokens", "1000000"]),
        ("generate max-new-tokens -1", [*gen, "--max-new-tokens", "-1"]),
        ("generate top-k 0", [*gen, "--top-k", "0"]),
        ("generate 1-token tokenizer", [*gen, "--tokenizer", str(f["one_tok"]), "--force"]),
        ("generate other tokenizer", [*gen, "--tokenizer", str(f["other"] / "tokenizer.json")]),
        ("generate garbage tokenizer", [*gen, "--tokenizer", str(f["garbage_tok"] / "tokenizer.json")]),
        ("generate missing model", ["generate", "--model", str(f["root"] / "nope"), "--prompt", "a"]),
        ("generate flipped weights", ["generate", "--model", str(f["bad_w"]), "--prompt", "the"]),
        ("generate inf weights", ["generate", "--model", str(f["inf_w"]), "--prompt", "the"]),
        ("generate bad config type", ["generate", "--model", str(f["bad_cfg"]), "--prompt", "the"]),
        ("generate no prompt", ["generate", "--model", m]),
        ("convert to under a file", ["convert", "--from", m, "--to", str(f["file"] / "c")]),
        ("convert to is a file", ["convert", "--from", m, "--to", str(f["file"])]),
        ("convert to not empty", ["convert", "--from", m, "--to", str(f["nonempty"])]),
        ("convert to itself", ["convert", "--from", m, "--to", m, "--force"]),
        ("convert flipped weights", ["convert", "--from", str(f["bad_w"]), "--to", to]),
        ("convert inf weights", ["convert", "--from", str(f["inf_w"]), "--to", to]),
        ("convert bad config type", ["convert", "--from", str(f["bad_cfg"]), "--to", to]),
        ("convert missing from", ["convert", "--from", str(f["root"] / "nope"), "--to", to]),
        ("convert bad variant", ["convert", "--from", m, "--to", to, "--variant", "nope"]),
        ("convert bad format", ["convert", "--from", m, "--to", to, "--format", "onnx"]),
        ("convert init without variant", ["convert", "--from", m, "--to", to, "--init", "random"]),
        ("convert to parent of from", ["convert", "--from", m, "--to", str(f["run"]), "--force"]),
        ("convert to inside from", ["convert", "--from", m, "--to", str(f["model"] / "sub")]),
        ("convert --force over a non-output", ["convert", "--from", m, "--to", str(f["nonempty"]), "--force"]),
        ("convert to ''", ["convert", "--from", m, "--to", ""]),
        ("convert --force over a checkpoint", ["convert", "--from", str(f["hf"]), "--to",
                                               str(sorted((f["run"] / "checkpoints").glob("step_*"))[-1]), "--force"]),
        ("convert --force over a run's final", ["convert", "--from", str(f["hf"]), "--to", m, "--force"]),
        ("convert --force over a model with a user's file", ["convert", "--from", m, "--to",
                                                             str(f["model_user_file"]), "--force"]),
        ("generate temperature 1e-50", [*gen, "--temperature", "1e-50"]),
        ("generate temperature 1e300", [*gen, "--temperature", "1e300"]),
        ("generate device meta", [*gen, "--device", "meta"]),
        *([("generate device mps (none here)", [*gen, "--device", "mps"])] if not torch.backends.mps.is_available()
          else []),
        ("generate prompt not UTF-8", ["generate", "--model", m, "--prompt", "the \udcff gate"]),
        ("generate deep tokenizer", [*gen, "--tokenizer", str(f["deep_tok"] / "tokenizer.json"), "--force"]),
    ] + [(f"{cmd} {name}", [cmd, "--" + ("model" if cmd == "generate" else "from"), str(f[name]),
                            *(["--prompt", "the"] if cmd == "generate" else ["--to", to])])
         for cmd in ("generate", "convert")
         for name in ("hf_flipped", "hf_unlisted", "hf_inf", "hf_int8", "model_int32", "sums_dir", "tok_swapped",
                      "deep_cfg", "deep_obj", "att_str", "big_vocab", "big_layers", "rope_abc", "wm_int",
                      "vocab_5e7", "layers_1e5", "head_dim_1e6", "heads_1e6", "learned_1e12")]


def reproduce_cases(f):
    d, out = str(f["data"]), str(f["root"] / "new_repro")
    base = ["reproduce", "--with-text", "--data", d, "--out", out, "--steps", "2", "--preset", "micro"]
    return [
        ("reproduce a natural-text flag without --with-text", ["reproduce", "--data", d, "--out", out]),
        ("reproduce --fold without --with-text", ["reproduce", "--fold", d, "--out", out]),
        ("reproduce out under a file", ["reproduce", "--with-text", "--data", d, "--out", str(f["file"] / "r"),
                                        "--steps", "2"]),
        ("reproduce --set out_dir", [*base, "--set", "out_dir=elsewhere"]),
        ("reproduce --set data_dir", [*base, "--set", "train.data_dir=elsewhere"]),
        ("reproduce --set variant", [*base, "--set", "variant=gated"]),
        ("reproduce --set seeds with --seeds", [*base, "--seeds", "2", "--set", "seeds=3"]),
        ("reproduce --set steps with --steps", [*base, "--set", "steps=5"]),
        ("reproduce --set size with --preset", [*base, "--set", "train.model.size=small"]),
        ("reproduce seeds 0", [*base, "--seeds", "0"]),
        ("reproduce steps 0", [*base, "--steps", "0"]),
        ("reproduce bad variants", [*base, "--variants", "gated,nope"]),
        ("reproduce missing data", ["reproduce", "--with-text", "--data", str(f["root"] / "nope"), "--out", out,
                                    "--steps", "2"]),
        ("reproduce bad multiples", [*base, "--multiples", "x"]),
        ("reproduce bad study", [*base, "--study", "everything"]),
        ("reproduce bad set value", [*base, "--set", "train.lr=-1"]),
        ("reproduce out holds the user's report", ["reproduce", "--quick", "--with-text", "--data", d, "--out",
                                                   str(f["foreign_study"])]),
        ("reproduce out holds another study's output", ["reproduce", "--study", "pretrained", "--quick", "--out",
                                                        str(f["other_study"])]),
        ("reproduce seeds 1e9", ["reproduce", "--study", "pretrained", "--quick", "--seeds", str(10**9), "--out",
                                 out]),
    ]


def misc_cases(f):
    return [
        ("unknown command", ["frobnicate"]),
        ("no command", []),
        ("variants bad option", ["variants", "--bogus"]),
        ("variants d-model 1e12", ["variants", "--d-model", str(10**12)]),
        ("variants heads 1e9", ["variants", "--n-heads", str(10**9)]),
        ("variants seq-len 0", ["variants", "--seq-len", "0"]),
        ("bench out under a file", ["bench", "--quick", "--out", str(f["file"] / "bench.json")]),
        ("bench out is a model's tokenizer.json", ["bench", "--quick", "--out", str(f["model"] / "tokenizer.json")]),
        ("bench out is a FIFO", ["bench", "--quick", "--out", str(f["fifo"])]),
        ("bench out links to stdout", ["bench", "--quick", "--out", str(f["root"] / "to_stdout.json")]),
        ("bench out is /dev/stdout", ["bench", "--quick", "--out", "/dev/stdout"]),
        ("bench repeats 1e9", ["bench", "--quick", "--repeats", str(10**9)]),
        ("bench warmup 1e9", ["bench", "--quick", "--warmup", str(10**9)]),
    ]


def all_cases(f):
    return (train_cases(f) + sweep_cases(f) + data_cases(f) + analysis_cases(f) + hf_cases(f)
            + reproduce_cases(f) + misc_cases(f))


def snapshot(root: Path) -> set[str]:
    """Every path under ``root`` (os.walk: the case loop takes one of these per case)."""
    start = len(os.fspath(root)) + 1
    return {os.path.join(d, name)[start:] for d, dirs, files in os.walk(root) for name in dirs + files}


def test_every_bad_invocation_is_one_line_with_no_files(fx, capsys, monkeypatch):
    monkeypatch.chdir(fx["root"])
    cases = all_cases(fx)
    failures = []
    after = snapshot(fx["root"])
    for name, argv in cases:
        before = after  # what the previous case left (nothing runs in between)
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse
            code = e.code
        except BaseException as e:  # noqa: BLE001 - an escaped exception is a traceback
            failures.append(f"{name}: raised {type(e).__name__}: {e}")
            after = snapshot(fx["root"])
            continue
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        after = snapshot(fx["root"])
        new = after - before
        if not code:
            failures.append(f"{name}: exit {code} (accepted)")
        elif len(lines) != 1 or "Traceback" in err:
            failures.append(f"{name}: stderr has {len(lines)} lines: {err!r}")
        if new:
            failures.append(f"{name}: left {sorted(new)}")
    assert len(cases) >= 230
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------ Python API
def api_cases(f):
    from gatedattn.models.lm import GatedLM
    from gatedattn.train import TrainConfig, train

    from gatedattn.hf import export_hf, load_model

    model = GatedLM.from_pretrained(f["model"])
    vocab = model.cfg.vocab_size

    def inf_model():
        m = GatedLM.from_pretrained(f["model"])
        with torch.no_grad():
            m.norm.weight[0] = float("inf")
        return m

    def cache_of_other_batch():
        cache = model.new_cache()
        model(torch.zeros(2, 3, dtype=torch.long), caches=cache)
        model(torch.zeros(1, 1, dtype=torch.long), caches=cache)

    def auto_bad_config():
        from transformers import AutoModelForCausalLM

        from gatedattn.hf import register_auto

        register_auto()
        AutoModelForCausalLM.from_pretrained(f["bad_cfg"])

    return [
        ("forward 3-d ids", lambda: model(torch.zeros(1, 2, 3, dtype=torch.long))),
        ("forward 1-d ids", lambda: model(torch.zeros(3, dtype=torch.long))),
        ("forward float ids", lambda: model(torch.zeros(1, 3))),
        ("generate 1e9 new tokens", lambda: model.generate(torch.zeros(1, 2, dtype=torch.long), 10**9)),
        ("forward uint8 ids", lambda: model(torch.zeros(1, 3, dtype=torch.uint8))),
        ("forward bool ids", lambda: model(torch.zeros(1, 3, dtype=torch.bool))),
        ("load_model no such device", lambda: load_model(f["model"], device="nope")),
        ("load_model cuda on a machine without", lambda: load_model(f["model"], device="cuda")
         if not torch.cuda.is_available() else load_model(f["model"], device="nope")),
        ("forward id beyond vocab", lambda: model(torch.full((1, 3), vocab))),
        ("forward negative id", lambda: model(torch.full((1, 3), -1))),
        ("forward cache of another batch", cache_of_other_batch),
        ("forward too few caches", lambda: model(torch.zeros(1, 2, dtype=torch.long), caches=[])),
        ("from_pretrained flipped", lambda: GatedLM.from_pretrained(f["bad_w"])),
        ("from_pretrained inf", lambda: GatedLM.from_pretrained(f["inf_w"])),
        ("from_pretrained bad config", lambda: GatedLM.from_pretrained(f["bad_cfg"])),
        ("AutoModel bad config", auto_bad_config),
        ("train out under a file", lambda: train(TrainConfig(data_dir=str(f["data"]), out_dir=str(f["file"] / "r"),
                                                             preset="micro", seq_len=16, steps=1, warmup_steps=0))),
        ("train flipped data", lambda: train(TrainConfig(data_dir=str(f["flipped"]), out_dir=str(f["root"] / "r"),
                                                         preset="micro", seq_len=16, steps=1, warmup_steps=0))),
        ("TrainConfig max_seq_len < seq_len", lambda: TrainConfig(seq_len=32, model_overrides={"max_seq_len": 8})),
        ("TrainConfig seed -1", lambda: TrainConfig(seed=-1)),
        ("from_pretrained int32 tensor", lambda: GatedLM.from_pretrained(f["model_int32"])),
        ("load_model hf int8 tensor", lambda: load_model(f["hf_int8"])),
        ("load_model hf flipped", lambda: load_model(f["hf_flipped"])),
        ("load_model swapped tokenizer", lambda: load_model(f["tok_swapped"])),
        ("export_hf inf weights", lambda: export_hf(inf_model(), f["root"] / "exported")),
        ("export_hf over a file", lambda: export_hf(model, f["file"])),
        *attention_cases(model),
        ("generate bool ids", lambda: model.generate(torch.ones(1, 2, dtype=torch.bool), 2)),
        ("generate uint8 ids", lambda: model.generate(torch.ones(1, 2, dtype=torch.uint8), 2)),
        ("generate empty prompt", lambda: model.generate(torch.zeros(1, 0, dtype=torch.long), 2)),
        ("generate top_k 0", lambda: model.generate(torch.zeros(1, 2, dtype=torch.long), 2, top_k=0)),
        ("generate top_k -1", lambda: model.generate(torch.zeros(1, 2, dtype=torch.long), 2, top_k=-1)),
        ("generate temperature nan", lambda: model.generate(torch.zeros(1, 2, dtype=torch.long), 2,
                                                            temperature=float("nan"))),
        ("from_pretrained swapped tokenizer", lambda: GatedLM.from_pretrained(f["tok_swapped"])),
        ("from_pretrained map_location meta", lambda: GatedLM.from_pretrained(f["model"], map_location="meta")),
        ("from_pretrained map_location cuda:99", lambda: GatedLM.from_pretrained(f["model"], map_location="cuda:99")),
        ("from_pretrained map_location nonsense", lambda: GatedLM.from_pretrained(f["model"], map_location="gpu0")),
        ("assign to a ModelConfig field", lambda: setattr(model.cfg, "vocab_size", 3)),
        ("assign to an AttentionConfig field", lambda: setattr(model.cfg.attention, "n_heads", 3)),
        ("GatedLM vocab_size 5e7", lambda: GatedLM(dataclasses.replace(model.cfg, vocab_size=5 * 10**7))),
        ("GatedLM n_layers 1e5", lambda: GatedLM(dataclasses.replace(model.cfg, n_layers=10**5))),
        ("GatedLM learned max_seq_len 1e12", lambda: GatedLM(dataclasses.replace(
            model.cfg, max_seq_len=10**12, position_embedding="learned"))),
    ]


def attention_cases(model):
    """Bad input to one attention layer (GQA) and to a reused KV cache (GQA and MLA)."""
    from gatedattn.layers.attention import Attention
    from gatedattn.layers.cache import KVCache
    from gatedattn.layers.variants import get_variant

    attn = model.blocks[0].attn
    d = attn.cfg.d_model
    x = torch.zeros(1, 3, d)
    mla = Attention(dataclasses.replace(get_variant("gated")(d_model=d, n_heads=4), kv="mla"))

    def filled(layer, batch=2, dtype=torch.float32):
        cache = KVCache()
        layer.to(dtype)(torch.zeros(batch, 3, d, dtype=dtype), cache=cache)
        layer.float()
        return cache

    return [
        ("Attention wrong width", lambda: attn(torch.zeros(1, 3, d + 1))),
        ("Attention B 0", lambda: attn(torch.zeros(0, 3, d))),
        ("Attention T 0", lambda: attn(torch.zeros(1, 0, d))),
        ("Attention int input", lambda: attn(torch.zeros(1, 3, d, dtype=torch.long))),
        ("Attention float64 input", lambda: attn(torch.zeros(1, 3, d, dtype=torch.float64))),
        ("Attention bf16 input, fp32 weights", lambda: attn(torch.zeros(1, 3, d, dtype=torch.bfloat16))),
        ("Attention fp16 input, fp32 weights", lambda: attn(torch.zeros(1, 3, d, dtype=torch.float16))),
        ("Attention complex input", lambda: attn(torch.zeros(1, 3, d, dtype=torch.complex64))),
        ("Attention a list", lambda: attn([[0.0] * d] * 3)),
        ("Attention 2-d input", lambda: attn(torch.zeros(3, d))),
        ("Attention positions too short", lambda: attn(x, positions=torch.arange(2))),
        ("Attention float positions", lambda: attn(x, positions=torch.zeros(3))),
        ("Attention positions of another batch", lambda: attn(x, positions=torch.zeros(2, 3, dtype=torch.long))),
        ("Attention cache not a KVCache", lambda: attn(x, cache={})),
        ("KVCache of another batch", lambda: attn(x, cache=filled(attn))),
        ("KVCache of another dtype", lambda: attn(torch.zeros(2, 1, d), cache=filled(attn, dtype=torch.bfloat16))),
        ("KVCache of an MLA layer in a GQA one", lambda: attn(torch.zeros(2, 1, d), cache=filled(mla))),
        ("KVCache of a GQA layer in an MLA one", lambda: mla(torch.zeros(2, 1, d), cache=filled(attn))),
        ("KVCache of another batch in MLA", lambda: mla(x, cache=filled(mla))),
    ]


def test_python_api_refuses_bad_input_with_a_named_error(fx):
    for name, call in api_cases(fx):
        before = snapshot(fx["root"])
        with pytest.raises(GatedAttnError) as info:
            call()
        assert "\n" not in str(info.value), name
        assert snapshot(fx["root"]) == before, name
