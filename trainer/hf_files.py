"""The files of a Hugging Face model directory, checked before a byte of weights is loaded.

- `config.json`: present, a JSON object, the size fields positive integers (errors name the field);
  a `datasets.save_to_disk` directory is told apart from a model.
- `model.safetensors.index.json` (sharded) or `model.safetensors`: the index is a JSON object whose
  `weight_map` names shard files that exist.
- each safetensors file's header (an 8-byte little-endian length, then that much JSON): within the
  file and under safetensors' own 100 MB cap, every tensor with a known dtype, a shape of
  non-negative integers and `data_offsets` inside the data section that match its size and do not
  overlap another tensor's.
- `source_digest`: sha256 over the names and contents of exactly these files, the key of an import.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from pathlib import Path
from typing import Any

from purokit.errors import ContractError
from purokit.storage import sha256_file

INDEX, SINGLE, CONFIG = "model.safetensors.index.json", "model.safetensors", "config.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024          # safetensors' own limit on the JSON header
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
OPTIONAL_SIZE_FIELDS = ("num_key_value_heads", "head_dim", "max_position_embeddings")
OPTIONAL_NUMBER_FIELDS = ("rope_theta", "rms_norm_eps", "initializer_range")
_DATASET_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object from a file; not found, not UTF-8, not JSON or not an object name the file."""
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ContractError(path, "not found") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ContractError(path, f"not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ContractError(path, f"expected a JSON object, found {type(raw).__name__}")
    return raw


def read_hf_config(directory: Path) -> dict[str, Any]:
    """config.json of a model directory, its size fields checked as positive integers."""
    if not directory.is_dir():
        raise ContractError(directory, "not found or not a directory: expected a Hugging Face model directory")
    path = directory / CONFIG
    if not path.is_file():
        if any((directory / m).is_file() for m in _DATASET_MARKERS) or any(directory.glob("*.arrow")):
            raise ContractError(directory, "is a datasets directory, not a model (no config.json)")
        raise ContractError(directory, "no config.json: not a Hugging Face model directory")
    config = read_json_object(path)
    for key in SIZE_FIELDS:
        if key not in config:
            raise ContractError(path, "missing", field=key)
    for key in SIZE_FIELDS + OPTIONAL_SIZE_FIELDS:
        value = config.get(key)
        if key in config and value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ContractError(path, f"must be a positive integer, found {value!r:.60}", field=key)
    for key in OPTIONAL_NUMBER_FIELDS:
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ContractError(path, f"must be a number, found {value!r:.60}", field=key)
    if not isinstance(config.get("tie_word_embeddings", False), bool):
        raise ContractError(path, f"must be true or false, found {config['tie_word_embeddings']!r:.60}",
                            field="tie_word_embeddings")
    return config


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of the model: the shards the index lists, else model.safetensors."""
    index = directory / INDEX
    if index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ContractError(index, "must map tensor names to shard files", field="weight_map")
        names = sorted(set(weight_map.values()))
        bad = [n for n in names if not isinstance(n, str) or "/" in n or "\\" in n or n in ("", ".", "..")]
        if bad:
            raise ContractError(index, f"names {bad[0]!r}, not a file of this directory", field="weight_map")
        missing = [n for n in names if not (directory / n).is_file()]
        if missing:
            raise ContractError(directory / missing[0], f"listed in {INDEX} but not found", field="weight_map")
        return [directory / n for n in names]
    if (directory / SINGLE).is_file():
        return [directory / SINGLE]
    raise ContractError(directory, f"no {SINGLE} (or {INDEX}) here")


def safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) of every tensor of a safetensors file, the header checked against the
    file's size (nothing beyond the header is read)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ContractError(path, f"truncated: {size} bytes, fewer than the 8 of the header length")
        n = struct.unpack("<Q", head)[0]
        if n == 0:
            raise ContractError(path, "empty safetensors header (length 0)")
        if n > MAX_HEADER_BYTES:
            raise ContractError(path, f"header length {n} is over safetensors' limit of {MAX_HEADER_BYTES} bytes")
        if n > size - 8:
            raise ContractError(path, f"truncated: the header says {n} bytes, the file has {size - 8} after it")
        raw = fh.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ContractError(path, f"the safetensors header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise ContractError(path, "the safetensors header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ContractError(path, "the safetensors __metadata__ must map names to strings", field="__metadata__")
    return check_tensor_entries(path, header, size - 8 - n)


def check_tensor_entries(path: Path, header: dict[str, Any], data_bytes: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each header entry's dtype, shape and offsets, against a data section of `data_bytes`."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        where = f"tensor {name!r}"
        if not isinstance(entry, dict):
            raise ContractError(path, f"{where}: header entry is not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in DTYPE_BYTES:
            raise ContractError(path, f"{where}: unknown dtype {dtype!r}", field="dtype")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            raise ContractError(path, f"{where}: shape {shape!r:.60} is not a list of non-negative integers",
                                field="shape")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
            raise ContractError(path, f"{where}: data_offsets {offsets!r:.60} is not [begin, end]", field="data_offsets")
        begin, end = offsets
        if not 0 <= begin <= end <= data_bytes:
            raise ContractError(path, f"{where}: data_offsets [{begin}, {end}] outside the {data_bytes}-byte data "
                                "section (truncated file or bad offsets)", field="data_offsets")
        if end - begin != math.prod(shape) * DTYPE_BYTES[dtype]:
            raise ContractError(path, f"{where}: data_offsets span {end - begin} bytes, shape {shape} of {dtype} "
                                f"needs {math.prod(shape) * DTYPE_BYTES[dtype]}", field="data_offsets")
        out[name] = (dtype, tuple(shape))
        spans.append((begin, end, name))
    spans.sort()
    for (_, e1, a), (b2, _, b) in zip(spans, spans[1:]):
        if b2 < e1:
            raise ContractError(path, f"tensors {a!r} and {b!r} overlap in the data section", field="data_offsets")
    return out


def tensor_shapes(directory: Path, files: list[Path]) -> dict[str, tuple[int, ...]]:
    """name -> shape over every weight file, from their headers; a tensor in two files, or one the
    index maps to a file that does not hold it, is an error."""
    shapes: dict[str, tuple[int, ...]] = {}
    owner: dict[str, Path] = {}
    for f in files:
        for name, (_, shape) in safetensors_header(f).items():
            if name in shapes:
                raise ContractError(f, f"tensor {name!r} is also in {owner[name].name}")
            shapes[name], owner[name] = shape, f
    index = directory / INDEX
    if index.is_file():
        for name, file in read_json_object(index)["weight_map"].items():
            if owner.get(name) is None or owner[name].name != file:
                raise ContractError(index, f"maps {name!r} to {file}, which does not hold it", field="weight_map")
    return shapes


def source_digest(directory: Path, files: list[Path]) -> str:
    """sha256 over the names and sha256s of config.json, the index (if any) and the weight files."""
    h = hashlib.sha256()
    for f in [directory / CONFIG, directory / INDEX, *files]:
        if f.is_file():
            h.update(f.name.encode("utf-8") + b"\0" + bytes.fromhex(sha256_file(f)))
    return h.hexdigest()
