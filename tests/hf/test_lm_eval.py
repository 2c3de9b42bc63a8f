"""lm-evaluation-harness runs on a gatedattn model (``--model hf``, trust_remote_code) and
its log-likelihoods are the model's own. Needs the ``eval`` extra (skipped without it)."""

import importlib.util
import json
import logging

import pytest
import torch

from gatedattn import GatedLM, ModelConfig
from gatedattn.hf import save_self_contained

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None,
                                reason="lm-eval is not installed (pip install -e '.[eval]')")

V = 40
WORDS = [f"w{i}" for i in range(V - 3)]
TASK = """task: toy_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "<|eos|>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|eos|>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", eos_token="<|eos|>")


@pytest.mark.slow
def test_lm_eval_loglikelihoods_are_the_models(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger="lm_eval")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # local files only: nothing is fetched
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # (read when datasets is first imported, just below)
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    torch.manual_seed(0)
    model = GatedLM(ModelConfig.from_preset("micro", "hyga-sink", vocab_size=V)).eval()
    save_self_contained(model, tmp_path / "model")
    tok = _tokenizer()
    tok.save_pretrained(tmp_path / "model")

    g = torch.Generator().manual_seed(1)
    docs = []
    for _ in range(6):  # questions of different lengths: lm-eval batches (and pads) them
        q = " ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (int(torch.randint(2, 7, (1,), generator=g)),),
                                                           generator=g))
        choices = [" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (n,), generator=g)) for n in (1, 2, 3)]
        docs.append({"question": q, "choices": choices, "answer": int(torch.randint(0, 3, (1,), generator=g))})
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "toy_mc.yaml").write_text(TASK.format(data=data))

    # only the toy task is indexed (lm-eval's own thousands of task files take seconds to index)
    tasks = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False)
    results = simple_evaluate(model="hf", model_args=f"pretrained={tmp_path / 'model'},trust_remote_code=True,"
                                                     f"dtype=float32", tasks=["toy_mc"], batch_size=4, device="cpu",
                              log_samples=True, task_manager=tasks)
    samples = results["samples"]["toy_mc"]
    assert len(samples) == len(docs)
    messages = [r.getMessage() for r in caplog.records]
    assert "Using model type 'causal'" in messages  # the model type is registered as a causal LM
    assert not [m for m in messages if "neither marked" in m]

    def loglikelihood(context: str, continuation: str) -> float:
        ctx = tok(context)["input_ids"]
        cont = tok(continuation)["input_ids"]
        ids = torch.tensor([ctx + cont])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids)[0, :-1].double(), -1)
        return float(sum(logp[len(ctx) - 1 + j, t] for j, t in enumerate(cont)))

    correct = 0
    for s in samples:
        doc = s["doc"]
        got = [r[0][0] for r in s["resps"]]  # (loglikelihood, is_greedy) per choice
        want = [loglikelihood(doc["question"], c) for c in doc["choices"]]
        assert got == pytest.approx(want, abs=1e-4)
        correct += int(max(range(3), key=lambda i: want[i]) == doc["answer"])
    assert results["results"]["toy_mc"]["acc,none"] == pytest.approx(correct / len(docs))
