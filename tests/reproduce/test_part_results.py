"""Each keyed part of the main job returns a frozen dataclass of its results, which becomes
a dict only in ``results.json``: every committed results block reads back and writes again
unchanged (key order included), and a block with a key the part does not write (or without
one it always writes) is refused naming the key and the part."""

import dataclasses
import json
from pathlib import Path

import pytest

from gatedattn.infra.errors import ConfigError
from gatedattn.reproduce.mechanism.results import MechanismResults
from gatedattn.reproduce.pretrained.results import PretrainedResults

DOCS = Path(__file__).parents[2] / "docs"


def _committed() -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(DOCS.glob("*/results.json"))}


def _blocks(kind: type) -> dict[str, dict]:
    """Every committed block of the part ``kind`` types: a mechanism study's whole results,
    or the block under the part's key."""
    found = {}
    for name, results in _committed().items():
        if kind.PART in results and isinstance(results[kind.PART], dict):
            found[f"{name}:{kind.PART}"] = results[kind.PART]
        elif results.get("study") == kind.PART and kind is MechanismResults:
            found[name] = results
    return found


MECHANISM_BLOCKS = _blocks(MechanismResults)
PRETRAINED_BLOCKS = _blocks(PretrainedResults)


def test_the_committed_blocks_of_each_part_are_found():
    assert {"reproduction:mechanism", "mechanism-random", "mechanism-hyga-gates"} <= set(MECHANISM_BLOCKS)
    assert {"reproduction:pretrained", "real-model-continued:pretrained", "real-model-w64:pretrained"} <= \
        set(PRETRAINED_BLOCKS)


@pytest.mark.parametrize("kind,name", [(MechanismResults, n) for n in MECHANISM_BLOCKS]
                         + [(PretrainedResults, n) for n in PRETRAINED_BLOCKS])
def test_a_committed_block_reads_back_and_writes_again_unchanged(kind, name):
    block = {**MECHANISM_BLOCKS, **PRETRAINED_BLOCKS}[name]
    typed = kind.from_dict(block)
    assert isinstance(typed, kind)
    again = typed.to_dict()
    assert again == block and list(again) == list(block)
    assert json.dumps(again) == json.dumps(block)  # the key order at every depth


def test_the_typed_fields_are_what_the_code_reads():
    mech = MechanismResults.from_dict(MECHANISM_BLOCKS["reproduction:mechanism"])
    assert mech.study == "mechanism" and mech.minutes > 0 and mech.meta is None and set(mech.depths) == {"1", "2"}
    alone = MechanismResults.from_dict(MECHANISM_BLOCKS["mechanism-random"])
    assert alone.minutes is None and alone.meta["command"].startswith("gatedattn reproduce")
    pre = PretrainedResults.from_dict(PRETRAINED_BLOCKS["reproduction:pretrained"])
    assert pre.window == 128 and pre.continued is None and pre.noop_plain is None and len(pre.claims) == 11
    with pytest.raises(dataclasses.FrozenInstanceError):
        pre.window = 64  # type: ignore[misc]


@pytest.mark.parametrize("kind,block", [(MechanismResults, "reproduction:mechanism"),
                                        (PretrainedResults, "reproduction:pretrained")])
def test_an_unknown_or_missing_key_is_refused_naming_it_and_the_part(kind, block):
    data = {**MECHANISM_BLOCKS, **PRETRAINED_BLOCKS}[block]
    with pytest.raises(ConfigError, match=rf"the {kind.PART} part's results hold an unknown key 'sink_size'"):
        kind.from_dict({**data, "sink_size": 3})
    required = "depths" if kind is MechanismResults else "window_why"
    with pytest.raises(ConfigError, match=rf"the {kind.PART} part's results miss the key '{required}'"):
        kind.from_dict({k: v for k, v in data.items() if k != required})
    optional = "minutes" if kind is MechanismResults else "claims"
    assert optional not in kind.from_dict({k: v for k, v in data.items() if k != optional}).to_dict()
    with pytest.raises(ConfigError, match=rf"the {kind.PART} part's results hold '{optional}' as null"):
        kind.from_dict({**data, optional: None})


def test_a_value_of_the_wrong_kind_is_refused_naming_the_key():
    data = PRETRAINED_BLOCKS["reproduction:pretrained"]
    with pytest.raises(ConfigError, match=r"results hold 'window' as str; it must be an integer or null"):
        PretrainedResults.from_dict({**data, "window": "128"})
    with pytest.raises(ConfigError, match=r"results hold 'noop' as dict; it must be a list"):
        PretrainedResults.from_dict({**data, "noop": {}})
    with pytest.raises(ConfigError, match=r"results hold 'run_minutes' as bool; it must be a number"):
        MechanismResults.from_dict({**MECHANISM_BLOCKS["reproduction:mechanism"], "run_minutes": True})
    assert PretrainedResults.from_dict({**data, "window": None}).window is None  # no window chosen: null
    with pytest.raises(ConfigError, match=r"the mechanism part's results must be a JSON object, got list"):
        MechanismResults.from_dict([])
