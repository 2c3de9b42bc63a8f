"""``gatedattn convert`` and ``gatedattn generate`` through the real CLI entry point."""

import argparse
import json

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from gatedattn import cli
from gatedattn.hf import load_model
from gatedattn.hf import cli as hf_cli

V = 100
WORDS = [f"w{i}" for i in range(V - 3)]


@pytest.fixture(autouse=True)
def _hf_subcommands(monkeypatch):
    """Run through gatedattn.cli.main (one-line errors, exit code 2) with our subcommands registered."""
    if "gatedattn.hf.cli" not in cli.SUBCOMMAND_MODULES:
        monkeypatch.setattr(cli, "SUBCOMMAND_MODULES", cli.SUBCOMMAND_MODULES + ("gatedattn.hf.cli",))


def write_tokenizer(path):
    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(path))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    torch.manual_seed(2)
    config = Qwen3Config(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, intermediate_size=96, bos_token_id=1, eos_token_id=None)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("qwen3")
    model.save_pretrained(path)
    write_tokenizer(path / "tokenizer.json")
    return path


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_register_builds_both_subcommands():
    parser = argparse.ArgumentParser()
    hf_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["convert", "--from", "a", "--to", "b", "--variant", "gated", "--format", "hf"])
    assert args.func is hf_cli._convert and (args.from_dir, args.to, args.variant) == ("a", "b", "gated")
    args = parser.parse_args(["generate", "--model", "m", "--prompt", "hi", "--top-k", "5"])
    assert args.func is hf_cli._generate and args.top_k == 5 and args.max_new_tokens is None


def test_convert_with_gate_then_generate(hf_dir, tmp_path, capsys):
    out_dir = tmp_path / "gated"
    code, out, err = run(capsys, "convert", "--from", hf_dir, "--to", out_dir, "--variant", "gated")
    assert code == 0, err
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out_dir.iterdir()}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind
    converted, source = load_model(out_dir), load_model(hf_dir)
    assert converted.cfg.variant == "gated" and converted.cfg.bos_token_id == 1
    ids = torch.randint(0, V, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(converted(ids), source(ids), atol=1e-5, rtol=0)

    prompt = "w5 w17 w3"
    argv = ["--prompt", prompt, "--max-new-tokens", 6, "--temperature", 0]
    code, from_hf, err = run(capsys, "generate", "--model", hf_dir, *argv)
    assert code == 0, err
    code, from_ours, err = run(capsys, "generate", "--model", out_dir, *argv)
    assert code == 0, err
    assert from_hf == from_ours  # identity retrofit: same greedy continuation
    words = from_ours.split()
    assert words[:3] == prompt.split() and len(words) == 9
    # the CLI used BOS + prompt and the KV cache: same tokens as the library call
    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    ids = torch.tensor([[1] + tok.encode(prompt, add_special_tokens=False).ids])
    expected = tok.decode(source.generate(ids, 6, temperature=0, use_cache=False)[0, 1:].tolist())
    assert from_ours.strip() == expected
    code, compiled, err = run(capsys, "generate", "--model", out_dir, *argv, "--compile", "aot_eager")
    assert code == 0 and compiled == from_ours, err  # one compiled step over a static cache: the same tokens
    code, _, err = run(capsys, "generate", "--model", out_dir, *argv, "--compile", "sometimes")
    assert code == 2 and "--compile sometimes: allowed: auto" in err and "torch.compile backend" in err

    code, sampled, err = run(capsys, "generate", "--model", out_dir, "--prompt", prompt, "--max-new-tokens", 5,
                             "--temperature", 1.0, "--top-k", 5, "--seed", 3)
    assert code == 0 and len(sampled.split()) == 8
    assert run(capsys, "generate", "--model", out_dir, "--prompt", prompt, "--max-new-tokens", 5,
               "--temperature", 1.0, "--top-k", 5, "--seed", 3)[1] == sampled


def test_convert_to_hf_format_and_back(hf_dir, tmp_path, capsys):
    ours = tmp_path / "ours"
    assert run(capsys, "convert", "--from", hf_dir, "--to", ours)[0] == 0
    code, _, err = run(capsys, "convert", "--from", ours, "--to", tmp_path / "hf", "--format", "hf")
    assert code == 0, err
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    ids = torch.randint(0, V, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, load_model(hf_dir)(ids), atol=1e-5, rtol=0)


@pytest.mark.parametrize("fmt,variant,arch", [("qwen3-next", "gated", "Qwen3NextForCausalLM"),
                                              ("hf", "gated", "Qwen3NextForCausalLM"),
                                              ("official", "gated-headwise", "Qwen3ForCausalLM")])
def test_convert_gated_to_qwen3_next_and_official(hf_dir, tmp_path, capsys, fmt, variant, arch):
    code, out, err = run(capsys, "convert", "--from", hf_dir, "--to", tmp_path / "out", "--variant", variant,
                         "--init", "random", "--format", fmt)
    assert code == 0, err
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == [arch] and (tmp_path / "out" / "tokenizer.json").is_file()
    assert config.get("headwise_attn_output_gate", False) == (fmt == "official")
    back = load_model(tmp_path / "out")
    assert back.cfg.variant == variant
    ids = torch.randint(0, V, (1, 8))
    if fmt != "official":  # stock transformers runs it
        hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
        with torch.no_grad():
            torch.testing.assert_close(hf(ids).logits, back(ids), atol=1e-4, rtol=0)


def test_convert_self_contained_writes_code_and_auto_map(hf_dir, tmp_path, capsys):
    code, out, err = run(capsys, "convert", "--from", hf_dir, "--to", tmp_path / "out", "--variant", "hyga",
                         "--self-contained")
    assert code == 0, err
    assert "with its modelling code" in out
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_gatedattn.GatedAttnForCausalLM"
    assert {"modeling_gatedattn.py", "configuration_gatedattn.py", "layers_attention.py"} <= {
        p.name for p in (tmp_path / "out").iterdir()}
    assert load_model(tmp_path / "out").cfg.variant == "hyga"


def test_convert_refuses_and_overwrites_only_with_force(hf_dir, tmp_path, capsys):
    mine = tmp_path / "mine"  # not an output of convert: never replaced, even with --force
    mine.mkdir()
    (mine / "keep.txt").write_text("old")
    for force in ((), ("--force",)):
        code, out, err = run(capsys, "convert", "--from", hf_dir, "--to", mine, *force)
        assert code == 2 and "--force" in err and len(err.strip().splitlines()) == 1
    assert (mine / "keep.txt").read_text() == "old"
    target = tmp_path / "out"  # an earlier output of convert
    assert run(capsys, "convert", "--from", hf_dir, "--to", target)[0] == 0
    (target / "keep.txt").write_text("old")
    code, out, err = run(capsys, "convert", "--from", hf_dir, "--to", target)
    assert code == 2 and "--force" in err and len(err.strip().splitlines()) == 1
    assert (target / "keep.txt").read_text() == "old"
    code, out, err = run(capsys, "convert", "--from", hf_dir, "--to", target, "--force")
    assert code == 2 and "'keep.txt', which gatedattn did not write" in err  # a file of the user's is never lost
    assert (target / "keep.txt").read_text() == "old"
    (target / "keep.txt").unlink()
    code, out, err = run(capsys, "convert", "--from", hf_dir, "--to", target, "--force", "--variant", "hyga",
                         "--init", "random")
    assert code == 0, err
    assert load_model(target).cfg.variant == "hyga"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("argv,message", [
    (["convert", "--from", "{hf}", "--to", "{tmp}/x", "--variant", "hyga", "--format", "hf"], "h_dim=16"),
    (["convert", "--from", "{hf}", "--to", "{tmp}/x", "--variant", "gated-headwise", "--format", "qwen3-next"],
     "granularity='headwise'"),
    (["convert", "--from", "{hf}", "--to", "{tmp}/x", "--format", "official"], "no gate"),
    (["convert", "--from", "{hf}", "--to", "{tmp}/x", "--format", "hf", "--self-contained"], "--self-contained"),
    (["convert", "--from", "{tmp}/missing", "--to", "{tmp}/x"], "not a directory"),
    (["convert", "--from", "{hf}", "--to", "{tmp}/x", "--variant", "nope"], "unknown variant"),
    (["convert", "--from", "{hf}", "--to", "{tmp}/x", "--init", "random"], "--init needs --variant"),
    (["generate", "--model", "{tmp}/missing", "--prompt", "w1", "--tokenizer", "{hf}/tokenizer.json"],
     "not a directory"),
    (["generate", "--model", "{hf}", "--prompt", "w1", "--tokenizer", "{tmp}/none.json"], "tokenizer"),
    (["generate", "--model", "{hf}", "--prompt", "w1", "--max-new-tokens", "-1"], "max-new-tokens"),
])
def test_bad_inputs_exit_2_with_one_line(hf_dir, tmp_path, capsys, argv, message):
    argv = [a.format(hf=hf_dir, tmp=tmp_path) for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith(f"gatedattn {argv[0]}: error:")
    assert not (tmp_path / "x").exists()
