"""``gatedattn bench``: speed and memory of the attention variants, against baseline and transformers.

``run_bench(BenchConfig(...))`` returns the results as a dict (see ``runner``);
``format_markdown`` renders them. Parts: ``timing`` (interleaved repeats, median and
spread), ``memory`` (CUDA allocator peak, CPU saved-tensor meter), ``step`` (the training
step), ``workloads`` (what is timed), ``kvcache`` (cache bytes per token), ``targets``.
"""
