"""Decoding over a static cache (``models.decode``): the same greedy tokens as eager
decoding for every kind of layer and a padded batch, one graph for every token, the
compiled step's tokens equal to eager's, and ``compile="auto"`` choosing by the new tokens."""

import pytest
import torch

from gatedattn import GatedAttnError
from gatedattn.models import decode as D
from gatedattn.models.lm import GatedLM, ModelConfig

CASES = {
    "baseline": {},
    "gated": {"variant": "gated"},
    "sink": {"attention_fields": {"sink": True}},
    "hyga-sink": {"variant": "hyga-sink"},
    "mla": {"attention_fields": {"kv": "mla"}},
    "mla-g2": {"variant": "g2-value", "attention_fields": {"kv": "mla"}},
    "learned-positions": {"position_embedding": "learned"},
}


def micro(n_layers: int = 2, variant: str = "baseline", **fields) -> GatedLM:
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("micro", variant, vocab_size=50, **fields).replace(n_layers=n_layers)
    return GatedLM(cfg).eval()


def decoded(model: GatedLM, ids: torch.Tensor, new: int, mask=None, static=None) -> torch.Tensor:
    """Greedy tokens, eagerly (``static`` None) or through ``static`` (a step function)."""
    with torch.no_grad():
        if static is None:
            steps = D.EagerSteps(model, ids, new, True, mask)
        else:
            steps = D.StaticSteps(model, ids, new, mask, backend=None)
            steps.step = static
        return D.decode_tokens(steps, ids, new, 0, None, None, None)


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[0, :3] = 0
    mask[1, :1] = 0
    return ids, mask


@pytest.mark.parametrize("case", CASES)
def test_the_static_step_gives_eager_decodings_tokens(case):
    model = micro(**CASES[case])
    ids, mask = padded_batch()
    for m in (None, mask):
        assert torch.equal(decoded(model, ids, 12, m, static=D.static_step), decoded(model, ids, 12, m))


def test_the_static_step_logits_match_eager_and_nothing_unwritten_leaks_in():
    """The buffers' columns after the prompt are zeroed before the first step, and the key
    mask hides them: a NaN left there (a stale buffer) must not reach the logits."""
    model = micro(**CASES["sink"])
    ids = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        eager, static = D.EagerSteps(model, ids, 4, True, None), D.StaticSteps(model, ids, 4, None, backend=None)
        torch.testing.assert_close(static.first(), eager.first(), rtol=0, atol=0)
        assert static.capacity == D.CAPACITY_STEP and static.buffers[0][0].shape[2] == static.capacity
        assert all(not b[:, :, 5:].any() for pair in static.buffers for b in pair)  # zeroed after the prompt
        nxt = torch.tensor([3, 4])
        torch.testing.assert_close(static.next(nxt), eager.next(nxt), rtol=1e-5, atol=1e-5)
        static.buffers[1][0][:, :, 10:20] = float("nan")  # columns no step has written yet
        torch.testing.assert_close(static.next(nxt), eager.next(nxt), rtol=1e-5, atol=1e-5)


def test_the_step_is_one_graph_for_every_token():
    """Traced whole (``fullgraph``) once: later tokens run the same graph (no Python
    number of the position reaches it), and a second decoding of the same shape too."""
    import torch._dynamo as dynamo
    from torch._dynamo.testing import CompileCounter

    model = micro(**CASES["hyga-sink"])
    ids, mask = padded_batch()
    counter = CompileCounter()
    dynamo.reset()
    step = torch.compile(D.static_step, backend=counter, fullgraph=True, dynamic=False)
    out = decoded(model, ids, 10, mask, static=step)
    assert counter.frame_count == 1
    assert torch.equal(out, decoded(model, ids, 10, mask))
    decoded(model, ids[:, 1:], 20, mask[:, 1:], static=step)  # other lengths within one capacity
    assert counter.frame_count == 1


def test_generate_compiled_gives_eager_greedy_tokens():
    """``generate(compile=...)`` decodes through the compiled step. It is compiled here by
    AOT autograd without inductor's C++ (a second, not a minute): the functionalised graph
    must still write every layer's cache buffers in place. ``gatedattn bench --decode``
    runs inductor itself and records whether its tokens equal eager's."""
    import torch._dynamo as dynamo

    dynamo.reset()
    model = micro(2, **CASES["gated"])
    ids, mask = padded_batch()
    eager = model.generate(ids, 8, temperature=0, attention_mask=mask, compile=False)
    assert torch.equal(model.generate(ids, 8, temperature=0, attention_mask=mask, compile="aot_eager"), eager)
    assert D.compiled_step.cache_info().currsize >= 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_compiled_decoding_gives_eager_tokens():
    model = micro(2, **CASES["hyga-sink"]).cuda()
    ids, mask = (t.cuda() for t in padded_batch())
    eager = model.generate(ids, 8, temperature=0, attention_mask=mask, compile=False)
    assert torch.equal(model.generate(ids, 8, temperature=0, attention_mask=mask, compile=True), eager)


def test_auto_compiles_from_the_measured_break_even_only():
    assert D.compiles("auto", 1, D.AUTO_MIN_TOKENS - 1, True) is None
    assert D.compiles("auto", 1, D.AUTO_MIN_TOKENS, True) == "inductor"
    assert D.compiles("auto", 2, D.AUTO_MIN_TOKENS, True) == "inductor"  # one- and two-row products: fast loops
    assert D.compiles("auto", 64, D.AUTO_MIN_TOKENS_BATCHED // 64, True) is None  # the steps count, not the batch
    assert D.compiles("auto", 3, D.AUTO_MIN_TOKENS_BATCHED - 1, True) is None
    assert D.compiles("auto", 3, D.AUTO_MIN_TOKENS_BATCHED, True) == "inductor"
    assert D.compiles(True, 1, 100, use_cache=False) is None  # no cache: nothing static to compile over
    assert D.compiles(True, 1, 2, True) == "inductor" and D.compiles(False, 1, 10**6, True) is None
    assert D.compiles("aot_eager", 1, 2, True) == "aot_eager"


@pytest.mark.parametrize("bad", ["yes", 1, None, "inductr"])
def test_a_bad_compile_is_refused_naming_it_and_the_allowed_values(bad):
    with pytest.raises(GatedAttnError, match=r"compile=.*allowed: 'auto', True or False, or the name of a"):
        micro(1).generate(torch.zeros(1, 3, dtype=torch.long), 2, compile=bad)


def test_static_capacity_holds_the_decoding_and_the_query_column():
    assert D.static_capacity(1) == D.CAPACITY_STEP
    assert D.static_capacity(D.CAPACITY_STEP - 1) == D.CAPACITY_STEP
    assert D.static_capacity(D.CAPACITY_STEP) == 2 * D.CAPACITY_STEP  # the last column is the query's own
