"""The random sparse family of Bigram-Backcopy tables."""

import numpy as np
import pytest

from gatedattn.data.backcopy import BigramBackcopy
from gatedattn.infra.errors import ConfigError


def test_random_table_is_sparse_and_hits_the_trigger_share():
    task = BigramBackcopy.random_sparse(n_chars=43, n_triggers=3, trigger_share=0.05, successors=4, seed=1)
    n_ord = 40
    assert task.triggers == (40, 41, 42) and len(set(task.chars)) == 43
    assert ((task.table[:n_ord, :n_ord] > 0).sum(1) == 4).all() and ((task.table[n_ord:, :n_ord] > 0).sum(1) == 4).all()
    assert (task.table[n_ord:, n_ord:] == 0).all()  # a trigger never follows a trigger
    assert task.initial[n_ord:].sum() == 0
    seqs = task.sample(2000, 64, seed=0)
    trig = task.is_trigger(seqs[:, 1:])
    assert trig.mean() == pytest.approx(0.05, abs=0.005)
    body = seqs[:, 1:]
    after = trig[:, 1:-1]
    np.testing.assert_array_equal(body[:, 2:][after], body[:, :-2][after])  # every trigger copies
    often = BigramBackcopy.random_sparse(n_chars=43, n_triggers=3, trigger_share=0.22, seed=1)
    assert task.is_trigger(often.sample(2000, 64, seed=0)[:, 1:]).mean() == pytest.approx(0.22, abs=0.01)


def test_random_table_is_a_function_of_its_seed():
    a, b = (BigramBackcopy.random_sparse(seed=3) for _ in range(2))
    assert a.fingerprint() == b.fingerprint() and np.array_equal(a.table, b.table)
    assert BigramBackcopy.random_sparse(seed=4).fingerprint() != a.fingerprint()
    assert "random sparse table" in a.describe()


@pytest.mark.parametrize("kw,match", [
    (dict(successors=0), r"successors=0 must be in \[1, 21\]"),
    (dict(successors=22), r"successors=22 must be in \[1, 21\]"),
    (dict(trigger_share=0.5), r"trigger_share=0.5 must be in \(0, 0.5\)"),
    (dict(trigger_share=0.0), r"trigger_share=0.0 must be in \(0, 0.5\)"),
    (dict(n_triggers=23), r"n_triggers=23 must be in \[1, n_chars - 2 = 22\]"),
    (dict(n_chars=300), r"n_chars=300 must be in \[2, 256\]"),
])
def test_random_table_refuses_bad_fields(kw, match):
    with pytest.raises(ConfigError, match=match):
        BigramBackcopy.random_sparse(**kw)
