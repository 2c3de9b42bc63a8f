"""The papers' reported figures and statements, written once: the variant table
(``gatedattn variants``), the claims of the reproduction report, the mechanism study's
claims and the README read them from here.

Gated Attention (Qiu et al. 2025) reports its variants on a 15B mixture-of-experts model
trained on 400B tokens; its sink and massive-activation figures come from the same
models; HyGA reports average benchmark scores over its ablations.
"""

from __future__ import annotations

PPL_MODEL = "15B MoE"  # the model of the variant table's perplexities
PPL = {  # perplexity of each gate position / form, the papers' variant table
    "baseline": 6.026, "gated": 5.761, "gated-headwise": 5.792, "g2-value": 5.820, "g3-key": 6.016,
    "g4-query": 5.981, "g5-dense": 6.017, "g1-shared": 5.801, "g1-silu": 5.822, "g1-additive-silu": 5.821,
    "g1-ns-sigmoid": 5.900, "g1-static": 5.917, "sdpa-rmsnorm": 5.847, "sdpa-silu": 5.975,
}
F_ATTN = {"baseline": 0.467, "gated": 0.048, "gated-headwise": 0.073}  # attention on the first token
M_ACT = {"baseline": 1053, "gated": 94, "gated-headwise": 98}  # largest residual-stream activation
RULER_128K = {"baseline": 31.65, "gated": 58.82}  # RULER at 128k tokens with YaRN
GATE_SCORE_MEAN = 0.116  # mean G1 gate score (sparse: most scores near 0)
UNSTABLE_LR = 8e-3  # the baseline diverges at this learning rate; the gated model trains
OVERHEAD = 0.02  # the gate's wall-time cost stays under this share
HYGA_OVER_GATED = 1.53  # HyGA's average benchmark score over gated attention
HYGA_SINK_GAIN = 0.24  # the learnable sink's average score gain (HyGA ablation)
HYGA_LOWRANK = (32, 0.26)  # d_int 32 costs this share of the G1 gate's compute
SCALE = "1.7B–15B models trained on 400B–3.5T tokens"  # the papers' model and data scale
HYGA_H_GATE_GAIN = 1.21  # the H-gate's average score gain over gated attention (HyGA ablation)

# What the papers say about the attention sink, as the claims that test it quote them.
GUO_SINK = "dormant heads park their attention on BOS (Guo et al. 2024)"
GUO_DRAIN = "BOS's value state drains (Guo et al. 2024)"
GUO_PEAK = "BOS's residual state peaks (Guo et al. 2024; Sun et al. 2024)"
GA_REMOVES_SINK = f"the G1 gate removes the sink: F-Attn {F_ATTN['baseline']} → {F_ATTN['gated']}"
GA_HEADWISE_SINK = f"a headwise gate removes it too: F-Attn {F_ATTN['baseline']} → {F_ATTN['gated-headwise']}"
GA_REMOVES_MACT = f"the gate removes massive activations: M-Act {M_ACT['baseline']} → {M_ACT['gated']}"
GA_SPARSE = f"gate scores are sparse and query-dependent (mean {GATE_SCORE_MEAN})"
HYGA_SINK_LEFT = ("gated attention still shows a non-negligible BOS sink ratio; HyGA's gates mitigate the sink "
                  "further")
HYGA_H_GATE = f"the H-gate adds +{HYGA_H_GATE_GAIN} avg score over gated attention (its sink not reported)"
HYGA_C_GATE = f"the C-gate with fusion adds +{HYGA_OVER_GATED} avg score (its sink not reported)"
LEARNABLE_SINK = (f"a learnable sink takes the no-op role (GPT-OSS; HyGA: +{HYGA_SINK_GAIN} avg score, in "
                  "functional overlap with the gate)")
