"""Import GGUF files (llama.cpp's format) as ``GatedLM`` models.

``load_model`` reads a ``.gguf`` file, or a directory holding exactly one ``.gguf`` file
and no ``config.json``, through this module:

1. :func:`read_header` parses the header alone (metadata and tensor table, no tensor
   data) and refuses, in one line, a file that is not GGUF or is truncated, an
   architecture other than ``SUPPORTED_ARCHITECTURES``, a tensor type that cannot be
   dequantized, and metadata that transformers' loader would silently ignore (RoPE
   scaling);
2. the metadata becomes the HF config dict transformers' GGUF loader
   (``load_gguf_checkpoint``) would build, made here from the header with transformers' own
   key tables, and goes through the same importers (``gatedattn.hf.importers.IMPORTERS``) as
   a ``config.json``;
3. every tensor of the file must map to a HF name (checked before anything is
   dequantized); the tensors are then dequantized one at a time from the mapped file
   (gguf-py), through transformers' tensor processor for the architecture, and go, in HF
   names, through the same ``hf_specs`` mapping as safetensors weights (a
   :class:`~gatedattn.hf.checkpoint.DictTensorSource`).

The logits are those of ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)`` on
the same file (tested, with the config dict and every tensor). The tokenizer embedded in
the file is :func:`gguf_tokenizer` (built by transformers' converter once per machine).

Importing this module is cheap: gguf-py is imported by the header reader, transformers
only by the functions that need it.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import mmap
import os
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any, NamedTuple

import torch

from gatedattn.hf.checkpoint import DictTensorSource
from gatedattn.hf.importers import hf_config_object, hf_specs, importer_for, quiet_transformers, read_hf_state
from gatedattn.infra.cache import cache_root
from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.io import atomic_dir
from gatedattn.infra.sizes import check_model_size
from gatedattn.models.lm import GatedLM

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
SUFFIX = ".gguf"
MAGIC = b"GGUF"
VERSIONS = (2, 3)
# tensor types gguf-py dequantizes (gguf.quants.dequantize); integer types are not weights
FLOAT_TYPES = ("F32", "F16", "BF16")
QUANT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ1_S", "IQ1_M",
               "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4")
# metadata value types (GGUFValueType) of fixed width -> struct format
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
SMALL_ARRAY = 256  # numeric metadata arrays up to this length are read (per-layer values); longer ones are not


# --------------------------------------------------------------------------- header
class Array(NamedTuple):
    """A metadata array of strings or of more than ``SMALL_ARRAY`` numbers, kept as its
    element type and length (a vocabulary is not read here); smaller numeric arrays are
    read as lists."""

    element_type: int
    count: int


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the table: GGUF name, shape (torch order), type name, size in bytes
    and the byte of the file where its data starts."""

    name: str
    shape: tuple[int, ...]
    kind: str
    nbytes: int
    offset: int


@dataclass(frozen=True)
class Header:
    """A GGUF file's metadata (scalars, strings and small numeric arrays as lists; other
    arrays as :class:`Array`) and tensor table."""

    path: Path
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    metadata_end: int  # the byte where the metadata ends (the tokenizer's arrays are in [0, metadata_end))

    @property
    def architecture(self) -> str:
        return self.metadata.get("general.architecture")

    def key(self, suffix: str) -> Any:
        """The metadata value of ``<architecture>.<suffix>`` (None when absent)."""
        return self.metadata.get(f"{self.architecture}.{suffix}")


class _Cursor:
    """Little-endian reads from a buffer; running past its end raises ``struct.error``."""

    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self, keep: bool = True) -> str | None:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise struct.error(f"a string of {n} bytes at byte {self.pos} runs past the end")
        start, self.pos = self.pos, self.pos + n
        return bytes(self.buf[start:self.pos]).decode("utf-8") if keep else None

    def value(self, value_type: int) -> Any:
        if value_type in _SCALARS:
            return self.take(_SCALARS[value_type])
        if value_type == _STRING:
            return self.string()
        if value_type != _ARRAY:
            raise ValueError(f"unknown metadata value type {value_type}")
        element_type, count = self.take("<I"), self.take("<Q")
        if element_type in _SCALARS and count <= SMALL_ARRAY:
            return [self.take(_SCALARS[element_type]) for _ in range(count)]
        if element_type in _SCALARS:
            self.pos += count * struct.calcsize(_SCALARS[element_type])
        elif element_type == _STRING:
            for _ in range(count):
                self.string(keep=False)
        else:
            raise ValueError(f"unsupported metadata array element type {element_type}")
        if self.pos > len(self.buf):
            raise struct.error(f"an array of {count} values runs past the end")
        return Array(element_type, count)


def gguf_file_of(path: str | Path) -> Path | None:
    """The GGUF file ``load_model(path)`` reads: ``path`` itself when it is a file or is
    named ``*.gguf``, the one ``.gguf`` file of a directory without ``config.json``;
    None for a model directory (or a directory with neither)."""
    path = Path(path)
    if path.is_file() or (path.suffix.lower() == SUFFIX and not path.is_dir()):
        return path
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(p for p in path.iterdir() if p.suffix.lower() == SUFFIX and p.is_file())
    if len(found) > 1:
        raise GatedAttnError(f"{path} holds {len(found)} .gguf files ({', '.join(p.name for p in found)}) and no "
                             f"config.json; pass the path of the one to load")
    return found[0] if found else None


def read_header(path: str | Path) -> Header:
    """The header of a GGUF file, checked: GGUF magic and version, complete (every tensor's
    data inside the file), a supported architecture and tensor types. Reads no tensor data."""
    path = Path(path)
    if not path.is_file():
        raise GatedAttnError(f"{path} does not exist" if not path.exists() else f"{path} is not a file")
    with open(path, "rb") as f:
        if f.read(4) != MAGIC:
            raise GatedAttnError(f"{path} is not a GGUF file: it does not start with {MAGIC!r} (load_model reads "
                                 f"a model directory or a .gguf file)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                header = _parse(path, buf)
            except (struct.error, UnicodeDecodeError, ValueError) as e:
                raise GatedAttnError(f"{path} is truncated or corrupt: its GGUF header cannot be read ({e})") from None
    _check_supported(header)
    return header


def _parse(path: Path, buf) -> Header:
    """Metadata and tensor table of the GGUF file mapped in ``buf``."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # lazy: heavy (gguf)

    cur = _Cursor(buf)
    cur.pos = 4
    version = cur.take("<I")
    if version not in VERSIONS:
        raise GatedAttnError(f"{path}: GGUF version {version} is not supported (a big-endian file?); supported: "
                             f"{', '.join(map(str, VERSIONS))}")
    n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.take("<I"))
    metadata_end = cur.pos
    entries = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.take("<Q") for _ in range(cur.take("<I"))]
        type_id, offset = cur.take("<I"), cur.take("<Q")
        entries.append((name, tuple(reversed(dims)), type_id, offset))
    alignment = _alignment(path, metadata.get("general.alignment", 32))
    data_start = -(-cur.pos // alignment) * alignment
    tensors = []
    for name, shape, type_id, offset in entries:
        try:
            kind = GGMLQuantizationType(type_id)
        except ValueError:
            raise GatedAttnError(f"{path}: tensor {name!r} has unknown ggml type id {type_id}; supported: "
                                 f"{', '.join(supported_types())}") from None
        block, size = GGML_QUANT_SIZES[kind]
        if prod(shape) % block:
            raise GatedAttnError(f"{path} is corrupt: tensor {name!r} of shape {shape} does not divide into "
                                 f"{kind.name} blocks of {block}")
        nbytes = prod(shape) // block * size
        if offset % alignment:
            raise GatedAttnError(f"{path} is corrupt: tensor {name!r} starts at data offset {offset}, which is not a "
                                 f"multiple of general.alignment={alignment}")
        end = data_start + offset + nbytes
        if end > len(buf):
            raise GatedAttnError(f"{path} is truncated: tensor {name!r} ends at byte {end} but the file has "
                                 f"{len(buf)} bytes")
        tensors.append(TensorInfo(name, shape, kind.name, nbytes, data_start + offset))
    return Header(path, metadata, tuple(tensors), metadata_end)


def _alignment(path: Path, value: Any) -> int:
    """``general.alignment``: a positive power of two (GGUF's rule), else refused naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value & (value - 1):
        raise GatedAttnError(f"{path} is corrupt: general.alignment={value!r} must be a positive power of two "
                             f"(default 32)")
    return value


def supported_types() -> tuple[str, ...]:
    """The tensor type names that are imported (those this gguf-py knows)."""
    from gguf import GGMLQuantizationType  # lazy: heavy (gguf)

    return tuple(t for t in FLOAT_TYPES + QUANT_TYPES if t in GGMLQuantizationType.__members__)


def _check_supported(header: Header) -> None:
    """Refuse an unsupported architecture or tensor type, naming it."""
    arch = header.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GatedAttnError(f"{header.path}: GGUF architecture {arch!r} is not supported; supported: "
                             f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    allowed = set(supported_types())
    for t in header.tensors:
        if t.kind not in allowed:
            raise GatedAttnError(f"{header.path}: tensor {t.name!r} has type {t.kind}, which is not supported; "
                                 f"supported: {', '.join(supported_types())}")


def _check_metadata(header: Header) -> None:
    """Metadata that changes the computation but that transformers' GGUF loader ignores is
    refused (importing it would give a model llama.cpp does not compute), as is a file
    that states no vocabulary size (transformers would take its config class's default)."""
    rope = header.key("rope.scaling.type")
    if rope not in (None, "none"):
        raise GatedAttnError(f"{header.path}: {header.architecture}.rope.scaling.type={rope!r} is not supported: "
                             f"transformers' GGUF loader ignores RoPE scaling; only unscaled RoPE is imported")
    if header.key("vocab_size") is None and "tokenizer.ggml.tokens" not in header.metadata:
        raise GatedAttnError(f"{header.path}: the file states no vocabulary size (neither "
                             f"{header.architecture}.vocab_size nor tokenizer.ggml.tokens)")


def _check_head_dim(header: Header, head_dim: int) -> None:
    """The head size the file states must be the config's (transformers' loader does not
    read it: Qwen3's config then says 128 whatever the file holds)."""
    for suffix in ("attention.key_length", "attention.value_length"):
        value = header.key(suffix)
        if value is not None and value != head_dim:
            raise GatedAttnError(f"{header.path}: {header.architecture}.{suffix}={value} is not supported: the "
                                 f"config transformers builds from this file has head_dim={head_dim}")


def _first_line(e: Exception) -> str:
    """``Type: first line of the message`` of an exception from transformers or gguf-py."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


# --------------------------------------------------------------------------- one parse
# transformers' GGUF tokenizer (``AutoTokenizer.from_pretrained(..., gguf_file=...)``) parses
# the whole file with gguf-py's GGUFReader more than once, seconds for a vocabulary of 49 k
# tokens; under ``one_parse()`` a file is parsed once while it stays the same file (path,
# inode, size, change and modification times: a file replaced or written to is parsed anew).
_READERS: dict[tuple, Any] = {}


def _file_identity(path: Path) -> tuple:
    st = path.stat()
    return (str(path.resolve()), st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@contextlib.contextmanager
def one_parse():
    """Within this, gguf-py's ``GGUFReader`` of a file already parsed is that parse again (the
    last file only: it maps the file, and holds its parsed metadata)."""
    import gguf  # lazy: heavy (gguf-py, numpy)

    original = gguf.GGUFReader

    def reader(path, mode: str = "r"):
        if mode != "r":
            return original(path, mode)
        key = _file_identity(Path(path))
        if key not in _READERS:
            _READERS.clear()
            _READERS[key] = original(path, mode)
        return _READERS[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = original
        _READERS.clear()  # the parse is held only while it is used


# --------------------------------------------------------------------------- config
class _ConfigFirst(dict):
    """What transformers' GGUF loader returns without tensors, its ``config`` made from the
    header; any other key (the ``tokenizer`` a caller may read from the same answer, as
    transformers 4's tokenizers did) is the loader's own parse of the file, made the first
    time one is asked."""

    def __init__(self, config: dict[str, Any], parse):
        super().__init__(config=config)
        self._parse = parse

    def __missing__(self, key):
        if self._parse is not None:
            parsed, self._parse = self._parse(), None
            self.update({k: v for k, v in parsed.items() if k != "config"})
        if key not in self:  # the parse has no such key either
            raise KeyError(key)
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default


@contextlib.contextmanager
def _config_from_header(header: Header):
    """Within this, transformers' GGUF loader asked for the config alone of ``header``'s file
    (``load_gguf_checkpoint(path)``, which ``AutoTokenizer`` calls to choose the tokenizer's
    class) answers with the dict it would build, made from the header
    (:func:`_hf_config_dict`, with the model's name it keeps), instead of parsing the whole
    vocabulary again with gguf-py (most of a tokenizer's build, for a large vocabulary). The rest of
    its answer is its own parse, made only if asked for (:class:`_ConfigFirst`). A file whose
    dict the header cannot give (an architecture not imported here) is parsed as before, and
    so is any other file or a call for tensors."""
    from transformers import modeling_gguf_pytorch_utils as loader  # lazy: heavy (transformers)

    try:
        config = _hf_config_dict(header)
    except GatedAttnError:
        config = None
    original = getattr(loader, "load_gguf_checkpoint", None)
    if config is None or original is None:
        yield
        return
    if isinstance(header.metadata.get("general.name"), str):
        config["_model_name_or_path"] = header.metadata["general.name"]
    identity = _file_identity(header.path)

    def load(path, return_tensors=False, *args, **kwargs):
        if not return_tensors and not args and not kwargs and _file_identity(Path(path)) == identity:
            return _ConfigFirst(copy.deepcopy(config), lambda: original(path))
        return original(path, return_tensors, *args, **kwargs)

    loader.load_gguf_checkpoint = load
    try:
        yield
    finally:
        loader.load_gguf_checkpoint = original


def _hf_config_dict(header: Header) -> dict[str, Any]:
    """The HF config dict transformers' GGUF loader (``load_gguf_checkpoint``) builds from the
    file's metadata, built here from the header with transformers' own tables (its key
    renames and per-architecture defaults), without parsing the vocabulary: the same dict
    (tested), seconds and hundreds of megabytes sooner for a 49 k-token file."""
    from transformers.integrations.ggml import (GGUF_CONFIG_DEFAULTS_MAPPING,  # lazy: heavy (transformers)
                                                GGUF_CONFIG_MAPPING)

    arch = header.architecture
    # transformers reads a llama file named exactly "mistral" as Mistral (then refused below)
    model_type = "mistral" if "llama" in arch and header.metadata.get("general.name") == "mistral" else arch
    raw: dict[str, Any] = {"tie_word_embeddings": all(t.name != "output.weight" for t in header.tensors)}
    defaults = GGUF_CONFIG_DEFAULTS_MAPPING.get(model_type, GGUF_CONFIG_DEFAULTS_MAPPING.get(arch) or {})
    for key, value in defaults.items():  # as transformers sets them: never over what the tensors said
        raw.setdefault(key, value)
    for key, value in header.metadata.items():
        prefix, _, rest = key.replace(arch, model_type).partition(".")
        renamed = GGUF_CONFIG_MAPPING.get(prefix, {}).get(rest)
        if renamed is None or renamed == -1:
            continue
        if isinstance(value, Array):
            raise GatedAttnError(f"{header.path}: metadata {key} is an array of {value.count} values, which is not "
                                 f"read; supported: a single value")
        if isinstance(value, list) and len(value) == 1:
            value = value[0]  # as transformers reads a one-element array
        raw[renamed] = value.replace(arch, model_type) if isinstance(value, str) else value
    if "vocab_size" not in raw and isinstance(header.metadata.get("tokenizer.ggml.tokens"), Array):
        raw["vocab_size"] = header.metadata["tokenizer.ggml.tokens"].count
    if raw.get("model_type") not in SUPPORTED_ARCHITECTURES:
        raise GatedAttnError(f"{header.path}: transformers reads it as model_type={raw.get('model_type')!r}, which "
                             f"is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    raw.pop("_model_name_or_path", None)
    # the special tokens the file states, None where it states none (not the config class's defaults,
    # e.g. Llama's 1 and 2, which would make generate prepend a token the file never named)
    for key in ("bos_token_id", "eos_token_id"):
        raw[key] = header.metadata.get(f"tokenizer.ggml.{key}")
    return raw


def gguf_plan(path: str | Path):
    """``(header, HF config dict, Plan)`` of a GGUF file: what ``load_model`` would build,
    from the header and metadata alone."""
    header = read_header(path)
    _check_metadata(header)
    raw = _hf_config_dict(header)
    importer = importer_for(raw, str(header.path))
    plan = importer.plan(raw, str(header.path))
    _check_head_dim(header, plan.cfg.attention.head_dim)
    return header, raw, plan


def gguf_config(path: str | Path):
    """The ``ModelConfig`` that :func:`load_gguf` would build, without reading tensors."""
    return gguf_plan(path)[2].cfg


# --------------------------------------------------------------------------- weights
class _HFNames(torch.nn.Module):
    """What ``load_gguf_checkpoint(model_to_load=...)`` reads of transformers' model to name
    the file's tensors: its ``config`` and its parameter names. These are the HF names
    ``hf_specs`` takes, so a file tensor outside them is one the import would not use
    (building transformers' model, even on the meta device, costs seconds here)."""

    def __init__(self, config, names: list[str]):
        super().__init__()
        self.config = config
        self._names = names

    def state_dict(self, *args, **kwargs) -> dict[str, None]:
        return dict.fromkeys(self._names)


def _names_model(raw: dict[str, Any], plan, source: str) -> _HFNames:
    specs = hf_specs(plan.cfg, plan.q_layout, zero_centred_norms=plan.zero_centred_norms)
    return _HFNames(hf_config_object(raw, source), [spec.hf_name for spec in specs])


def _check_all_mapped(header: Header, raw: dict[str, Any], names_model: _HFNames) -> None:
    """Every tensor of the file must map to a HF name the import takes (transformers' loader
    drops the others silently, e.g. llama3's ``rope_freqs.weight``); checked before anything
    is dequantized."""
    # lazy: heavy (transformers)
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor,
                                                          get_gguf_hf_weights_map)

    processor = TENSOR_PROCESSORS.get(header.architecture, TensorProcessor)(config=raw)
    names = get_gguf_hf_weights_map(names_model, processor)
    unmapped = [t.name for t in header.tensors if t.name not in names]
    if unmapped:
        raise GatedAttnError(f"{header.path}: unexpected tensor {unmapped[0]!r} ({len(unmapped)} unexpected in all); "
                             f"the {header.architecture} config does not account for it")


def _hf_tensors(header: Header, raw: dict[str, Any], names_model: _HFNames,
                dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The file's tensors, dequantized to float32 one at a time from the mapped file, in HF
    names: what transformers' ``load_gguf_checkpoint(return_tensors=True)`` returns (its
    tensor processor for the architecture, e.g. Llama's q/k un-permutation, and its names),
    without its parse of the whole metadata and with no second copy of the model; each
    tensor then in ``dtype`` where one is given (the model's, so none is converted twice)."""
    import numpy as np  # lazy: heavy (numpy, with gguf-py)
    from gguf import GGMLQuantizationType  # lazy: heavy (gguf)
    from gguf.quants import dequantize, quant_shape_to_byte_shape  # lazy: heavy (gguf)
    # lazy: heavy (transformers)
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor,
                                                          get_gguf_hf_weights_map)

    processor = TENSOR_PROCESSORS.get(header.architecture, TensorProcessor)(config=raw)
    names = get_gguf_hf_weights_map(names_model, processor)
    plain = {"F32": np.float32, "F16": np.float16}  # read as numbers; every other type as its bytes
    out: dict[str, torch.Tensor] = {}
    data = np.memmap(header.path, dtype=np.uint8, mode="r")
    try:
        for t in header.tensors:
            kind = GGMLQuantizationType[t.kind]
            stored = data[t.offset:t.offset + t.nbytes]
            stored = (stored.view(plain[t.kind]).reshape(t.shape) if t.kind in plain
                      else stored.reshape(quant_shape_to_byte_shape(t.shape, kind)))
            done = processor.process(weights=dequantize(stored, kind), name=t.name, tensor_key_mapping=names,
                                     parsed_parameters={"config": raw, "tensors": out})
            if done.name not in names:  # checked before: every tensor maps (_check_all_mapped)
                continue
            w = done.weights
            if np.may_share_memory(w, data) or w.dtype != np.float32 or not w.flags.c_contiguous:
                w = np.array(w, dtype=np.float32, order="C")  # its own memory, not the file's pages
            out[names[done.name]] = torch.from_numpy(w) if dtype is None else torch.from_numpy(w).to(dtype)
    except Exception as e:
        raise GatedAttnError(f"{header.path}: its tensors cannot be read ({_first_line(e)})") from None
    finally:
        del data  # the mapping closes once no array views it
    return out


def load_gguf(path: str | Path, *, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"):
    """A GGUF file as a ``GatedLM`` (float32 unless ``dtype``), with transformers' logits
    for the same file; everything is refused before any tensor is dequantized."""
    header, raw, plan = gguf_plan(path)
    source = str(header.path)
    check_model_size(plan.cfg, source, device)
    names_model = _names_model(raw, plan, source)
    _check_all_mapped(header, raw, names_model)
    tensors = DictTensorSource(_hf_tensors(header, raw, names_model, dtype), header.path)
    state = read_hf_state(header.path, plan, GatedLM.expected_state(plan.cfg), tensors)
    model = GatedLM.from_state(plan.cfg, state, header.path, dtype).eval()  # the dequantized tensors, held once
    return model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)  # and the buffers


# --------------------------------------------------------------------------- tokenizer
# the tokenizer built from a file, while it stays the same file (the last file only);
# callers get a copy of it (~0.1 s against ~1.5 s to build it again)
_TOKENIZERS: dict[tuple, Any] = {}


def gguf_hf_tokenizer(path: str | Path):
    """transformers' tokenizer for the one embedded in a GGUF file (None when the file has
    none): ``AutoTokenizer.from_pretrained(parent, gguf_file=name)``, built once per file
    and machine (:func:`cached_tokenizer`; each call returns a copy of its own)."""
    header = read_header(path)
    if "tokenizer.ggml.model" not in header.metadata:
        return None
    key = _file_identity(header.path)
    try:
        if key not in _TOKENIZERS:
            built = cached_tokenizer(header)
            _TOKENIZERS.clear()
            _TOKENIZERS[key] = built
        return copy.deepcopy(_TOKENIZERS[key])
    except Exception as e:
        raise GatedAttnError(f"{header.path}: its tokenizer (tokenizer.ggml.model="
                             f"{header.metadata['tokenizer.ggml.model']!r}) cannot be built "
                             f"({_first_line(e)})") from None


def tokenizer_cache_dir(header: Header) -> Path:
    """Where the tokenizer of ``header``'s file is kept once built: named by the SHA-256 of
    the file's metadata bytes (the tokenizer is made from them alone, so a file with other
    weights and the same tokenizer shares it) and the transformers version that built it."""
    import transformers  # lazy: heavy (transformers)

    digest = hashlib.sha256()
    with open(header.path, "rb") as f:
        for _ in range(0, header.metadata_end, 1 << 20):
            digest.update(f.read(min(1 << 20, header.metadata_end - f.tell())))
    return cache_root() / "tokenizers" / f"{digest.hexdigest()[:32]}-transformers-{transformers.__version__}"


def cached_tokenizer(header: Header):
    """The tokenizer embedded in ``header``'s file: read from :func:`tokenizer_cache_dir`
    where an earlier call left it, else built by transformers' GGUF converter (its class
    chosen from the header's config: :func:`_config_from_header`) and left there. Processes
    that need it at once build it once: the others wait for that build and read it
    (:func:`_build_lock`). A cache that cannot be read or written is passed over: the
    tokenizer is then built."""
    from transformers import AutoTokenizer  # lazy: heavy (transformers)

    where = tokenizer_cache_dir(header)
    cached = _cached_tokenizer(where)
    if cached is not None:
        return cached
    with _build_lock(where):
        cached = _cached_tokenizer(where)  # built by another process while this one waited
        if cached is not None:
            return cached
        with quiet_transformers(), one_parse(), _config_from_header(header):
            built = AutoTokenizer.from_pretrained(str(header.path.parent), gguf_file=header.path.name)
        with contextlib.suppress(OSError, GatedAttnError), atomic_dir(where) as tmp:
            built.save_pretrained(str(tmp))
    return built


def _cached_tokenizer(where: Path):
    """The tokenizer kept in ``where``, or None where there is none or it cannot be read."""
    from transformers import AutoTokenizer  # lazy: heavy (transformers)

    if (where / "tokenizer.json").is_file():
        with contextlib.suppress(Exception), quiet_transformers():
            return AutoTokenizer.from_pretrained(str(where))
    return None


@contextlib.contextmanager
def _build_lock(where: Path):
    """Held while the tokenizer kept in ``where`` is built: an exclusive ``flock`` on the file
    ``<where>.lock`` beside it, which a second process waits for, then reads the first's
    tokenizer instead of building it too. The kernel releases the lock when its holder ends
    (a killed build leaves the file, never a held lock); where the file cannot be made or
    locked (a cache that cannot be written), the tokenizer is built without it."""
    fd = None
    with contextlib.suppress(OSError):
        where.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(where.parent / f"{where.name}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


def gguf_tokenizer(path: str | Path):
    """The ``tokenizers.Tokenizer`` embedded in a GGUF file, or None when it has none."""
    tok = gguf_hf_tokenizer(path)
    return None if tok is None else tok.backend_tokenizer


def gguf_token_ids(path: str | Path) -> tuple[int | None, int | None]:
    """``(bos_token_id, eos_token_id)`` a GGUF file states (None where it states none)."""
    metadata = read_header(path).metadata
    return metadata.get("tokenizer.ggml.bos_token_id"), metadata.get("tokenizer.ggml.eos_token_id")
