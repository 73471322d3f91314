"""Readers for raw sources: jsonl, jsonl.gz, jsonl.zst, parquet and Hugging Face `datasets`
(saved-to-disk directories, or hub names when the hub is reachable).

The driver plans `Split`s (a byte range of a plain jsonl file, a run of parquet row groups, one
Arrow file of a saved dataset); executors read each split with `read_split`, which yields Arrow
batches in the ingest schema. Every input record becomes exactly one row: a document, or a
quarantined record with a reason, the origin file and line, and the start of the raw record.
Nothing is dropped silently (blank jsonl lines are not records; they are counted).

Quarantine reasons: see `REASONS`. A file that cannot be opened or parsed at all (no read
permission, a truncated or fake parquet) becomes one `unreadable` row naming the file and the
error; the job goes on with the other files.

Compressed jsonl is read twice: a first pass decompresses every gzip member / zstd frame and runs
its integrity check (gzip: CRC32 and length of every member; zstd: the frame's content checksum),
the second parses the records. The records of the first member that fails, and everything after
it (its end cannot be trusted), are quarantined as `corrupt_archive`, never kept as documents.
What cannot be detected: a zstd frame written without a checksum (`zstd --no-check`,
`ZstdCompressor(write_checksum=False)`, the library default) has no check of its content, so a
flipped bit that still decodes gives wrong bytes that only the per-record checks (UTF-8, JSON,
text field) can catch; such frames are counted as `unchecked_members`.

Ids: a string id is kept as it is; any other JSON value (a number, `true`) is stored as its JSON
text (`7` -> "7"), the same for files, globs and directories, so an int `7` and a string `"7"` in
one source are the same id and the later one is quarantined as `duplicate_id`.
A UTF-8 byte order mark at the start of a file is skipped; a number beyond the float range
(`1e400`) is kept in `meta` as its text.
"""

from __future__ import annotations

import io
import json
import math
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import orjson
import pyarrow as pa
import zstandard

from purokit import storage
from purokit.document import META_TYPE, meta_value
from purokit.hashing import stable_id

REASONS = {
    "malformed_json": "the line is not valid JSON",
    "invalid_utf8": "the bytes are not valid UTF-8",
    "invalid_unicode": "the text holds lone surrogates (cannot be written as UTF-8)",
    "not_an_object": "the JSON value is not an object",
    "missing_text": "the text field is absent or null",
    "non_string_text": "the text field is not a string",
    "empty_text": "the text is empty or only whitespace",
    "too_large": "the record exceeds ingest.max_text_bytes",
    "duplicate_id": "another record of the source has the same id, compared as text (the first, by origin, is kept)",
    "unreadable": "the file could not be opened, read or parsed past this point (the detail names the error)",
    "corrupt_archive": "a gzip member or zstd frame failed its integrity check or did not decode: its records are not kept",
}

INGEST_SCHEMA = pa.schema([
    pa.field("id", pa.string()),
    pa.field("text", pa.string()),
    pa.field("source", pa.string()),
    pa.field("meta", META_TYPE),
    pa.field("origin_file", pa.string()),
    pa.field("origin_line", pa.int64()),        # 1-based line (jsonl) or 0-based row (parquet, Arrow)
    pa.field("reason", pa.string()),            # null for documents
    pa.field("detail", pa.string()),
    pa.field("raw_prefix", pa.string()),
])
INGEST_SPARK_SCHEMA = (
    "id string, text string, source string, meta map<string,string>, origin_file string, "
    "origin_line bigint, reason string, detail string, raw_prefix string"
)

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
HF_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


class SourceError(ValueError):
    """A source's paths or format cannot be read; the message says which and why."""


@dataclass(frozen=True)
class InputFile:
    path: str
    rel: str                      # relative to the pattern's base directory: part of derived ids
    format: str                   # jsonl | parquet | arrow
    compression: Optional[str]    # gzip | zstd | None
    size: int


@dataclass(frozen=True)
class Split:
    source: str
    path: str
    rel: str
    format: str
    compression: Optional[str]
    start: int = 0                # jsonl: byte offset; parquet: first row group
    end: int = -1                 # jsonl: end byte (exclusive, -1 = EOF); parquet: row group after the last
    first_line: int = 1           # jsonl: line number of the first line starting in [start, end)
    row_offset: int = 0           # parquet: index of the first row of row group `start`
    problem: Optional[str] = None  # why the file could not even be planned (read_split quarantines it)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ReadOptions:
    text_field: str = "text"
    id_field: Optional[str] = None
    max_text_bytes: int = 16 * 2**20
    raw_prefix_chars: int = 300
    batch_rows: int = 2048
    extra_meta: tuple[tuple[str, str], ...] = ()   # added to every document's meta (e.g. the HF split)

    @property
    def max_line_bytes(self) -> int:
        # JSON escapes can make a line ~6x longer than its text (\\uXXXX per character)
        return 6 * self.max_text_bytes + 65536


# ---- discovery -----------------------------------------------------------------------------

def _compression_of(name: str) -> tuple[Optional[str], str]:
    for suffix, comp in COMPRESSIONS.items():
        if name.endswith(suffix):
            return comp, name[: -len(suffix)]
    return None, name


def _file_format(name: str) -> Optional[str]:
    comp, base = _compression_of(name.lower())
    if base.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if base.endswith(".parquet") and comp is None:
        return "parquet"
    if base.endswith(".arrow") and comp is None:
        return "arrow"
    return None


def _is_hf_dir(path: Path) -> bool:
    return path.is_dir() and any((path / m).is_file() for m in HF_MARKERS)


def _glob_base(pattern: str) -> Path:
    base = storage.path(pattern)
    while any(ch in str(base) for ch in "*?["):
        base = base.parent
    return base


def discover_files(paths: list[str], fmt: str = "auto", hf_split: Optional[str] = None,
                   hf_config: Optional[str] = None) -> list[InputFile]:
    """Every input file of a source, in a stable order. Directories are searched recursively for
    supported files (hidden and `_`-prefixed entries skipped); a directory saved by
    `datasets.save_to_disk` (or a hub name with format `hf`) yields its Arrow files."""
    out: list[InputFile] = []
    for pattern in paths:
        if fmt == "hf" or (fmt == "auto" and _is_hf_dir(storage.path(pattern))):
            out.extend(_hf_files(pattern, hf_split, hf_config))
            continue
        matches = storage.glob(pattern) if any(c in pattern for c in "*?[") else [pattern]
        if not matches:
            raise SourceError(f"no files match {pattern!r}")
        base = _glob_base(pattern)
        for m in matches:
            p = storage.path(m)
            if not p.exists():
                if p.is_symlink() and m != pattern:
                    continue              # a dangling link matched by a glob: skipped, as in a directory walk
                raise SourceError(f"input not found: {m}")
            if p.is_dir():
                if _is_hf_dir(p):
                    out.extend(_hf_files(str(p), hf_split, hf_config))
                    continue
                found = [f for f in sorted(p.rglob("*")) if f.is_file()
                         and not any(part.startswith((".", "_")) for part in f.relative_to(p).parts)
                         and _file_format(f.name) in ("jsonl", "parquet")
                         and (fmt == "auto" or _file_format(f.name) == fmt)]
                if not found:
                    raise SourceError(f"directory {m} holds no jsonl[.gz|.zst] or parquet files")
                for f in found:
                    out.append(_input_file(f, f.relative_to(p.parent if p == base else base)))
            else:
                file_fmt = _file_format(p.name)
                if fmt != "auto":
                    if fmt == "jsonl" and file_fmt is None:
                        file_fmt = "jsonl"     # the user says it is jsonl, whatever the name
                    if file_fmt != fmt:
                        raise SourceError(f"{m} is not a {fmt} file")
                if file_fmt is None:
                    raise SourceError(f"cannot tell the format of {m}: name it .jsonl[.gz|.zst] or .parquet, or set format")
                rel = p.relative_to(base) if base != p and str(p).startswith(str(base)) else Path(p.name)
                out.append(_input_file(p, rel, file_fmt))
    seen: set[str] = set()
    unique = []
    for f in out:
        if f.path not in seen:
            seen.add(f.path)
            unique.append(f)
    return unique


def _input_file(p: Path, rel: Path, fmt: Optional[str] = None) -> InputFile:
    comp, _ = _compression_of(p.name.lower())
    return InputFile(path=str(p.resolve()), rel=rel.as_posix(), format=fmt or _file_format(p.name) or "jsonl",
                     compression=comp, size=p.stat().st_size)


def _hf_files(name_or_path: str, split: Optional[str], config: Optional[str]) -> list[InputFile]:
    """Arrow files behind a saved dataset directory or a hub dataset (downloaded to the HF cache)."""
    import datasets

    path = Path(name_or_path)
    if path.exists():
        ds = datasets.load_from_disk(str(path))
        root = path.resolve()
    else:
        try:
            ds = datasets.load_dataset(name_or_path, config, split=split)
        except Exception as e:  # offline, unknown name, gated ...
            raise SourceError(
                f"{name_or_path!r} is not a local path, and loading it from the Hugging Face hub failed "
                f"({type(e).__name__}: {str(e).splitlines()[0][:200]}). Offline, save the dataset with "
                f"`Dataset.save_to_disk(dir)` and point the source at that directory") from None
        root = None
    if isinstance(ds, datasets.DatasetDict):
        splits = [split] if split else sorted(ds)
        missing = [s for s in splits if s not in ds]
        if missing:
            raise SourceError(f"{name_or_path}: no split {missing[0]!r} (splits: {sorted(ds)})")
        parts = [(s, ds[s]) for s in splits]
    else:
        parts = [(split or "", ds)]
    out = []
    for split_name, d in parts:
        if getattr(d, "_indices", None) is not None:
            raise SourceError(f"{name_or_path}: the dataset has an indices mapping; call .flatten_indices() before saving it")
        for cf in d.cache_files:
            f = Path(cf["filename"]).resolve()
            rel = f.relative_to(root).as_posix() if root and str(f).startswith(str(root)) else f"{name_or_path}/{split_name}/{f.name}"
            out.append(InputFile(path=str(f), rel=rel, format="arrow", compression=None, size=f.stat().st_size))
    if not out:
        raise SourceError(f"{name_or_path}: the dataset has no data files")
    return out


# ---- planning splits -----------------------------------------------------------------------

def plan_splits(source: str, files: list[InputFile], split_bytes: int) -> list[Split]:
    """Cut files into splits. Plain jsonl files larger than `split_bytes` become byte ranges
    (their `first_line` is filled in by `number_lines`); parquet files become runs of row groups;
    compressed jsonl and Arrow files are one split each."""
    splits: list[Split] = []
    for f in files:
        if f.format == "jsonl" and f.compression is None and f.size > split_bytes:
            for start in range(0, f.size, split_bytes):
                splits.append(Split(source, f.path, f.rel, f.format, None, start, min(start + split_bytes, f.size)))
        elif f.format == "parquet":
            try:
                meta = storage.parquet_metadata(f.path)
            except (OSError, pa.ArrowException) as e:      # no permission, truncated, not a parquet file
                splits.append(Split(source, f.path, f.rel, f.format, None, problem=_describe(f.path, e)))
                continue
            start_rg, acc, rows_before, first_row = 0, 0, 0, 0
            for rg in range(meta.num_row_groups):
                acc += meta.row_group(rg).total_byte_size
                rows_before += meta.row_group(rg).num_rows
                if acc >= split_bytes or rg == meta.num_row_groups - 1:
                    splits.append(Split(source, f.path, f.rel, f.format, None, start_rg, rg + 1, row_offset=first_row))
                    start_rg, acc, first_row = rg + 1, 0, rows_before
            if meta.num_row_groups == 0:
                splits.append(Split(source, f.path, f.rel, f.format, None, 0, 0))
        else:
            splits.append(Split(source, f.path, f.rel, f.format, f.compression))
    return splits


def count_newlines(path: str, start: int, end: int) -> int:
    n = 0
    with storage.open(path, "rb") as fh:
        fh.seek(start)
        remaining = end - start
        while remaining > 0:
            chunk = fh.read(min(1 << 22, remaining))
            if not chunk:
                break
            n += chunk.count(b"\n")
            remaining -= len(chunk)
    return n


def byte_at(path: str, offset: int) -> bytes:
    with storage.open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(1)


def number_lines(splits: list[Split], newline_counts: dict[tuple[str, int], int]) -> list[Split]:
    """Set `first_line` of byte-range splits from the newline count of every range before them.

    A range that does not start at a line start begins with the remainder of the previous line,
    which belongs to the previous split; its first own line is one further."""
    out = []
    before: dict[str, int] = {}
    for s in splits:
        if s.format != "jsonl" or s.compression is not None or s.end < 0:
            out.append(s)
            continue
        n_before = before.get(s.path, 0)
        first = 1 + n_before
        if s.start > 0 and byte_at(s.path, s.start - 1) != b"\n":
            first += 1
        out.append(Split(**{**s.to_dict(), "first_line": first}))
        before[s.path] = n_before + newline_counts[(s.path, s.start)]
    return out


# ---- reading -------------------------------------------------------------------------------

class _BatchBuilder:
    def __init__(self, source: str, origin: str, opts: ReadOptions):
        self.source, self.origin, self.opts = source, origin, opts
        self.cols: dict[str, list] = {f.name: [] for f in INGEST_SCHEMA}

    def __len__(self) -> int:
        return len(self.cols["source"])

    def doc(self, doc_id: str, text: str, meta: list[tuple[str, str]], line: int) -> None:
        c = self.cols
        c["id"].append(doc_id)
        c["text"].append(text)
        c["source"].append(self.source)
        c["meta"].append(meta + list(self.opts.extra_meta))
        c["origin_file"].append(self.origin)
        c["origin_line"].append(line)
        c["reason"].append(None)
        c["detail"].append(None)
        c["raw_prefix"].append(None)

    def bad(self, reason: str, detail: str, line: int, raw: bytes | str | None) -> None:
        assert reason in REASONS, reason
        if isinstance(raw, bytes):
            raw = raw[: self.opts.raw_prefix_chars * 4].decode("utf-8", errors="replace")
        prefix = raw[: self.opts.raw_prefix_chars] if raw is not None else None
        if prefix is not None:
            prefix = prefix.encode("utf-8", errors="replace").decode("utf-8")   # lone surrogates
        c = self.cols
        for k in ("id", "text"):
            c[k].append(None)
        c["source"].append(self.source)
        c["meta"].append(None)
        c["origin_file"].append(self.origin)
        c["origin_line"].append(line)
        c["reason"].append(reason)
        c["detail"].append(detail[:500])
        c["raw_prefix"].append(prefix)

    def flush(self) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_pydict(self.cols, schema=INGEST_SCHEMA)
        self.cols = {f.name: [] for f in INGEST_SCHEMA}
        return batch


def _check_text(value: Any, opts: ReadOptions) -> tuple[Optional[str], Optional[str], str]:
    """(reason, detail, text) for a text field's value; reason None when it is a good document."""
    if value is None:
        return "missing_text", f"field {opts.text_field!r} is null or absent", ""
    if not isinstance(value, str):
        return "non_string_text", f"field {opts.text_field!r} is a {type(value).__name__}", ""
    try:
        n_bytes = len(value.encode("utf-8"))
    except UnicodeEncodeError as e:
        return "invalid_unicode", str(e), ""
    if n_bytes > opts.max_text_bytes:
        return "too_large", f"text is {n_bytes} bytes, the limit is {opts.max_text_bytes}", ""
    if not value.strip():
        return "empty_text", "text is empty or whitespace", ""
    return None, None, value


def _doc_id(record_id: Any, source: str, rel: str, line: int) -> str:
    if record_id is None:
        return stable_id(source, rel, line)
    return record_id if isinstance(record_id, str) else meta_value(record_id)


_IN_CHUNK = 1 << 16               # compressed bytes per decompressor call
_BOM = b"\xef\xbb\xbf"
_FILE_ERRORS = (OSError, EOFError, ValueError, pa.ArrowException, zlib.error, zstandard.ZstdError)


def _describe(path: str, e: BaseException) -> str:
    return f"{path}: {type(e).__name__}: {e}"


class _Damaged(Exception):
    """A compressed member failed its integrity check or did not decode."""

    def __init__(self, member: int, offset: int, detail: str):
        super().__init__(detail)
        self.member, self.offset, self.detail = member, offset, detail


def _decompressor(compression: str):
    if compression == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)     # checks the member's CRC32 and length
    return zstandard.ZstdDecompressor().decompressobj()    # checks the content checksum when present


def _zstd_unchecked(head: bytes) -> bool:
    try:
        return not zstandard.get_frame_parameters(head).has_checksum
    except zstandard.ZstdError:
        return False                  # not a frame header: decoding reports it


def iter_members(fh: io.BufferedIOBase, compression: str) -> Iterator[tuple[int, bool, bytes]]:
    """Decompressed bytes of a gzip or zstd stream, one member (gzip member, zstd frame) after
    the other, each checked by its own integrity check: yields (member, unchecked, bytes) where
    `unchecked` is True for a zstd frame without a content checksum. Raises `_Damaged` at the
    first member that fails (nothing after it is decoded: its end cannot be trusted)."""
    read, pending, member = 0, b"", 0
    while True:
        if not pending:
            pending = fh.read(_IN_CHUNK)
            read += len(pending)
            if not pending:
                return
        if compression == "gzip" and not pending.strip(b"\0"):
            pending = b""             # zero padding after the last member (gzip(1) accepts it)
            continue
        start = read - len(pending)
        d = _decompressor(compression)
        unchecked = compression == "zstd" and _zstd_unchecked(pending[:18])
        try:
            while True:
                out = _decompress(d, pending, compression)
                if out:
                    yield member, unchecked, out
                if d.eof:
                    pending = d.unused_data
                    break
                pending = fh.read(_IN_CHUNK)
                read += len(pending)
                if not pending:
                    raise _Damaged(member, start, "the file ends inside this member (truncated)")
        except _PartialOutput as e:
            if e.out:
                yield member, unchecked, e.out
            raise _Damaged(member, start, f"{type(e.error).__name__}: {e.error}") from None
        except (zlib.error, zstandard.ZstdError) as e:
            raise _Damaged(member, start, f"{type(e).__name__}: {e}") from None
        member += 1


class _PartialOutput(Exception):
    def __init__(self, out: bytes, error: Exception):
        super().__init__(str(error))
        self.out, self.error = out, error


def _decompress(d, data: bytes, compression: str) -> bytes:
    """`d.decompress(data)`; when it fails (a gzip CRC is checked at the member's end, inside the
    call that reads it), the bytes it decoded before failing are salvaged so that the damaged
    member's records can be quarantined one by one (gzip only: zstd objects cannot be copied)."""
    if compression != "gzip":
        return d.decompress(data)
    before = d.copy()
    try:
        return d.decompress(data)
    except zlib.error as e:
        out = bytearray()
        for i in range(0, len(data), 4096):
            piece, saved = data[i:i + 4096], before.copy()
            try:
                out += before.decompress(piece)
            except zlib.error:
                for j in range(len(piece)):          # the failing piece again, byte by byte
                    try:
                        out += saved.decompress(piece[j:j + 1])
                    except zlib.error:
                        break
                break
        raise _PartialOutput(bytes(out), e) from None


@dataclass(frozen=True)
class ArchiveCheck:
    """The first pass over a compressed file: where (in decompressed bytes) the first damaged
    member starts, what failed, and how many members had no checksum to verify."""

    damaged_at: Optional[int]     # decompressed offset of the damaged member's first byte; None: intact
    detail: str = ""
    unchecked_members: int = 0


def check_archive(path: str, compression: str) -> ArchiveCheck:
    kind = {"gzip": "gzip member", "zstd": "zstd frame"}[compression]
    out, unchecked, seen = 0, 0, -1
    with storage.open(path, "rb") as fh:
        try:
            for member, no_check, data in iter_members(fh, compression):
                if member != seen:
                    seen, member_start = member, out
                    unchecked += no_check
                out += len(data)
        except _Damaged as e:
            start = member_start if e.member == seen else out
            return ArchiveCheck(start, f"{kind} {e.member} (at byte {e.offset} of {path}) failed: {e.detail}; "
                                       f"its records are quarantined and nothing after it is read", unchecked)
    return ArchiveCheck(None, "", unchecked)


class _MemberStream(io.RawIOBase):
    """The decompressed bytes of `iter_members` as a file, ending quietly at a damaged member
    (the first pass has already reported it)."""

    def __init__(self, path: str, compression: str):
        self._fh = storage.open(path, "rb")
        self._chunks = iter_members(self._fh, compression)
        self._buf = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not len(self._buf):
            try:
                self._buf = memoryview(next(self._chunks)[2])
            except (StopIteration, _Damaged):
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def close(self) -> None:
        self._fh.close()
        super().close()


def _open_binary(path: str, compression: Optional[str]) -> io.BufferedIOBase:
    if compression is None:
        return storage.open(path, "rb")
    return io.BufferedReader(_MemberStream(path, compression), buffer_size=1 << 20)


def _read_jsonl(split: Split, opts: ReadOptions, counters: dict[str, int]) -> Iterator[pa.RecordBatch]:
    b = _BatchBuilder(split.source, split.path, opts)
    limit = opts.max_line_bytes
    line_no = split.first_line
    check = check_archive(split.path, split.compression) if split.compression else ArchiveCheck(None)
    if check.unchecked_members:
        counters["unchecked_members"] = counters.get("unchecked_members", 0) + check.unchecked_members
    damaged_at = check.damaged_at
    with _open_binary(split.path, split.compression) as fh:
        pos = 0
        if split.start > 0:
            fh.seek(split.start - 1)
            if fh.read(1) != b"\n":
                fh.readline()                 # the rest of a line that belongs to the previous split
            pos = fh.tell()
        end = split.end if split.end >= 0 else None
        while end is None or pos < end:
            try:
                line = fh.readline(limit)
            except (OSError, EOFError, ValueError) as e:   # truncated gzip, corrupt zstd frame ...
                b.bad("unreadable", f"{type(e).__name__}: {e}", line_no, None)
                break
            if not line:
                break
            if pos == 0 and line.startswith(_BOM):
                line = line[len(_BOM):]       # a byte order mark is not part of the first record
                pos = len(_BOM)
            pos += len(line)
            if damaged_at is not None and pos > damaged_at:
                if line.strip():
                    b.bad("corrupt_archive", check.detail, line_no, line)
                else:
                    counters["blank_lines"] = counters.get("blank_lines", 0) + 1
                line_no += 1
                if len(b) >= opts.batch_rows:
                    yield b.flush()
                continue
            if len(line) >= limit and not line.endswith(b"\n"):
                prefix = line
                while True:                   # skip the rest of the oversized line
                    more = fh.readline(limit)
                    pos += len(more)
                    if not more or more.endswith(b"\n"):
                        break
                b.bad("too_large", f"line longer than {limit} bytes", line_no, prefix)
                line_no += 1
                if len(b) >= opts.batch_rows:
                    yield b.flush()
                continue
            stripped = line.strip()
            if not stripped:
                counters["blank_lines"] = counters.get("blank_lines", 0) + 1
                line_no += 1
                continue
            _parse_json_line(b, stripped, line_no, split, opts)
            line_no += 1
            if len(b) >= opts.batch_rows:
                yield b.flush()
    if damaged_at is not None:
        b.bad("corrupt_archive", check.detail, line_no, None)
    if len(b):
        yield b.flush()


def _finite_or_text(text: str) -> float | str:
    value = float(text)
    return value if math.isfinite(value) else text


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_record(raw: bytes) -> Any:
    """One JSON line. orjson, except for numbers it refuses (beyond the float range, `1e400`):
    those lines are parsed by the standard library, with a non-finite number kept as its text
    (so it reaches `meta` as "1e400" instead of quarantining a good record)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        if "number" not in str(e):
            raise
        try:
            return json.loads(raw, parse_float=_finite_or_text, parse_constant=_refuse_constant)
        except ValueError:
            raise e from None


def _parse_json_line(b: _BatchBuilder, raw: bytes, line_no: int, split: Split, opts: ReadOptions) -> None:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        b.bad("invalid_utf8", f"byte {e.start}: {e.reason}", line_no, raw)
        return
    try:
        record = loads_record(raw)
    except orjson.JSONDecodeError as e:
        b.bad("malformed_json", str(e), line_no, raw)
        return
    if not isinstance(record, dict):
        b.bad("not_an_object", f"a JSON {type(record).__name__}", line_no, raw)
        return
    reason, detail, text = _check_text(record.get(opts.text_field), opts)
    if reason:
        b.bad(reason, detail, line_no, raw)
        return
    rid = record.get(opts.id_field) if opts.id_field else None
    exclude = {opts.text_field} | ({opts.id_field} if opts.id_field else set())
    meta = [(k, meta_value(v)) for k, v in record.items() if k not in exclude]
    b.doc(_doc_id(rid, split.source, split.rel, line_no), text, meta, line_no)


def _read_table_batches(split: Split, batches: Iterator[pa.RecordBatch], opts: ReadOptions, first_row: int) -> Iterator[pa.RecordBatch]:
    b = _BatchBuilder(split.source, split.path, opts)
    row = first_row
    for batch in batches:
        names = batch.schema.names
        if opts.text_field not in names:
            for _ in range(batch.num_rows):
                b.bad("missing_text", f"no column {opts.text_field!r} (columns: {names})", row, None)
                row += 1
                if len(b) >= opts.batch_rows:
                    yield b.flush()
            continue
        text_col = batch.column(opts.text_field)
        is_string = pa.types.is_string(text_col.type) or pa.types.is_large_string(text_col.type)
        texts = text_col.cast(pa.large_binary()).to_pylist() if is_string else text_col.to_pylist()
        ids = batch.column(opts.id_field).to_pylist() if opts.id_field and opts.id_field in names else [None] * batch.num_rows
        others = [n for n in names if n not in (opts.text_field, opts.id_field)]
        other_vals = {n: batch.column(n).to_pylist() for n in others}
        for i in range(batch.num_rows):
            value = texts[i]
            raw_for_prefix: Any = None
            if is_string and value is not None:
                try:
                    value = value.decode("utf-8")
                except UnicodeDecodeError as e:
                    b.bad("invalid_utf8", f"byte {e.start}: {e.reason}", row, texts[i])
                    row += 1
                    continue
            reason, detail, text = _check_text(value, opts)
            if reason:
                raw_for_prefix = value if isinstance(value, str) else (None if value is None else json.dumps(value, default=str)[:2000])
                b.bad(reason, detail, row, raw_for_prefix)
            else:
                meta = [(n, meta_value(other_vals[n][i])) for n in others if other_vals[n][i] is not None]
                b.doc(_doc_id(ids[i], split.source, split.rel, row), text, meta, row)
            row += 1
            if len(b) >= opts.batch_rows:
                yield b.flush()
    if len(b):
        yield b.flush()


def read_split(split: Split, opts: ReadOptions, counters: Optional[dict[str, int]] = None) -> Iterator[pa.RecordBatch]:
    """All records of one split as ingest-schema batches (documents and quarantined records).

    A file that cannot be opened or parsed (permissions, a fake or truncated parquet, a damaged
    Arrow file) gives one `unreadable` row naming it and the error, after the rows read before."""
    counters = counters if counters is not None else {}
    line = split.first_line if split.format == "jsonl" else split.row_offset
    if split.problem is not None:
        yield _unreadable_row(split, opts, split.problem, line)
        return
    try:
        yield from _read_format(split, opts, counters)
    except SourceError:
        raise
    except _FILE_ERRORS as e:
        yield _unreadable_row(split, opts, _describe(split.path, e), line)


def _unreadable_row(split: Split, opts: ReadOptions, detail: str, line: int) -> pa.RecordBatch:
    b = _BatchBuilder(split.source, split.path, opts)
    b.bad("unreadable", detail, line, None)
    return b.flush()


def _read_format(split: Split, opts: ReadOptions, counters: dict[str, int]) -> Iterator[pa.RecordBatch]:
    if split.format == "jsonl":
        yield from _read_jsonl(split, opts, counters)
    elif split.format == "parquet":
        pf = storage.parquet_file(split.path)
        groups = list(range(split.start, split.end))
        if groups:
            yield from _read_table_batches(split, pf.iter_batches(batch_size=opts.batch_rows, row_groups=groups),
                                           opts, split.row_offset)
    elif split.format == "arrow":
        with pa.memory_map(split.path) as source:
            try:
                reader = pa.ipc.open_stream(source)
            except pa.ArrowInvalid:
                reader = pa.ipc.open_file(source)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            else:
                batches = iter(reader)
            yield from _read_table_batches(split, batches, opts, 0)
    else:
        raise SourceError(f"unknown split format {split.format!r}")


def iter_texts(files: list[InputFile], opts: ReadOptions, source: str = "labelled") -> Iterator[str]:
    """Texts of good documents, read locally (for training classifiers): no Spark needed."""
    for split in plan_splits(source, files, split_bytes=1 << 62):
        for batch in read_split(split, opts):
            reasons = batch.column("reason").to_pylist()
            for text, reason in zip(batch.column("text").to_pylist(), reasons):
                if reason is None:
                    yield text
