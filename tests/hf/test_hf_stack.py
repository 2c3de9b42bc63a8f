"""A gatedattn model loaded through AutoModelForCausalLM in transformers' training and
evaluation stack: padding, inputs_embeds, embedding resizing, activation checkpointing,
Trainer with a padding collator (save and resume), PEFT LoRA."""

import pytest
import torch

from gatedattn import GatedLM, ModelConfig

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402

from gatedattn.infra.errors import GatedAttnError  # noqa: E402
from gatedattn.hf.register import register_auto  # noqa: E402

V = 60


def saved(tmp_path, variant="gated", **fields):
    register_auto()
    attention_fields = {"kv": "mla"} if fields.pop("mla", False) else None
    model = GatedLM(ModelConfig.from_preset("micro", variant, vocab_size=V, attention_fields=attention_fields,
                                            **fields))
    with torch.no_grad():  # sinks and gates away from their initial values
        for name, p in model.named_parameters():
            if name.endswith("sink"):
                p.add_(torch.randn_like(p))
    model.save_pretrained(tmp_path / "m")
    return AutoModelForCausalLM.from_pretrained(tmp_path / "m")


def left_pad(rows):
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, T - len(r):], mask[i, T - len(r):] = r, 1
    return ids, mask


# ----------------------------------------------------------------------------- padding
@pytest.mark.parametrize("variant", ["gated", "hyga-sink", "mla"])
def test_padded_forward_and_batched_generation_match_single_rows(tmp_path, variant):
    model = saved(tmp_path, "gated", mla=True) if variant == "mla" else saved(tmp_path, variant)
    rows = [torch.randint(1, V, (n,)) for n in (5, 2, 4)]
    ids, mask = left_pad(rows)
    logits = model(ids, attention_mask=mask).logits
    out = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    for i, r in enumerate(rows):
        assert torch.allclose(logits[i, -len(r):], model(r[None]).logits[0], atol=1e-5), i
        alone = model.generate(r[None], max_new_tokens=6, do_sample=False, pad_token_id=0)[0]
        assert torch.equal(out[i, ids.shape[1] - len(r):], alone), i


def test_labels_minus_100_are_ignored_as_transformers_does(tmp_path):
    model = saved(tmp_path)
    ids, mask = left_pad([torch.randint(1, V, (n,)) for n in (6, 3)])
    labels = ids.masked_fill(mask == 0, -100)
    out = model(ids, attention_mask=mask, labels=labels)
    logits = out.logits[:, :-1].flatten(0, 1)
    target = labels[:, 1:].flatten()
    keep = target != -100
    expected = torch.nn.functional.cross_entropy(logits[keep], target[keep])
    assert torch.allclose(out.loss, expected, atol=1e-6)
    # a right-padded row (what DataCollatorForLanguageModeling makes) has the loss of the row alone
    row = ids[1:, -3:]
    right = torch.cat((row, torch.zeros(1, 3, dtype=torch.long)), 1)
    right_mask = torch.tensor([[1, 1, 1, 0, 0, 0]])
    padded = model(right, attention_mask=right_mask, labels=right.masked_fill(right_mask == 0, -100)).loss
    assert torch.allclose(model(row, labels=row).loss, padded, atol=1e-6)


# ----------------------------------------------------------------------------- inputs_embeds
def test_inputs_embeds_forward_and_generate(tmp_path):
    model = saved(tmp_path, "hyga")
    ids, mask = left_pad([torch.randint(1, V, (n,)) for n in (5, 3)])
    embeds = model.get_input_embeddings()(ids)
    assert torch.allclose(model(inputs_embeds=embeds, attention_mask=mask).logits,
                          model(ids, attention_mask=mask).logits, atol=1e-6)
    from_ids = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    from_embeds = model.generate(inputs_embeds=embeds, attention_mask=mask, max_new_tokens=5, do_sample=False,
                                 pad_token_id=0)
    assert torch.equal(from_embeds, from_ids[:, ids.shape[1]:])  # transformers returns only the new tokens
    with pytest.raises(GatedAttnError, match="exactly one"):
        model(ids, inputs_embeds=embeds)
    with pytest.raises(GatedAttnError, match="d_model=64"):
        model(inputs_embeds=embeds[..., :10])


# ----------------------------------------------------------------------------- embeddings
@pytest.mark.parametrize("tied", [True, False])
def test_resize_token_embeddings(tmp_path, tied):
    model = saved(tmp_path, "gated", tie_embeddings=tied)
    ids = torch.randint(0, V, (2, 5))
    before = model(ids).logits
    emb = model.resize_token_embeddings(V + 7)
    assert emb is model.get_input_embeddings() and emb.num_embeddings == V + 7
    assert model.get_output_embeddings().weight.shape == (V + 7, 64)
    assert model.config.vocab_size == V + 7 and model.model.cfg.vocab_size == V + 7
    assert (model.get_output_embeddings().weight is emb.weight) == tied
    after = model(torch.cat((ids, torch.tensor([[V + 6], [V]])), 1)).logits  # the new ids are accepted
    assert after.shape[-1] == V + 7
    assert torch.allclose(after[:, :5, :V], before, atol=1e-6)  # old tokens, old logits
    model.save_pretrained(tmp_path / "resized")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "resized")
    assert torch.equal(again(ids).logits, model(ids).logits)
    model.resize_token_embeddings(V - 10)
    assert model(ids.clamp(max=V - 11)).logits.shape[-1] == V - 10


def test_set_embeddings_checks_their_shape(tmp_path):
    model = saved(tmp_path)
    with pytest.raises(GatedAttnError, match="d_model=64"):
        model.set_input_embeddings(torch.nn.Embedding(V, 32))
    with pytest.raises(GatedAttnError, match="d_model=64"):
        model.set_output_embeddings(torch.nn.Linear(32, V))


# ----------------------------------------------------------------------------- checkpointing
@pytest.mark.parametrize("every", [1, 2])
def test_activation_checkpointing_gives_the_same_gradients(tmp_path, monkeypatch, every):
    from gatedattn.models.lm import Block

    model = saved(tmp_path, "hyga-sink")
    model.train()
    ids, mask = left_pad([torch.randint(1, V, (n,)) for n in (7, 4)])
    labels = ids.masked_fill(mask == 0, -100)

    def grads():
        model.zero_grad()
        model(ids, attention_mask=mask, labels=labels).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain = grads()
    calls = []
    forward = Block.forward
    index = {id(b): i for i, b in enumerate(model.model.blocks)}
    monkeypatch.setattr(Block, "forward", lambda self, *a, **k: calls.append(index[id(self)]) or forward(self, *a, **k))
    if every == 1:  # the older name (deprecated in transformers 5), and the current one
        with pytest.warns(FutureWarning):
            model.gradient_checkpointing_enable()
    else:
        model.activation_checkpointing_enable(every_n_layers=every)
    assert model.is_activation_checkpointing
    checkpointed = grads()
    # a checkpointed block runs again in backward
    assert sorted(calls) == sorted([0, 1] + [i for i in range(2) if i % every == 0])
    model.activation_checkpointing_disable()
    calls.clear()
    grads()
    assert calls == [0, 1] and not model.is_activation_checkpointing
    for name, g in plain.items():
        assert torch.allclose(g, checkpointed[name], atol=1e-6), name


# ----------------------------------------------------------------------------- Trainer
def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(V - 2)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


@pytest.mark.slow
def test_trainer_with_padding_collator_saves_resumes_and_learns(tmp_path):
    pytest.importorskip("accelerate")
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    tok = _tokenizer()
    g = torch.Generator().manual_seed(0)
    # variable-length counting sequences: learnable, and padded by the collator
    texts = []
    for _ in range(64):
        start, n = int(torch.randint(2, 20, (1,), generator=g)), int(torch.randint(4, 12, (1,), generator=g))
        texts.append(" ".join(f"w{start + j}" for j in range(n)))
    data = [{"input_ids": tok(t)["input_ids"]} for t in texts]
    collator = DataCollatorForLanguageModeling(tok, mlm=False)
    assert (collator(data[:8])["attention_mask"] == 0).any()  # really padded

    def trainer(out, steps):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "init")
        args = TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=8,
                                 learning_rate=3e-3, lr_scheduler_type="constant", logging_steps=1, save_steps=4,
                                 report_to=[], use_cpu=True, seed=0, data_seed=0, dataloader_num_workers=0,
                                 disable_tqdm=True, activation_checkpointing=True)
        return Trainer(model=model, args=args, train_dataset=data, data_collator=collator)

    GatedLM(ModelConfig.from_preset("micro", "hyga-sink", vocab_size=V)).save_pretrained(tmp_path / "init")
    eval_batch = collator(data[:16])

    def loss_of(model):
        model.eval()
        with torch.no_grad():
            return float(model(**eval_batch).loss)

    straight = trainer(tmp_path / "a", 8)
    start_loss = loss_of(straight.model)
    straight.train()
    assert straight.model.model.checkpoint_every == 1
    assert (tmp_path / "a" / "checkpoint-4" / "model.safetensors").is_file()
    end_loss = loss_of(straight.model)
    assert end_loss < start_loss - 0.3, (start_loss, end_loss)

    resumed = trainer(tmp_path / "a", 8)
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-4"))
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.allclose(p, q, atol=1e-5), name
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "checkpoint-8")
    assert abs(loss_of(again) - end_loss) < 1e-5


# ----------------------------------------------------------------------------- PEFT
LORA_TARGETS = {
    "gated": ["q_proj", "k_proj", "v_proj", "o_proj", "gate.x.proj"],
    "hyga": ["q_proj", "k_proj", "v_proj", "o_proj", "gate.x.proj", "gate.c.proj"],
    "hyga-lowrank": ["q_proj", "k_proj", "v_proj", "o_proj", "gate.x.down", "gate.c.proj"],
}


@pytest.mark.parametrize("variant", list(LORA_TARGETS))
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft reads it
def test_lora_on_attention_and_gate_projections(tmp_path, variant):
    peft = pytest.importorskip("peft")
    model = saved(tmp_path, variant)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS[variant]))
    wrapped = {n.rsplit(".", 1)[0] for n, _ in lora.named_parameters() if "lora_B" in n}
    assert len(wrapped) == 2 * len(LORA_TARGETS[variant])  # every target in both blocks
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)
    ids, mask = left_pad([torch.randint(1, V, (n,)) for n in (6, 4)])
    lora.train()  # the training (fused) paths must apply the adapters too
    train_logits = lora(input_ids=ids, attention_mask=mask).logits
    train_logits.float().pow(2).mean().backward()
    for n, p in lora.named_parameters():
        if "lora_A" in n:
            assert p.grad is not None and p.grad.abs().sum() > 0, n
    lora.eval()
    with torch.no_grad():
        eval_logits = lora(input_ids=ids, attention_mask=mask).logits
        with lora.disable_adapter():
            base_logits = lora(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(train_logits, eval_logits, atol=1e-5)
    assert not torch.allclose(eval_logits, base_logits, atol=1e-3)
    merged = lora.merge_and_unload()
    assert type(merged).__name__ == "GatedAttnForCausalLM"
    with torch.no_grad():
        assert torch.allclose(merged(ids, attention_mask=mask).logits, eval_logits, atol=1e-5)


def test_from_pretrained_takes_what_evaluation_harnesses_pass(tmp_path):
    saved(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m", gguf_file=None, quantization_config=None,
                                                 device_map={"": "cpu"}, dtype=torch.float32)
    assert model.device.type == "cpu"
    assert model.config.max_position_embeddings == model.model.cfg.max_seq_len == 256  # the context lm-eval keeps
    with pytest.raises(GatedAttnError, match="argument 'gguf_file' is not supported"):
        type(model).from_pretrained(tmp_path / "m", gguf_file="model.gguf")
    with pytest.raises(GatedAttnError, match="splits the model"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "m", device_map={"model.embed": "cpu", "model.blocks": "cpu"})
