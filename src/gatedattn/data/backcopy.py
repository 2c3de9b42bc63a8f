"""The Bigram-Backcopy task (Guo et al. 2024, "Active-Dormant Attention Heads", arXiv 2410.13835).

A toy language on which attention sinks form within minutes on a CPU. Its ordinary tokens
are characters; a sequence is::

    BOS x1 x2 x3 ...

where ``x1`` is drawn from the non-trigger characters' frequencies and each next token is

- a *copy* when the current token is one of the ``n_triggers`` trigger tokens: the token
  just before the trigger (``x[i+1] = x[i-1]`` when ``x[i]`` is a trigger);
- a *bigram* draw otherwise: ``x[i+1] ~ table[x[i]]``.

Two families of tables. :meth:`BigramBackcopy.default` estimates the bigram table from the
characters of real text (the default corpus when its packages are installed, else a short
built-in public-domain passage, so it needs no network and no files); triggers are the
most frequent characters after the space. :meth:`BigramBackcopy.random_sparse` draws a
sparse table: each ordinary character is followed by a few random ordinary successors, or
by a trigger with a chosen frequency. Either way a trigger never follows a trigger
(``table[t, t']`` is 0 and the row renormalised), so the token before a trigger is always
an ordinary character and copies never chain.

Ordinary positions have nothing useful to attend to (the current token decides the next),
so a softmax head that must serve the trigger positions learns to park the others on BOS:
the attention sink, at toy scale.

Token ids: characters ``0 .. n_chars-1``, then ``BOS = n_chars``, ``EOS = n_chars + 1``
(EOS never occurs; the data format needs one). :meth:`BigramBackcopy.sample` returns
whole sequences; :meth:`BigramBackcopy.write_data_dir` writes a data directory that
``gatedattn.data.TokenData`` (and so the trainer) reads.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gatedattn.data.corpus import default_corpus
from gatedattn.data.loader import FORMAT_VERSION, MANIFEST_FILE, Manifest, SplitInfo, sha256_file
from gatedattn.infra.errors import ConfigError, GatedAttnError
from gatedattn.infra.integrity import tokenizer_fingerprint
from gatedattn.infra.io import atomic_write, atomic_write_text, discard_dir, replace_dir, temp_dir_beside

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
CHAIN_LEN = 4096  # the data-directory stream is made of independent chains this long

# Genesis 1:1-13, King James Version (public domain): the fallback source of the table.
FALLBACK_TEXT = (
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; "
    "and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. "
    "And God said, Let there be light: and there was light. And God saw the light, that it was good: and God "
    "divided the light from the darkness. And God called the light Day, and the darkness he called Night. And "
    "the evening and the morning were the first day. And God said, Let there be a firmament in the midst of the "
    "waters, and let it divide the waters from the waters. And God made the firmament, and divided the waters "
    "which were under the firmament from the waters which were above the firmament: and it was so. And God "
    "called the firmament Heaven. And the evening and the morning were the second day. And God said, Let the "
    "waters under the heaven be gathered together unto one place, and let the dry land appear: and it was so. "
    "And God called the dry land Earth; and the gathering together of the waters called he Seas: and God saw "
    "that it was good. And God said, Let the earth bring forth grass, the herb yielding seed, and the fruit tree "
    "yielding fruit after his kind, whose seed is in itself, upon the earth: and it was so. And the earth brought "
    "forth grass, and herb yielding seed after his kind, and the tree yielding fruit, whose seed was in itself, "
    "after his kind: and God saw that it was good. And the evening and the morning were the third day."
)


@dataclass(frozen=True, eq=False)
class BigramBackcopy:
    """One Bigram-Backcopy language: characters, bigram table, triggers (see module docstring).

    ``table`` (n_chars, n_chars) float64, rows sum to 1, ``table[t, t'] = 0`` for triggers
    ``t, t'``; ``initial`` (n_chars,) the first token's distribution (0 on triggers).
    """

    chars: tuple[str, ...]
    table: np.ndarray
    initial: np.ndarray
    triggers: tuple[int, ...]
    source: str

    def __post_init__(self) -> None:
        V = len(self.chars)
        if self.table.shape != (V, V) or self.initial.shape != (V,):
            raise ConfigError(f"BigramBackcopy.table must be ({V}, {V}) and initial ({V},); got "
                              f"{self.table.shape} and {self.initial.shape}")
        if not self.triggers or len(set(self.triggers)) != len(self.triggers) or not all(0 <= t < V for t in self.triggers):
            raise ConfigError(f"BigramBackcopy.triggers={self.triggers} must be distinct ids in [0, {V})")
        if not np.allclose(self.table.sum(1), 1.0) or not np.isclose(self.initial.sum(), 1.0):
            raise ConfigError("BigramBackcopy.table rows and initial must each sum to 1")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_text(cls, text: str, *, n_chars: int = 24, n_triggers: int = 3, smoothing: float = 0.1,
                  source: str = "text") -> "BigramBackcopy":
        """Estimate the table from the lower-cased characters of ``text``: the ``n_chars``
        most frequent characters (ties by code point), transitions between two of them
        counted, ``smoothing`` added to every count; triggers are the ``n_triggers`` most
        frequent characters other than the space."""
        if not 2 <= n_chars <= 256:
            raise ConfigError(f"BigramBackcopy n_chars={n_chars} must be in [2, 256]")
        if not 1 <= n_triggers < n_chars - 1:
            raise ConfigError(f"BigramBackcopy n_triggers={n_triggers} must be in [1, n_chars - 2 = {n_chars - 2}]")
        if smoothing <= 0:
            raise ConfigError(f"BigramBackcopy smoothing={smoothing} must be > 0")
        points = _words_by_one_space(text.lower())
        freq = np.bincount(points, minlength=0x110000)
        seen = np.flatnonzero(freq)
        if len(seen) < n_chars:
            raise GatedAttnError(f"the text has {len(seen)} distinct characters, fewer than n_chars={n_chars}")
        top = seen[np.lexsort((seen, -freq[seen]))][:n_chars]  # the most frequent, ties by code point
        chars = tuple(chr(c) for c in top)
        index = np.full(0x110000, -1, dtype=np.int64)
        index[top] = np.arange(n_chars)
        ids = index[points]
        a, b = ids[:-1], ids[1:]
        keep = (a >= 0) & (b >= 0)
        counts = np.bincount(a[keep] * n_chars + b[keep], minlength=n_chars * n_chars).reshape(n_chars, n_chars)
        triggers = tuple(i for i, c in enumerate(chars) if c != " ")[:n_triggers]
        table = counts.astype(np.float64) + smoothing
        table[np.ix_(triggers, triggers)] = 0.0
        table /= table.sum(1, keepdims=True)
        initial = np.bincount(ids[ids >= 0], minlength=n_chars).astype(np.float64) + smoothing
        initial[list(triggers)] = 0.0
        initial /= initial.sum()
        return cls(chars, table, initial, triggers, source)

    @classmethod
    def random_sparse(cls, *, n_chars: int = 24, n_triggers: int = 3, trigger_share: float = 0.2,
                      successors: int = 4, seed: int = 0) -> "BigramBackcopy":
        """A random sparse table over ``n_chars`` characters, the last ``n_triggers`` of
        them triggers: every ordinary character is followed by one of ``successors``
        ordinary characters (drawn without replacement, Dirichlet(1) weights) or, with
        probability ``f = trigger_share / (1 - trigger_share)``, by a trigger (uniformly),
        so that about ``trigger_share`` of the positions are triggers; a trigger row has
        ordinary successors only. The first token is uniform over the ordinary characters.
        Deterministic from ``seed``."""
        if not 2 <= n_chars <= 256:
            raise ConfigError(f"BigramBackcopy n_chars={n_chars} must be in [2, 256]")
        if not 1 <= n_triggers < n_chars - 1:
            raise ConfigError(f"BigramBackcopy n_triggers={n_triggers} must be in [1, n_chars - 2 = {n_chars - 2}]")
        n_ord = n_chars - n_triggers
        if not 1 <= successors <= n_ord:
            raise ConfigError(f"BigramBackcopy successors={successors} must be in [1, {n_ord}] (the ordinary "
                              f"characters: n_chars - n_triggers)")
        if not 0.0 < trigger_share < 0.5:
            raise ConfigError(f"BigramBackcopy trigger_share={trigger_share} must be in (0, 0.5) (a trigger is "
                              f"always followed by an ordinary copy, so at most every other position is one)")
        rng = np.random.default_rng(np.random.SeedSequence([seed, 3]))
        f = trigger_share / (1.0 - trigger_share)
        table = np.zeros((n_chars, n_chars))
        for a in range(n_chars):
            succ = rng.choice(n_ord, size=successors, replace=False)
            weights = rng.dirichlet(np.ones(successors))
            if a < n_ord:
                table[a, succ] = weights * (1.0 - f)
                table[a, n_ord:] = f / n_triggers
            else:
                table[a, succ] = weights
        initial = np.zeros(n_chars)
        initial[:n_ord] = 1.0 / n_ord
        chars = tuple(_RANDOM_ALPHABET[i] if i < len(_RANDOM_ALPHABET) else chr(0x100 + i) for i in range(n_chars))
        source = (f"a random sparse table ({successors} successors per character, triggers {trigger_share:g} of "
                  f"positions, seed {seed})")
        return cls(chars, table, initial, tuple(range(n_ord, n_chars)), source)

    @classmethod
    def default(cls, *, n_chars: int = 24, n_triggers: int = 3) -> "BigramBackcopy":
        """The table of the default corpus when installed, else of the built-in passage."""
        return _default(n_chars, n_triggers)

    # ------------------------------------------------------------------ ids
    @property
    def n_chars(self) -> int:
        return len(self.chars)

    @property
    def bos_id(self) -> int:
        return self.n_chars

    @property
    def eos_id(self) -> int:
        return self.n_chars + 1

    @property
    def vocab_size(self) -> int:
        return self.n_chars + 2

    def is_trigger(self, ids: np.ndarray) -> np.ndarray:
        """Boolean mask of trigger tokens, same shape as ``ids``."""
        return np.isin(ids, self.triggers)

    def fingerprint(self) -> str:
        """A short hash of the characters, table and triggers (which language this is)."""
        h = hashlib.sha256(json.dumps([self.chars, self.triggers]).encode())
        h.update(np.ascontiguousarray(self.table).tobytes())
        h.update(np.ascontiguousarray(self.initial).tobytes())
        return h.hexdigest()[:16]

    def describe(self) -> str:
        trig = ", ".join(repr(self.chars[t]) for t in self.triggers)
        return (f"Bigram-Backcopy: {self.n_chars} characters (bigram table from {self.source}), "
                f"triggers {trig}, table {self.fingerprint()}")

    # ------------------------------------------------------------------ sampling
    def chains(self, n: int, length: int, seed: int | np.random.SeedSequence) -> np.ndarray:
        """``n`` independent chains of ``length`` tokens (no BOS), int64 (n, length)."""
        if n < 0 or length < 1:
            raise GatedAttnError(f"chains needs n >= 0 and length >= 1, got n={n}, length={length}")
        rng = np.random.default_rng(seed)
        cdf = np.cumsum(self.table, axis=1)
        cdf[:, -1] = 1.0
        trig = np.zeros(self.n_chars, dtype=bool)
        trig[list(self.triggers)] = True
        out = np.empty((n, length), dtype=np.int64)
        out[:, 0] = rng.choice(self.n_chars, size=n, p=self.initial)
        u = rng.random((n, length))
        for i in range(1, length):
            cur = out[:, i - 1]
            bigram = (u[:, i, None] > cdf[cur]).sum(1)
            if i >= 2:
                out[:, i] = np.where(trig[cur], out[:, i - 2], bigram)
            else:
                out[:, i] = bigram  # the first token is never a trigger
        return out

    def sample(self, n: int, length: int, seed: int) -> np.ndarray:
        """``n`` sequences ``[BOS] + length tokens``, int64 (n, length + 1); a function of ``seed``."""
        seqs = np.empty((n, length + 1), dtype=np.int64)
        seqs[:, 0] = self.bos_id
        seqs[:, 1:] = self.chains(n, length, np.random.SeedSequence([seed, 1]))
        return seqs

    # ------------------------------------------------------------------ data directory
    def write_data_dir(self, out_dir: str | os.PathLike, *, train_tokens: int = 1 << 20,
                       val_tokens: int = 1 << 16, seed: int = 0) -> Path:
        """Write a data directory (``train.bin``, ``val.bin``, ``tokenizer.json``,
        ``manifest.json``) whose streams are independent chains of ``CHAIN_LEN`` tokens,
        end to end; the trainer reads windows of it with BOS put in front. A window that
        straddles two chains sees one non-bigram transition (one position in CHAIN_LEN).
        Deterministic from ``seed``; written atomically."""
        out = Path(out_dir)
        tmp = temp_dir_beside(out)
        try:
            splits = {}
            for k, (name, n_tokens) in enumerate((("train", train_tokens), ("val", val_tokens))):
                n = -(-n_tokens // CHAIN_LEN)
                stream = self.chains(n, CHAIN_LEN, np.random.SeedSequence([seed, 2, k])).reshape(-1)[:n_tokens]
                path = tmp / f"{name}.bin"
                stream.astype(np.uint16).tofile(path)
                splits[name] = SplitInfo(path.name, int(n_tokens), n, sha256_file(path))
            atomic_write_text(tmp / "tokenizer.json", self.tokenizer_json())
            manifest = Manifest(
                format_version=FORMAT_VERSION, dtype="uint16", vocab_size=self.vocab_size, bos_id=self.bos_id,
                eos_id=self.eos_id, bos_token=BOS_TOKEN, eos_token=EOS_TOKEN, tokenizer_file="tokenizer.json",
                tokenizer_origin="bigram-backcopy", source=f"{self.describe()}, seed {seed}", seed=seed,
                val_fraction=val_tokens / (train_tokens + val_tokens), train=splits["train"], val=splits["val"],
                val_document_ids=[f"chain-{i}" for i in range(splits["val"].documents)],
                tokenizer_sha256=tokenizer_fingerprint(tmp / "tokenizer.json"),
            )
            atomic_write(tmp / MANIFEST_FILE, manifest.save)
            replace_dir(tmp, out)
        except BaseException:
            discard_dir(tmp)
            raise
        return out

    def tokenizer_json(self) -> str:
        """A word-level ``tokenizers`` tokenizer: one token per character, BOS and EOS special."""
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # lazy: heavy (tokenizers)

        vocab = {c: i for i, c in enumerate(self.chars)} | {BOS_TOKEN: self.bos_id, EOS_TOKEN: self.eos_id}
        tok = Tokenizer(models.WordLevel(vocab, unk_token=EOS_TOKEN))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
        tok.decoder = decoders.Fuse()
        tok.add_special_tokens([BOS_TOKEN, EOS_TOKEN])
        return tok.to_str()


# Python's whitespace (str.isspace, what str.split() splits on) ends at U+3000
_LAST_SPACE = 0x3000


@functools.cache
def _is_space() -> np.ndarray:
    """A table over every code point: True where ``str.split()`` splits."""
    table = np.zeros(0x110000, dtype=bool)
    table[[c for c in range(_LAST_SPACE + 1) if chr(c).isspace()]] = True
    return table


def _words_by_one_space(text: str) -> np.ndarray:
    """The code points of ``" ".join(text.split())``: the words of ``text`` with one space
    between two, none at either end (what :meth:`BigramBackcopy.from_text` counts), made in
    array operations instead of Python strings."""
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    space = _is_space()[points]
    word = np.flatnonzero(~space)
    if not len(word):
        return points[:0]
    first_space = space & ~np.concatenate(([True], space[:-1]))  # a run's first, not at the start
    first_space[word[-1]:] = False  # nor after the last word
    points[space] = ord(" ")
    return points[~space | first_space]


_RANDOM_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


@functools.lru_cache(maxsize=4)
def _default(n_chars: int, n_triggers: int) -> BigramBackcopy:
    try:
        corpus = default_corpus()
    except GatedAttnError:
        return BigramBackcopy.from_text(FALLBACK_TEXT, n_chars=n_chars, n_triggers=n_triggers,
                                        source="the built-in Genesis 1:1-13 passage (KJV)")
    text = "\n".join(d.text for d in corpus.documents)
    return BigramBackcopy.from_text(text, n_chars=n_chars, n_triggers=n_triggers,
                                    source=f"the default corpus ({corpus.description()})")
