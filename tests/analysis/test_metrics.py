"""Metric functions on hand-made attention maps, activations, gates and loss curves."""

from __future__ import annotations

import math

import pytest

from gatedattn.train.divergence import first_divergence
import torch

from gatedattn.analysis import (
    AttentionStats,
    GateStats,
    differs_beyond_noise,
    diverged,
    first_token_attention,
    first_token_attention_per_head,
    gate_statistics,
    loss_spikes,
    massive_activation,
    mean_std,
    sink_fraction,
    sink_fraction_per_layer,
    sink_scores,
)

T = 8


def first_token_only(B: int = 2, H: int = 3, T: int = T) -> torch.Tensor:
    probs = torch.zeros(B, H, T, T)
    probs[..., 0] = 1.0
    return probs


def uniform_causal(B: int = 2, H: int = 3, T: int = T) -> torch.Tensor:
    mask = torch.tril(torch.ones(T, T))
    return (mask / mask.sum(-1, keepdim=True)).expand(B, H, T, T).clone()


def diagonal(B: int = 2, H: int = 3, T: int = T) -> torch.Tensor:
    return torch.eye(T).expand(B, H, T, T).clone()


def random_causal(B: int, H: int, T: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, H, T, T, generator=g) * 3
    logits = logits.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    return logits.softmax(-1)


# --------------------------------------------------------------------------- F-Attn, alpha


def test_head_on_first_token_has_fattn_and_alpha_one():
    probs = first_token_only()
    assert first_token_attention(probs) == pytest.approx(1.0)
    assert torch.allclose(first_token_attention_per_head(probs), torch.ones(3, dtype=torch.float64))
    assert torch.allclose(sink_scores(probs), torch.ones(3, dtype=torch.float64))


def test_uniform_causal_map_matches_closed_form():
    probs = uniform_causal()
    fattn = sum(1 / (i + 1) for i in range(1, T)) / (T - 1)
    alpha = sum(1 / (i + 1) for i in range(T)) / T
    assert first_token_attention(probs) == pytest.approx(fattn)
    assert sink_scores(probs).tolist() == pytest.approx([alpha] * 3)


def test_diagonal_map_has_no_first_token_attention():
    probs = diagonal()
    assert first_token_attention(probs) == pytest.approx(0.0)
    assert sink_scores(probs).tolist() == pytest.approx([1 / T] * 3)


def test_per_head_values_and_sink_mass_rows():
    # head 0: first token only; head 1: diagonal; head 2: uniform with half the mass on a sink
    probs = torch.stack(
        [first_token_only(1, 1)[0, 0], diagonal(1, 1)[0, 0], uniform_causal(1, 1)[0, 0] * 0.5]
    )
    probs = probs.unsqueeze(0)  # (1, 3, T, T); head 2 rows sum to 0.5
    fattn_uniform = sum(1 / (i + 1) for i in range(1, T)) / (T - 1)
    alpha_uniform = sum(1 / (i + 1) for i in range(T)) / T
    per_head = first_token_attention_per_head(probs).tolist()
    assert per_head == pytest.approx([1.0, 0.0, 0.5 * fattn_uniform])
    assert first_token_attention(probs) == pytest.approx((1.0 + 0.5 * fattn_uniform) / 3)
    assert sink_scores(probs).tolist() == pytest.approx([1.0, 1 / T, 0.5 * alpha_uniform])


def test_single_token_sequence_has_undefined_fattn():
    probs = torch.ones(1, 2, 1, 1)
    assert math.isnan(first_token_attention(probs))
    assert sink_scores(probs).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("shape", [(2, 3, 4), (1, 2, 4, 5)])
def test_attention_rejects_bad_shapes(shape):
    with pytest.raises(ValueError, match="B, H, T, T"):
        first_token_attention(torch.zeros(shape))


def test_sink_fraction_counts_layer_head_pairs_above_eps():
    alphas = [torch.tensor([0.9, 0.1, 0.31, 0.3]), torch.tensor([0.0, 0.05]), torch.tensor([0.5, 0.6])]
    assert sink_fraction(alphas) == pytest.approx(4 / 8)
    assert sink_fraction_per_layer(alphas) == pytest.approx([0.5, 0.0, 1.0])
    assert sink_fraction(alphas, eps=0.55) == pytest.approx(2 / 8)
    with pytest.raises(ValueError):
        sink_fraction([])


def test_attention_stats_equals_one_shot_over_concatenated_batches():
    batches = [random_causal(2, 4, 16, seed) for seed in range(3)] + [uniform_causal(1, 4, 16)]
    stats = AttentionStats()
    for b in batches:
        stats.update(b)
    whole = torch.cat(batches)
    assert torch.allclose(stats.first_token_attention_per_head(), first_token_attention_per_head(whole))
    assert stats.first_token_attention() == pytest.approx(first_token_attention(whole))
    assert torch.allclose(stats.sink_scores(), sink_scores(whole))
    # the batches differ, so a mean of per-batch results would not be enough to pass
    assert not torch.allclose(sink_scores(batches[0]), sink_scores(whole))


def test_attention_stats_weights_queries_when_lengths_differ():
    stats = AttentionStats()
    stats.update(first_token_only(1, 2, 3))  # 2 queries >= 1 with prob 1, 3 queries >= 0
    stats.update(diagonal(1, 2, 5))  # 4 queries >= 1 with prob 0, query 0 has prob 1
    assert stats.first_token_attention() == pytest.approx(2 / 6)
    assert stats.sink_scores().tolist() == pytest.approx([4 / 8, 4 / 8])


def test_attention_stats_errors():
    stats = AttentionStats()
    with pytest.raises(ValueError, match="no data"):
        stats.sink_scores()
    stats.update(uniform_causal(1, 2))
    with pytest.raises(ValueError, match="heads"):
        stats.update(uniform_causal(1, 3))


# --------------------------------------------------------------------------- massive activations


def test_massive_activation_finds_planted_value():
    hidden = torch.full((2, 5, 6), 0.5)
    hidden[1] = -1.0
    hidden[1, 3, 4] = -400.0  # |h|: 30 halves, 29 ones, one 400 -> median (0.5 + 1) / 2
    m = massive_activation(hidden)
    assert m["max_abs"] == pytest.approx(400.0)
    assert (m["batch"], m["position"], m["channel"]) == (1, 3, 4)
    assert m["median_abs"] == pytest.approx(0.75)
    assert m["ratio"] == pytest.approx(400.0 / 0.75)


def test_massive_activation_odd_count_median_and_zero_median():
    hidden = torch.tensor([[[1.0, -2.0, 3.0, 7.0, 0.5]]])
    m = massive_activation(hidden)
    assert m["median_abs"] == pytest.approx(2.0)
    assert (m["max_abs"], m["position"], m["channel"]) == (pytest.approx(7.0), 0, 3)
    assert massive_activation(torch.tensor([[[0.0, 0.0, 5.0]]]))["ratio"] == math.inf


def test_massive_activation_rejects_wrong_rank():
    with pytest.raises(ValueError, match="B, T, D"):
        massive_activation(torch.zeros(4, 4))


# --------------------------------------------------------------------------- gates


def test_gate_statistics_on_known_values():
    scores = torch.tensor([0.0005, 0.005, 0.2, 0.8] * 25).reshape(4, 5, 5)
    s = gate_statistics(scores)
    assert s["count"] == 100
    assert s["mean"] == pytest.approx((0.0005 + 0.005 + 0.2 + 0.8) / 4)
    assert s["frac_below_0.001"] == pytest.approx(0.25)
    assert s["frac_below_0.01"] == pytest.approx(0.5)


def test_gate_stats_streaming_equals_one_shot_over_all_layers():
    g = torch.Generator().manual_seed(0)
    layers = [torch.rand(3, 7, 4, generator=g) ** 4 for _ in range(3)]  # different sizes below
    layers.append(torch.rand(2, 9, 4, generator=g) ** 8)
    stats = GateStats(n_bins=20)
    for scores in layers:
        stats.update(scores)
    flat = torch.cat([s.reshape(-1) for s in layers])
    one_shot = gate_statistics(flat)
    summary = stats.summary()
    assert summary["count"] == one_shot["count"] == flat.numel()
    for key in ("mean", "frac_below_0.01", "frac_below_0.001"):
        assert summary[key] == pytest.approx(one_shot[key], rel=1e-12)
    edges, counts = stats.histogram()
    ref, _ = torch.histogram(flat.double(), bins=20, range=(0.0, 1.0))
    assert edges.tolist() == pytest.approx([k / 20 for k in range(21)])
    assert counts.tolist() == ref.long().tolist()


def test_gate_stats_merge_equals_single_accumulator():
    a, b, both = GateStats(10), GateStats(10), GateStats(10)
    x, y = torch.tensor([0.0, 0.25, 1.0]), torch.tensor([0.999, 0.5, 0.05])
    a.update(x)
    b.update(y)
    both.update(x)
    both.update(y)
    a.merge(b)
    assert a.summary() == both.summary()
    assert a.histogram()[1].tolist() == both.histogram()[1].tolist() == [2, 0, 1, 0, 0, 1, 0, 0, 0, 2]
    with pytest.raises(ValueError, match="bins"):
        a.merge(GateStats(5))


def test_gate_stats_counts_out_of_range_and_nan_separately():
    stats = GateStats(n_bins=4)
    stats.update(torch.tensor([-0.3, -0.0001, 0.0, 0.3, 1.0, 1.2, 3.0, float("nan")]))
    _, counts = stats.histogram()
    assert (stats.underflow, stats.overflow, stats.nan_count) == (2, 2, 1)
    assert counts.tolist() == [1, 1, 0, 1]
    assert counts.sum() + stats.underflow + stats.overflow + stats.nan_count == stats.count == 8
    assert math.isnan(stats.summary()["mean"])
    assert stats.summary()["frac_below_0.001"] == pytest.approx(3 / 8)


# --------------------------------------------------------------------------- training runs


def noisy_decreasing_loss(n: int = 600, seed: int = 0) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    trend = 3.0 + 5.0 * torch.exp(-torch.arange(n) / 80.0)
    return (trend + 0.05 * torch.randn(n, generator=g)).tolist()


def test_loss_spikes_finds_planted_spikes_and_ignores_noise():
    losses = noisy_decreasing_loss()
    assert loss_spikes(losses) == []
    losses[200] += 2.0
    losses[401] *= 1.5
    losses[402] *= 1.5
    assert loss_spikes(losses) == [200, 401, 402]


def test_loss_spikes_absolute_margin_and_steps():
    losses = [2.0] * 20 + [2.3] + [2.0] * 5 + [2.6]
    assert loss_spikes(losses, margin=0.5, relative=False) == [26]
    assert loss_spikes(losses, margin=0.1, relative=True) == [20, 26]
    steps = list(range(0, 10 * len(losses), 10))
    assert loss_spikes(losses, margin=0.5, relative=False, steps=steps) == [260]


def test_loss_spikes_window_limits_history():
    losses = [10.0] * 5 + [1.0] * 5 + [1.5]
    assert loss_spikes(losses, window=3, margin=0.2) == [10]
    assert loss_spikes(losses, window=20, margin=0.2) == []  # median of 10s and 1s is 5.5
    assert loss_spikes([1.0, 1.5, 1.0], window=1) == [1]  # the step itself is not its history


def test_non_finite_losses_are_spikes_and_divergence():
    losses = noisy_decreasing_loss(200)
    assert not diverged(losses)
    losses[150] = float("nan")
    losses[151] = float("inf")
    assert loss_spikes(losses)[:2] == [150, 151]
    assert diverged(losses)


def test_diverged_is_the_trainers_rule():
    """The loss-curve check and the trainer stop on the same rule (train/divergence.py):
    a non-finite loss, or a loss above diverge_factor x the first loss."""
    losses = noisy_decreasing_loss(300)  # starts near 8.0, ends near 3.0
    assert not diverged(losses + [9.0])  # one late spike below 2 x 8.0
    assert diverged(losses + [17.0])  # above 2 x the first loss
    assert not diverged(losses + [17.0], diverge_factor=3.0)
    assert first_divergence(losses + [17.0]) == (300, first_divergence(losses + [17.0])[1])
    assert "diverge_factor 2" in first_divergence(losses + [17.0])[1]
    with pytest.raises(ValueError):
        diverged([])


def test_mean_std_and_noise_rule():
    mean, std = mean_std([1.0, 2.0, 3.0])
    assert (mean, std) == (pytest.approx(2.0), pytest.approx(1.0))
    mean, std = mean_std([4.0])
    assert mean == 4.0 and math.isnan(std)
    # |2.0 - 2.5| = 0.5 vs 2 * sqrt(2) * 0.1 = 0.283: beyond noise; with std 1.0 it is not
    assert differs_beyond_noise([1.9, 2.0, 2.1], [2.4, 2.5, 2.6]) is True
    assert differs_beyond_noise([1.0, 2.0, 3.0], [1.5, 2.5, 3.5]) is False
    assert differs_beyond_noise([2.0], [3.0, 3.1]) is None
    assert differs_beyond_noise([2.0, float("nan")], [3.0, 3.1]) is None
