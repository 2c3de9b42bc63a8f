import atexit
import dataclasses
import functools
import gc
import os
import shutil
import tempfile

# torch.compile's on-disk kernel cache (/tmp/torchinductor_<user>) outlives a run; a kernel
# cached by a run with other CPU kernels (ATEN_CPU_CAPABILITY) can crash a later one. The
# suite compiles into a cache of its own. Set before torch is imported.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="gatedattn-tests-inductor-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)

# inductor checks that the compiler builds each vector ISA the CPU names by compiling a test
# program per ISA (~6 s of g++ in every process that compiles); the suite takes the CPU's word.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

# Peak FLOP/s (the MFU denominator) timed while tests run would stand in for the machine's
# in the user's cache; the suite keeps its own.
if "GATEDATTN_PEAK_CACHE" not in os.environ:
    os.environ["GATEDATTN_PEAK_CACHE"] = os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "peak_flops.json")

# What the project caches machine-wide (tokenizers built from GGUF files) goes to a cache of
# the suite's own, shared by its workers: the user's stays untouched.
os.environ["GATEDATTN_CACHE"] = SHARED_CACHE = os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "gatedattn-cache")

import pytest  # noqa: E402

# Under pytest-xdist (scripts/test.sh runs one worker per core) each worker computes on one
# thread, and so do the processes its tests start, so that they do not fight over the cores:
# OpenMP's (torch; numpy's OpenBLAS follows it) and rayon's (the tokenizers: training and
# encoding the bundled corpus), each read before its library starts its threads. (torch is
# imported where a test needs it: xdist's controller, which runs no test, never does.)
if os.environ.get("PYTEST_XDIST_WORKER"):
    gc.disable()  # while collection imports (pytest_collection_finish turns it back on)
    for threads in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS"):
        os.environ[threads] = "1"
    import torch

    torch.set_num_threads(1)


def pytest_collection_finish(session):
    """What collection imported (torch, transformers, the package, the test modules: some
    800,000 objects) stays for the whole run: frozen out of the cyclic garbage collector's
    scans, which otherwise walk it at every full collection, and the young generation
    collected ten times less often (the tests' short-lived objects are freed by reference
    counting). Each worker collects its own tests, and runs them with its collector so set.
    The figures are in docs/results.md, "The test suite's time"."""
    gc.freeze()
    gc.set_threshold(7000, 10, 10)
    gc.enable()


def pytest_collection_modifyitems(items):
    """The slow end-to-end tests first (a stable sort: the same order on every worker), so
    that under ``--dist worksteal`` they start at once and the short tests fill the gaps,
    instead of a long test starting last and running alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _seed():
    import torch

    torch.manual_seed(0)


@pytest.fixture(scope="session")
def default_corpus_dir(tmp_path_factory):
    """The bundled default corpus prepared once for the whole run, as ``gatedattn reproduce``
    prepares it (``reproduce.text.run.ensure_data``). Under pytest-xdist the workers share one
    copy: the first to take the lock prepares it, the others wait and reuse it."""
    import fcntl

    from gatedattn.data import prepare

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the directory every worker's base directory lies in
    path = root / "default-corpus" / "default-data-v1"
    with open(root / "default-corpus.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path / "manifest.json").is_file():
            prepare(None, path, default_corpus=True, progress=False)
    return path


@pytest.fixture
def default_cache(default_corpus_dir, tmp_path, monkeypatch):
    """``GATEDATTN_CACHE`` for one test: a directory of its own holding a copy of the
    prepared default corpus, so that the test neither prepares it again nor touches the
    shared one (the tokenizers the run builds stay shared)."""
    cache = tmp_path / "cache"
    shutil.copytree(default_corpus_dir, cache / default_corpus_dir.name)
    os.makedirs(os.path.join(SHARED_CACHE, "tokenizers"), exist_ok=True)
    os.symlink(os.path.join(SHARED_CACHE, "tokenizers"), cache / "tokenizers")  # built once for the whole run
    monkeypatch.setenv("GATEDATTN_CACHE", str(cache))
    return cache


@functools.cache
def _corpus_cut(every: int):
    """The bundled corpus cut to every ``every``-th document."""
    from gatedattn.data.corpus import default_corpus

    full = default_corpus()
    return dataclasses.replace(full, documents=full.documents[::every])


def _study_text(monkeypatch, every: int) -> None:
    from gatedattn.reproduce.pretrained import text

    monkeypatch.setattr(text, "default_corpus", functools.partial(_corpus_cut, every))


@pytest.fixture
def small_study_text(monkeypatch):
    """The real-model study's text cut to every tenth document of the bundled corpus, for
    a quick study on a tiny model: its small vocabulary spells the corpus in many short
    tokens (seconds to encode all of it), and the study reads a few windows of it. A test's
    ``monkeypatch.undo()`` undoes this too (patch inside ``monkeypatch.context()`` instead)."""
    _study_text(monkeypatch, 10)


@pytest.fixture
def tiny_study_text(monkeypatch):
    """As ``small_study_text``, every hundredth document (about a hundred, three held out):
    enough for ``--quick``'s few windows of 64 tokens and one of 96."""
    _study_text(monkeypatch, 100)


@pytest.fixture
def unrendered_plots(monkeypatch):
    """Plots laid out as the product lays them out but not rendered to PNG (the costly part
    of each; an empty file stands in), for an end-to-end test that checks a report's text and
    numbers. The plot tests and the main job's test render theirs and check what they draw."""
    import matplotlib.figure

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **k: None)
