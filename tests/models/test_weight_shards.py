"""models.shards: a model's weights as one file or as shards with an index, and the
errors a damaged sharded directory gives."""

import json

import pytest
import torch

from gatedattn import GatedLM, ModelConfig
from gatedattn.infra.errors import GatedAttnError
from gatedattn.models.shards import INDEX_FILE, parse_size, read_weights


def test_parse_size_reads_transformers_size_strings():
    assert [parse_size(s) for s in (1000, "20KB", "1.5MB", "1GiB", "3 kib")] == [1000, 20_000, 1_500_000, 2**30, 3072]
    for bad in ("lots", 0, -5, "0MB", True, 1.5):
        with pytest.raises(GatedAttnError, match="max_shard_size=.* must be a positive number of bytes"):
            parse_size(bad, "max_shard_size")


def test_sharded_weights_read_back_and_a_damaged_index_names_the_problem(tmp_path):
    torch.manual_seed(0)
    model = GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=50))
    model.save_pretrained(tmp_path / "m", max_shard_bytes=30_000)
    index = json.loads((tmp_path / "m" / INDEX_FILE).read_text())
    assert len(set(index["weight_map"].values())) > 1
    want = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    got = read_weights(tmp_path / "m")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    name = next(iter(index["weight_map"]))
    index["weight_map"].pop(name)
    (tmp_path / "m" / INDEX_FILE).write_text(json.dumps(index))
    (tmp_path / "m" / "checksums.json").unlink()  # edited by hand: only the format checks apply
    with pytest.raises(GatedAttnError, match=f"tensor '{name}' is not listed for it in {INDEX_FILE}"):
        GatedLM.from_pretrained(tmp_path / "m")
