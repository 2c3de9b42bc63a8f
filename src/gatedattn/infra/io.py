"""File input and output: atomic writes (a file is either the old version or the complete
new one) with the permissions the umask gives, atomic directories, JSON reading with a
depth limit and one policy for non-finite numbers, the JSON-lines reader, outputs that
may not overlap inputs, per-directory locks, and signals turned into one-line errors.

Temporaries are named ``.NAME.<random>.tmp`` (files and directories beside ``NAME``) and
``.NAME.<random>.old`` (a directory moved aside while its replacement is renamed in, where
the platform cannot swap two directories in one step). A temporary directory is held with
``flock`` by the process that made it, so the next run removes those of a killed process
(:func:`remove_stale_temporaries`) and never those of a live one; a ``.old`` left by a
killed replace is put back when its target is missing (:func:`recover_replaced`), so a
crash at any moment leaves either the old or the new output in place.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import fcntl
import json
import math
import os
import re
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from gatedattn.infra.errors import GatedAttnError, Interrupted
from gatedattn.infra.fmt import shown


def current_umask() -> int:
    """The process's umask (read without changing it where /proc allows)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def public_mode(path: str | os.PathLike, *, directory: bool = False) -> None:
    """Give ``path`` the mode a plain ``open``/``mkdir`` would (0o666 / 0o777 less the
    umask): ``mkstemp`` and ``mkdtemp`` make private ones, which would survive the rename."""
    os.chmod(path, (0o777 if directory else 0o666) & ~current_umask())


# A test's fault injection: called as ``FAULT_HOOK(point, path)`` at each step of a write
# (``"write"`` after a file's bytes are written, ``"replace:ready"``, ``"replace:swapped"``,
# ``"replace:aside"``, ``"replace:placed"`` during a directory replace); None in normal use.
FAULT_HOOK: Callable[[str, Path], None] | None = None


def _fault(point: str, path: Path) -> None:
    if FAULT_HOOK is not None:
        FAULT_HOOK(point, path)


NAME_MAX = 255
_RANDOM_PART = 40  # what mkstemp/mkdtemp add around a temporary's prefix (dots, 8 random characters, suffix), with room


def temp_prefix(name: str) -> str:
    """The prefix of the temporaries of an entry ``name``: ``.NAME.``, or, for a name so long
    that the temporary's would pass the file system's 255-byte limit, a shortened one that
    still names it alone (the start of the name and a hash of all of it)."""
    if len(os.fsencode(name)) + _RANDOM_PART <= NAME_MAX:
        return f".{name}."
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:12]
    keep = os.fsencode(name)[:NAME_MAX - _RANDOM_PART - 14].decode("utf-8", "ignore")
    return f".{keep}~{digest}."


def is_disk_full(e: BaseException) -> bool:
    """Whether ``e`` reports a full disk or quota: ``OSError`` ENOSPC/EDQUOT, or the text
    PyTorch's and the tokenizers library's writers give it."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(e)
    return "No space left on device" in text or "os error 28" in text or "file write failed" in text


def disk_full_error(path: str | os.PathLike, need: int | None = None) -> GatedAttnError:
    """The one line for a write that found the disk full: the file, the bytes it needs
    (when known) and those free."""
    path = Path(path)
    free = free_bytes(path)
    needs = f"needs {need:,} bytes, " if need is not None else ""
    return GatedAttnError(f"{path}: the disk is full ({needs}{free:,} bytes free there); nothing was replaced: "
                          f"free space and run the same command again")


def free_bytes(path: str | os.PathLike) -> int:
    """Free bytes (for an unprivileged user) on the file system of ``path``'s nearest existing parent."""
    p = Path(os.path.abspath(os.fspath(path)))
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return int(shutil.disk_usage(p).free)
    except OSError:
        return 1 << 62


@contextlib.contextmanager
def disk_full_named(path: str | os.PathLike, need: int | None = None) -> Iterator[None]:
    """Inside, a full disk reported in another library's words (``is_disk_full``) becomes
    the one line of :func:`disk_full_error` naming ``path``."""
    try:
        yield
    except GatedAttnError:
        raise
    except Exception as e:
        if not is_disk_full(e):
            raise
        raise disk_full_error(path, need) from None


FREE_MARGIN = 1 << 20  # room kept for the manifests and pointers written after a large file


def check_free_space(path: str | os.PathLike, need: int) -> None:
    """Refuse, before writing, a write of ``need`` bytes at ``path`` that the disk cannot
    hold (with :data:`FREE_MARGIN` to spare): one line naming the file and the bytes."""
    if need + FREE_MARGIN > free_bytes(path):
        raise disk_full_error(path, need + FREE_MARGIN)


def atomic_write(path: str | os.PathLike, write: Callable[[str], None], *, size: int | None = None) -> Path:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, fsync it, then
    rename it over ``path``. On any error the temporary file is removed, and an
    ``OSError`` names ``path`` (not the temporary); a full disk (also as PyTorch's and
    the tokenizers library's own errors) is one line naming ``path`` and, given ``size``
    (checked against the free space first), the bytes needed."""
    path = Path(path)
    if size is not None:
        check_free_space(path, size)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix(path.name), suffix=".tmp")
    except OSError as e:
        if is_disk_full(e):
            raise disk_full_error(path, size) from None
        raise GatedAttnError(f"{path}: cannot be written ({e.strerror or type(e).__name__})") from None
    os.close(fd)
    try:
        write(tmp)
        _fault("write", path)
        public_mode(tmp)  # after writing: a writer that recreates the file (safetensors) makes it private again
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, Exception) and is_disk_full(e):
            raise disk_full_error(path, size) from None
        if isinstance(e, OSError):
            raise GatedAttnError(f"{path}: cannot be written ({e.strerror or type(e).__name__})") from None
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    return atomic_write(path, write)


def atomic_write_json(path: str | os.PathLike, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


# ---------------------------------------------------------------------------- JSON
MAX_JSON_DEPTH = 64  # deeper than any file the project reads; deeper ones are refused, not recursed into


def json_depth_problem(data: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``data`` nests lists/objects deeper than ``limit`` (checked without recursion)."""
    stack = [(data, 1)]
    while stack:
        obj, depth = stack.pop()
        if isinstance(obj, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (obj.values() if isinstance(obj, dict) else obj))
    return False


def loads_json(text: str | bytes, where: Any) -> Any:
    """Parse JSON ``text`` read from ``where``; bad JSON or nesting deeper than
    :data:`MAX_JSON_DEPTH` is a one-line ``GatedAttnError`` naming ``where``."""
    try:
        data = json.loads(text)
    except RecursionError:
        data = None
        deep = True
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GatedAttnError(f"{where} is not valid JSON: {e}") from None
    else:
        deep = json_depth_problem(data)
    if deep:
        raise GatedAttnError(f"{where} nests JSON deeper than {MAX_JSON_DEPTH} levels; it is not a file "
                             f"gatedattn wrote or reads")
    return data


def read_json(path: str | os.PathLike) -> Any:
    """The JSON value of the file ``path`` (see :func:`loads_json`); a missing file, a
    directory or an unreadable one is a ``GatedAttnError`` naming it."""
    path = Path(path)
    if not path.is_file():
        raise GatedAttnError(f"{path} is {'a directory, not a file' if path.is_dir() else 'missing'}")
    try:
        text = path.read_bytes()
    except OSError as e:
        raise GatedAttnError(f"{path}: cannot be read ({e.strerror or type(e).__name__})") from None
    return loads_json(text, path)


def read_json_object(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON object from ``path``; a missing file, bad or too deeply nested JSON or a
    non-object is a ``GatedAttnError`` naming the file."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise GatedAttnError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


# ---------------------------------------------------------------------------- directories
def _hold(directory: Path) -> int:
    """Open ``directory`` and take an exclusive ``flock`` on it (released when the process
    ends); the descriptor is returned."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def _unless_held(directory: Path) -> Iterator[bool]:
    """Hold ``directory`` for the body when no live process holds it; yields whether it could."""
    try:
        fd = _hold(directory)
    except OSError:  # held: a live process is writing or replacing it
        yield False
        return
    try:
        yield True
    finally:
        os.close(fd)


_HELD: dict[str, int] = {}  # temporary directory -> descriptor holding its flock
_HELD_LOCK = threading.Lock()


def _release(directory: str | os.PathLike) -> None:
    with _HELD_LOCK:
        fd = _HELD.pop(str(directory), None)
    if fd is not None:
        os.close(fd)


def temp_dir_beside(target: str | os.PathLike) -> Path:
    """A new, empty hidden directory ``.NAME.<random>.tmp`` next to ``target`` (same
    filesystem, so a rename into place is atomic), with the permissions of a new
    directory, held (``flock``) by this process until :func:`replace_dir` renames it or
    :func:`discard_dir` removes it. What a killed process left beside ``target`` is
    dealt with first: a half-done replace is finished or undone
    (:func:`recover_replaced`), its temporaries removed."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(target)
    try:
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=temp_prefix(target.name), suffix=".tmp"))
    except OSError as e:
        if is_disk_full(e):
            raise disk_full_error(target) from None
        raise
    public_mode(tmp, directory=True)
    with _HELD_LOCK:
        _HELD[str(tmp)] = _hold(tmp)
    return tmp


def discard_dir(tmp: str | os.PathLike) -> None:
    """Remove a temporary directory of :func:`temp_dir_beside` (after a failure)."""
    _release(tmp)
    shutil.rmtree(tmp, ignore_errors=True)


def temporaries_of(target: str | os.PathLike) -> list[Path]:
    """The ``.NAME.<random>.tmp`` / ``.old`` entries beside ``target``, by the project's own
    naming, nested ones included (``..NAME.<random>.tmp.<random>.tmp``: the temporary of a
    writer that itself writes through a temporary)."""
    target = Path(target)
    prefix = temp_prefix(target.name)
    pattern = re.compile(r"^\.*" + re.escape(prefix) + r"[A-Za-z0-9_]+\.(tmp|old)(\.[A-Za-z0-9_]+\.(tmp|old))*$")
    try:
        entries = list(target.parent.iterdir())
    except OSError:
        return []
    return [p for p in entries if pattern.match(p.name)]


def _fsync_dir(directory: str | os.PathLike) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike) -> None:
    """fsync every regular file and directory under ``root`` (links are not followed), so
    that what is renamed into place is on the disk before the old copy goes."""
    for here, dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(here, name)
            if os.path.isfile(path) and not os.path.islink(path):
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        _fsync_dir(here)


def recover_replaced(target: str | os.PathLike) -> bool:
    """Finish what a replace killed half-way (where the platform has no one-step swap)
    left beside ``target``: a ``.NAME.<random>.old`` holding the previous output is renamed
    back when ``target`` is missing, and removed when ``target`` is in place (a rename puts
    a whole directory there). One that a live process holds is left alone. Returns whether
    ``target`` was restored."""
    target = Path(target)
    restored = False
    for p in temporaries_of(target):
        if not p.name.endswith(".old") or p.is_symlink() or not p.is_dir():
            continue
        with _unless_held(p) as mine:
            if not mine:  # a live replace is under way
                continue
            old = p / "dir"
            if not (target.exists() or target.is_symlink()) and (old.exists() or old.is_symlink()):
                os.rename(old, target)
                _fsync_dir(target.parent)
                restored = True
            shutil.rmtree(p, ignore_errors=True)
    return restored


def remove_stale_temporaries(target: str | os.PathLike) -> list[Path]:
    """Remove the temporary directories (and files) beside ``target`` that no live process
    holds: what a killed ``data prepare``, ``convert`` or training run left, after putting
    back a previous output that a killed replace had moved aside
    (:func:`recover_replaced`). A directory another process is filling is left alone.
    Returns what was removed."""
    recover_replaced(target)
    removed = []
    for p in temporaries_of(target):
        if p.name.endswith(".old"):
            continue  # a live replace's (recover_replaced dealt with the others)
        if p.is_symlink() or not p.is_dir():
            with contextlib.suppress(OSError):  # an atomic file write's temporary: its writer is gone or done
                p.unlink()
                removed.append(p)
            continue
        with _unless_held(p) as mine:
            if mine:  # else a live process is writing it
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _libc_renameat2() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _libc_renameat2() if os.uname().sysname == "Linux" else None


def exchange(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Swap the entries ``a`` and ``b`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``);
    False where the platform or file system cannot (the caller then renames in two steps)."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(os.fspath(a)), _AT_FDCWD, os.fsencode(os.fspath(b)), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), os.fspath(b))


def replace_dir(new: str | os.PathLike, target: str | os.PathLike) -> None:
    """Put the finished directory ``new`` at ``target``, its files on the disk first. An
    existing ``target`` is swapped with ``new`` in one step (:func:`exchange`) and then
    removed; where that is unavailable it is moved aside into a held
    ``.NAME.<random>.old``, put back if the rename fails, and removed only once ``new`` is
    in place and synced (a kill in between leaves the ``.old``, which
    :func:`recover_replaced` puts back or removes)."""
    new, target = Path(new), Path(target)
    try:
        fsync_tree(new)
        _fault("replace:ready", target)
        if not target.exists() or (target.is_dir() and not target.is_symlink() and not any(target.iterdir())):
            os.replace(new, target)
            _fsync_dir(target.parent)
            return
        if exchange(new, target):
            _fsync_dir(target.parent)
            _fault("replace:swapped", target)
            _release(new)
            shutil.rmtree(new, ignore_errors=True)  # the previous output, now at the temporary's name
            return
        aside = Path(tempfile.mkdtemp(dir=target.parent, prefix=temp_prefix(target.name), suffix=".old"))
        held = _hold(aside)  # so that no other run takes it for a killed run's debris
        try:
            os.replace(target, aside / "dir")
            _fsync_dir(target.parent)
            try:
                _fault("replace:aside", target)
                os.replace(new, target)
                _fsync_dir(target.parent)
            except BaseException:
                os.replace(aside / "dir", target)
                raise
            _fault("replace:placed", target)
            shutil.rmtree(aside, ignore_errors=True)
        except BaseException:
            if not (aside / "dir").exists():
                shutil.rmtree(aside, ignore_errors=True)
            raise
        finally:
            os.close(held)
    finally:
        _release(new)


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Fill a temporary directory beside ``target``; on success it replaces ``target``
    in one rename, on any failure it is removed and ``target`` is untouched::

        with atomic_dir(out / "final") as tmp:
            write files into tmp
    """
    tmp = temp_dir_beside(target)
    try:
        yield tmp
        replace_dir(tmp, target)
    except BaseException:
        discard_dir(tmp)
        raise


# ---------------------------------------------------------------------------- outputs and inputs
def recover_missing(path: str | os.PathLike) -> None:
    """Before ``path`` is read or written: if it is missing, put back the previous version a
    killed replace left moved aside (:func:`recover_replaced`). Cheap when ``path`` exists."""
    if os.fspath(path) == "":
        return
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        with contextlib.suppress(OSError):
            recover_replaced(path)


def _resolved(path: str | os.PathLike) -> Path:
    return Path(os.path.realpath(os.path.abspath(os.fspath(path))))


def check_no_overlap(out: str | os.PathLike, what: str, inputs: Iterable[tuple[str, str | os.PathLike]]) -> None:
    """Refuse an output ``out`` (option ``what``) that is, contains or lies inside one of
    ``inputs`` (``(option, path)`` pairs), symlinks resolved: replacing it would delete
    the input. A previous output or input that a killed replace left moved aside is put
    back first (:func:`recover_replaced`)."""
    inputs = [(flag, path) for flag, path in inputs if path is not None]
    for path in (out, *(p for _, p in inputs)):
        recover_missing(path)
    o = _resolved(out)
    for flag, path in inputs:
        i = _resolved(path)
        if o == i:
            relation = "is"
        elif o in i.parents:
            relation = "contains"
        elif i in o.parents:
            relation = "lies inside"
        else:
            continue
        raise GatedAttnError(f"{what} {out} {relation} {flag} {path}; an output may not overlap an input "
                             f"(choose another {what})")


def check_replaceable(out: str | os.PathLike, what: str, markers: Iterable[str], kind: str) -> None:
    """``--force`` replaces an earlier output only: a non-empty ``out`` must hold one of
    ``markers`` (the files the project writes into every such output), or it is refused."""
    out = Path(out)
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not any((out / m).is_file() for m in markers):
        raise GatedAttnError(f"{what} {out} is not empty and is not a {kind} gatedattn wrote (no "
                             f"{' or '.join(markers)}); --force replaces only such an output: choose a new "
                             f"or empty directory")


# ---------------------------------------------------------------------------- locks
LOCK_FILE = ".gatedattn.lock"


class DirLock:
    """An exclusive lock on a directory: the file ``DIR/.gatedattn.lock``, held with
    ``flock`` and holding the owner's PID. The kernel releases it when the process ends
    (a killed run leaves no stale lock); the file is removed on release. A second owner
    gets a ``GatedAttnError`` naming the holder's PID."""

    def __init__(self, directory: str | os.PathLike, what: str):
        self.directory, self.what = Path(directory), what
        self.path = self.directory / LOCK_FILE
        self.fd: int | None = None
        self.created_dir = False

    def acquire(self) -> "DirLock":
        if not self.directory.exists():
            self.directory.mkdir(parents=True)
            self.created_dir = True
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666 & ~current_umask())
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                    raise
                raise GatedAttnError(f"{self.what} {self.directory} is in use by another gatedattn process "
                                     f"(PID {self._holder()}); wait for it to finish or stop it first") from None
            try:  # the file may have been removed by its last holder between open and flock: retry
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def _holder(self) -> str:
        try:
            return self.path.read_text(encoding="ascii").strip() or "unknown"
        except (OSError, UnicodeDecodeError):
            return "unknown"

    def release(self, *, remove_empty_dir: bool = False) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self.fd)
        self.fd = None
        if remove_empty_dir and self.created_dir:
            with contextlib.suppress(OSError):
                self.directory.rmdir()  # only when nothing else was written there

    def __enter__(self) -> "DirLock":
        return self.acquire()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.release(remove_empty_dir=exc_type is not None)


# ---------------------------------------------------------------------------- signals
@contextlib.contextmanager
def interruptible(message: Callable[[str], str] | str) -> Iterator[None]:
    """While inside: SIGINT and SIGTERM raise :class:`gatedattn.infra.errors.Interrupted` with the
    one line ``"<SIGNAL>: <message>"`` (what was kept and how to continue) and exit status
    128 + the signal. Outside the main thread (no signals there) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum, frame):
        name = signal.Signals(signum).name
        text = message(name) if callable(message) else message
        raise Interrupted(f"{name}: {text}", 128 + signum)

    old = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def argv_text(text: str) -> str:
    """A command-line argument as the UTF-8 text it is: under a C/POSIX locale Python decodes
    non-ASCII argument bytes as surrogates (``\udcc3``); they are decoded again as UTF-8
    (what is not UTF-8 stays as it was, for the caller to refuse)."""
    if not any("\udc80" <= ch <= "\udcff" for ch in text):
        return text
    try:
        return os.fsencode(text).decode("utf-8")
    except (UnicodeDecodeError, UnicodeEncodeError):
        return text


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, ±inf), which JSON cannot hold, as null;
    tuples become lists and keys strings. The one policy for every JSON file written."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file (``metrics.jsonl``), one per line; a line that
    does not parse (the torn last line of a crash mid-write) is dropped. A missing file
    has none."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return records


def check_writable(path: str | os.PathLike, what: str, *, kind: str = "file", replace: bool = True) -> Path:
    """Check, before any work, that ``path`` can be written: ``kind`` ``"file"`` (a file
    there may be replaced when ``replace``) or ``"dir"`` (created if absent). The nearest
    existing parent must be a writable directory. A problem is a ``GatedAttnError`` naming
    ``what`` (the option, e.g. ``--out``) and the path. Creates nothing."""
    if os.fspath(path) == "":
        raise GatedAttnError(f"{what}: an empty path; give a path")
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes, kept as surrogates: no report or JSON could name the output
        raise GatedAttnError(f"{what} {shown(os.fspath(path))}: the path is not valid UTF-8; choose a UTF-8 "
                             f"path") from None
    path = Path(path)
    recover_missing(path)
    if path.exists() or path.is_symlink():
        if kind == "file" and path.is_dir():
            raise GatedAttnError(f"{what} {path} is a directory; give a file name")
        if kind == "file" and not replace:
            raise GatedAttnError(f"{what} {path} exists; choose a new name")
        if kind == "dir" and not path.is_dir():
            raise GatedAttnError(f"{what} {path} exists and is not a directory")
        if not os.access(path, os.W_OK) or (kind == "file" and not os.access(path.parent, os.W_OK)):
            raise GatedAttnError(f"{what} {path} is not writable")
        return path
    parent = path.absolute().parent
    while not parent.exists():
        if parent.is_symlink():  # a dangling link
            raise GatedAttnError(f"{what} {path}: {parent} is a broken link")
        parent = parent.parent
    if not parent.is_dir():
        raise GatedAttnError(f"{what} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise GatedAttnError(f"{what} {path}: {parent} is not writable")
    return path
