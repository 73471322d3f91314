"""The one filesystem layer: local paths and object-store URLs (s3://, gs://, abfs://, ...) alike.

Local paths stay `pathlib.Path` and every local operation is the plain POSIX one it always was; a
URL becomes a `upath.UPath` over its fsspec filesystem (s3fs, gcsfs, adlfs: the optional extras),
with credentials and endpoints from the environment as the SDKs read them (AWS_* variables,
GOOGLE_APPLICATION_CREDENTIALS, an instance role ...). The same code runs in Spark executors.

Directory outputs are committed two ways, one API (`new_attempt` + `commit`, or `atomic_path`):

- POSIX: the files are written into a temporary sibling directory, then renamed into place.
- Object stores, which have no atomic rename: the files are written under a unique attempt prefix
  inside the output (`<out>/_attempt-<id>/`), and the commit record `<out>/_commit.json`, which
  lists the attempt and every file in it with its size and sha256, is written last, in one PUT
  (atomic on S3, GCS and Azure). A reader trusts only what the commit record lists (`committed`),
  so a killed writer's attempt is invisible; the next commit (or `clean_uncommitted`) deletes it.

Contract files (component and shard manifests, checkpoint state) are byte-identical either way:
the commit record sits beside them, not inside them.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import IO, Any, Iterator, Union

import pyarrow.fs as pafs
import pyarrow.parquet as pq
from upath import UPath

from purokit.errors import ContractError

TMP_PREFIX = ".tmp-"
ATTEMPT_PREFIX = "_attempt-"
COMMIT_NAME = "_commit.json"
COMMIT_SCHEMA = "commit/1"
CACHE_ENV = "PUROKIT_CACHE_DIR"          # where object-store inputs are staged (default ~/.cache/purokit)
_CHUNK = 1 << 20
_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]+)://")
_ATTEMPT_NAME = re.compile(r"^_attempt-[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_UNKNOWN = object()                      # the state of a commit record an attempt began from was not recorded
# attempt URL -> the stamp (ETag) of the output's commit record when the attempt began (None: no record)
_ATTEMPT_BASES: dict[str, Any] = {}

AnyPath = Union[str, os.PathLike]
# Listings are never cached: executors in other processes write the objects a driver lists.
_FS_OPTIONS: dict[str, dict[str, Any]] = {"s3": {"use_listings_cache": False}, "gs": {"use_listings_cache": False},
                                          "gcs": {"use_listings_cache": False}}


# ---- paths -----------------------------------------------------------------------------------

def protocol(p: AnyPath) -> str:
    """The URL scheme of `p` ("s3", "gs", ...), or "file" for a local path."""
    m = _URL.match(str(p))
    return m.group(1).lower() if m and m.group(1).lower() != "file" else "file"


def is_remote(p: AnyPath) -> bool:
    return protocol(p) != "file"


def path(p: AnyPath):
    """A `Path` for a local path (unchanged), a `UPath` for a URL: `/`, `.name`, `.parent`,
    `.open()`, `.is_file()`, `.iterdir()` work on both."""
    if isinstance(p, UPath) and not isinstance(p, Path):
        return p
    s = os.fspath(p) if not isinstance(p, str) else p
    if not is_remote(s):
        return Path(s[len("file://"):] if s.startswith("file://") else s)
    return UPath(s, **_FS_OPTIONS.get(protocol(s), {}))


def join(base: AnyPath, *parts: str) -> str:
    """`base/part/...` as a string, for a local path or a URL."""
    return str(path(base).joinpath(*parts))


def filesystem(p: AnyPath) -> tuple[Any, str]:
    """(fsspec filesystem, path within it) for `p`."""
    import fsspec

    s = str(p)
    return fsspec.core.url_to_fs(s, **_FS_OPTIONS.get(protocol(s), {}))


def arrow_filesystem(p: AnyPath) -> tuple[Any, str]:
    """(pyarrow filesystem, path within it), for `pyarrow.parquet` / `pyarrow.dataset` readers."""
    if not is_remote(p):
        return pafs.LocalFileSystem(), str(path(p))
    fs, inner = filesystem(p)
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), inner


def open(p: AnyPath, mode: str = "rb", **kwargs: Any) -> IO:  # noqa: A001 - the one `open`
    """`open()` for a local path, the fsspec file for a URL. Binary reads of a URL come wrapped
    in an `io.BufferedReader`, so `readline(limit)`, `seek` and `tell` behave as on a local file."""
    if not is_remote(p):
        return builtins.open(path(p), mode, **kwargs)
    fs, inner = filesystem(p)
    with _naming_missing(p):
        fh = fs.open(inner, mode, **kwargs)
    return io.BufferedReader(fh, buffer_size=_CHUNK) if mode == "rb" else fh


@contextlib.contextmanager
def _naming_missing(p: AnyPath) -> Iterator[None]:
    """An object store's FileNotFoundError ("The specified key does not exist.") names the URL."""
    try:
        yield
    except FileNotFoundError as e:
        if str(p) in str(e):
            raise
        raise FileNotFoundError(f"{p}: no such object ({e})") from None


def parquet_file(p: AnyPath) -> pq.ParquetFile:
    """`pyarrow.parquet.ParquetFile` of a local path or a URL (ranged reads on object stores)."""
    if not is_remote(p):
        return pq.ParquetFile(p)
    fs, inner = arrow_filesystem(p)
    with _naming_missing(p):
        return pq.ParquetFile(inner, filesystem=fs)


def parquet_metadata(p: AnyPath) -> pq.FileMetaData:
    if not is_remote(p):
        return pq.read_metadata(p)
    fs, inner = arrow_filesystem(p)
    with _naming_missing(p):
        return pq.read_metadata(inner, filesystem=fs)


def exists(p: AnyPath) -> bool:
    return path(p).exists()


def is_dir(p: AnyPath) -> bool:
    return path(p).is_dir()


def size(p: AnyPath) -> int:
    return path(p).stat().st_size


def makedirs(p: AnyPath) -> None:
    """mkdir -p locally; nothing on object stores (prefixes need no creating)."""
    if not is_remote(p):
        Path(p).mkdir(parents=True, exist_ok=True)


def remove_tree(p: AnyPath) -> None:
    """rm -rf a file or directory (or prefix); missing is fine."""
    if not is_remote(p):
        q = Path(p)
        if q.is_dir() and not q.is_symlink():
            shutil.rmtree(q, ignore_errors=True)
        else:
            q.unlink(missing_ok=True)
        return
    fs, inner = filesystem(p)
    with contextlib.suppress(FileNotFoundError):
        fs.rm(inner, recursive=True)


def move_aside(src: AnyPath, dst: AnyPath) -> bool:
    """Rename file or directory `src` to `dst` (kept for a post-mortem): `os.replace` locally (an
    existing non-empty `dst` directory stays, and `src` with it); a server-side copy then delete
    on an object store, replacing what `dst` held. False if nothing was moved."""
    if not is_remote(src):
        try:
            os.replace(src, dst)
            return True
        except OSError:
            return False
    fs, inner = filesystem(src)
    _, dst_inner = filesystem(dst)
    objects = fs.find(inner.rstrip("/"))
    if not objects:
        return False
    remove_tree(dst)
    for obj in objects:                     # object by object: prefixes are no objects to copy
        fs.copy(obj, dst_inner.rstrip("/") + obj[len(inner.rstrip("/")):])
    remove_tree(src)
    return True


def glob(pattern: str) -> list[str]:
    """Sorted matches of a glob pattern (`**` recursive), as local paths or URLs."""
    if not is_remote(pattern):
        import glob as _glob

        return sorted(_glob.glob(pattern, recursive=True))
    fs, inner = filesystem(pattern)
    proto = protocol(pattern)
    return sorted(f"{proto}://{m}" for m in fs.glob(inner))


def _skipped(rel: str) -> bool:
    return any(part.startswith((".", "_")) for part in rel.split("/"))


def list_files(directory: AnyPath, hidden: bool = False) -> list[tuple[str, int, str]]:
    """Every file under `directory`, sorted: (path relative to it, size, stamp); entries whose
    name starts with `.` or `_` (and everything under them) are skipped unless `hidden`. The stamp
    is the mtime in ns locally, the ETag / generation on object stores. For an object-store
    file, the one entry is its own name."""
    out: list[tuple[str, int, str]] = []
    if not is_remote(directory):
        root = Path(directory)
        for dirpath, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if hidden or not d.startswith((".", "_")))
            for name in sorted(files):
                if hidden or not name.startswith((".", "_")):
                    f = Path(dirpath) / name
                    st = f.stat()
                    out.append((f.relative_to(root).as_posix(), st.st_size, str(st.st_mtime_ns)))
        return sorted(out, key=_path_order)
    fs, inner = filesystem(directory)
    inner = inner.rstrip("/")
    for name, info in fs.find(inner, detail=True).items():
        rel = name[len(inner) + 1:] if name != inner else name.rsplit("/", 1)[-1]
        if info.get("type") == "directory" or not rel or (not hidden and _skipped(rel)):
            continue
        stamp = str(info.get("ETag") or info.get("etag") or info.get("generation") or info.get("mtime") or "")
        out.append((rel, int(info["size"]), stamp.strip('"')))
    return sorted(out, key=_path_order)


def _path_order(entry: tuple[str, int, str]) -> list[str]:
    """Sort like `sorted(pathlib paths)`: by path components, not by the string."""
    return entry[0].split("/")


def sha256_file(p: AnyPath) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def write_bytes(p: AnyPath, data: bytes) -> None:
    """Write a whole file: temp + fsync + rename locally, one PUT on an object store (a reader
    sees the old object or the new one, never part of one)."""
    if is_remote(p):
        fs, inner = filesystem(p)
        fs.pipe_file(inner, data)
        return
    with atomic_path(p) as tmp:
        tmp.write_bytes(data)


# ---- POSIX: temp, fsync, rename --------------------------------------------------------------

def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _local_tmp_beside(final: Path, suffix: str = "") -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{final.name}.", suffix=suffix, dir=final.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.unlink()
    return tmp


def replace_local(tmp: Path, final: Path) -> None:
    """Rename `tmp` onto `final` (a file, or a directory replacing a non-empty one), then fsync."""
    if tmp.is_file():
        with builtins.open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
    if final.is_dir() and not final.is_symlink():
        # os.replace cannot replace a non-empty directory: move the old one aside first.
        old = final.with_name(f"{TMP_PREFIX}{final.name}.old")
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(final.parent)


def _remove_local(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists() or p.is_symlink():
        p.unlink()


@contextlib.contextmanager
def atomic_path(final: AnyPath, suffix: str = "") -> Iterator[Path]:
    """Yield a local temporary path for `final` (the caller creates a file or a directory there);
    on success it becomes `final`: renamed locally; uploaded for a URL (a file in one PUT, a
    directory as an attempt committed by its record). On an exception `final` is untouched."""
    if not is_remote(final):
        final_p = Path(final)
        tmp = _local_tmp_beside(final_p, suffix)
        try:
            yield tmp
            replace_local(tmp, final_p)
        except BaseException:
            _remove_local(tmp)
            raise
        return
    scratch = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=_scratch_root()))
    tmp = scratch / (path(final).name + suffix)
    base = record_stamp(final)              # a directory commits only over the record it began from
    try:
        yield tmp
        if tmp.is_dir():
            publish_dir(tmp, final, base=base)
        else:
            fs, inner = filesystem(final)
            fs.put_file(str(tmp), inner)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def clean_stale_tmp(directory: AnyPath) -> list:
    """Remove what killed writers left in `directory` (not recursive): `.tmp-*` entries locally;
    on an object store, the uncommitted attempts of every output directory in it."""
    removed: list = []
    if not is_remote(directory):
        d = Path(directory)
        if not d.is_dir():
            return removed
        for p in d.iterdir():
            if p.name.startswith(TMP_PREFIX):
                _remove_local(p)
                removed.append(p)
        return removed
    fs, inner = filesystem(directory)
    if not fs.isdir(inner):
        return removed
    for child in fs.ls(inner, detail=False):
        if fs.isdir(child):
            removed += clean_uncommitted(f"{protocol(directory)}://{child}")
    return removed


# ---- object stores: attempts and commit records ----------------------------------------------

def new_attempt(final: AnyPath):
    """Where a directory output's files are written before `commit`: a `.tmp-*` sibling on POSIX
    (created), a fresh `_attempt-<id>` prefix inside the output on an object store."""
    if not is_remote(final):
        final_p = Path(final)
        final_p.parent.mkdir(parents=True, exist_ok=True)
        tmp = final_p.parent / f"{TMP_PREFIX}{final_p.name}.{uuid.uuid4().hex[:12]}"
        return tmp
    attempt = path(final) / f"{ATTEMPT_PREFIX}{uuid.uuid4().hex[:12]}"
    _ATTEMPT_BASES[str(attempt)] = record_stamp(final)
    return attempt


def commit_record(attempt: str, files: list[tuple[str, int, str]]) -> dict[str, Any]:
    """The commit record of an attempt: every file it holds with its size and sha256."""
    return {"schema": COMMIT_SCHEMA, "attempt": attempt,
            "files": [{"path": rel, "n_bytes": n, "sha256": sha} for rel, n, sha in sorted(files)]}


def commit(attempt: AnyPath, final: AnyPath, known_sha256: dict[str, str] | None = None) -> None:
    """Make the files written under `attempt` the content of `final` (see the module docstring).

    `known_sha256` (relative path -> sha256) spares re-reading files whose hash the caller
    already measured (a component's parts are hashed for its manifest).

    On an object store the commit record is put only if the output's record is still the one
    the attempt began from (a conditional PUT): of two writers of one output, the first to commit
    wins whole and the other fails naming the output, its attempt discarded."""
    if not is_remote(final):
        replace_local(Path(attempt), Path(final))
        return
    att = path(attempt)
    base = _ATTEMPT_BASES.pop(str(att), _UNKNOWN)
    known = known_sha256 or {}
    listing = list_files(att, hidden=True)
    _check_attempt_whole(att, final, known, {rel for rel, _, _ in listing})
    if not listing:
        raise ContractError(att, "nothing was written under this attempt")
    files = [(rel, n, known.get(rel) or sha256_file(att / rel)) for rel, n, _ in listing]
    _put_record(final, att, _dump(commit_record(att.name, files)), base)
    after = {rel for rel, _, _ in list_files(att, hidden=True)}
    _check_attempt_whole(att, final, {rel: "" for rel, _, _ in files}, after, withdraw=True)
    clean_uncommitted(final)


def record_stamp(final: AnyPath) -> str | None:
    """The stamp (ETag, generation) of object-store output `final`'s commit record; None if it has none."""
    fs, inner = filesystem(join(final, COMMIT_NAME))
    try:
        info = fs.info(inner)
    except FileNotFoundError:
        return None
    return str(info.get("ETag") or info.get("etag") or info.get("generation") or info.get("mtime") or "")


def _put_record(final: AnyPath, att, data: bytes, base: Any) -> None:
    """Put the commit record if the output's record is still `base` (None: there is none); S3 checks
    it server-side (If-None-Match / If-Match), other stores just before the PUT."""
    fs, inner = filesystem(join(final, COMMIT_NAME))
    if base is _UNKNOWN:                    # the attempt began elsewhere: guard at least read-then-put
        base = record_stamp(final)
    if protocol(final) == "s3":
        condition = {"IfNoneMatch": "*"} if base is None else {"IfMatch": base}
        try:
            fs.pipe_file(inner, data, **condition)
            return
        except OSError as e:            # 412 Precondition Failed, 409 a concurrent conditional write
            code = getattr(e.__cause__, "response", {}).get("Error", {}).get("Code")
            if not (isinstance(e, FileExistsError) or code in ("PreconditionFailed", "ConditionalRequestConflict")
                    or "pre-condition" in str(e).lower()):
                raise
    elif record_stamp(final) == base:
        fs.pipe_file(inner, data)
        return
    remove_tree(att)
    raise ContractError(final, f"another writer committed this output while attempt {att.name} was being written "
                               "(its commit record changed since the attempt began): this attempt is discarded "
                               "and the other writer's output stands; run again to replace it")


def _check_attempt_whole(att, final: AnyPath, expected: dict[str, str], present: set[str],
                         withdraw: bool = False) -> None:
    """Refuse a commit whose attempt lost files it was written with (another writer of the same
    output cleaned it as debris); after the record's PUT (`withdraw`), take the record back."""
    gone = sorted(set(expected) - present)
    if not gone:
        return
    if withdraw and (read_commit(final) or {}).get("attempt") == att.name:
        remove_tree(join(final, COMMIT_NAME))
    remove_tree(att)
    raise ContractError(final, f"{len(gone)} file(s) of attempt {att.name} vanished before it was committed "
                               f"({join(att, gone[0])}{', ...' if len(gone) > 1 else ''}): another writer of this "
                               "output removed them; nothing of this attempt is committed, run again")


def publish_dir(local_dir: Path, final: AnyPath, *, base: Any = _UNKNOWN) -> None:
    """Upload a finished local directory to `final` on an object store as one committed attempt;
    `base`: the stamp of `final`'s commit record when the directory began to be written
    (`record_stamp`), if not now."""
    attempt = new_attempt(final)
    if base is not _UNKNOWN:
        _ATTEMPT_BASES[str(attempt)] = base
    fs, inner = filesystem(attempt)
    listing = list_files(local_dir, hidden=True)
    known = {}
    for rel, _, _ in listing:
        fs.put_file(str(local_dir / rel), f"{inner}/{rel}")
        known[rel] = sha256_file(local_dir / rel)
    commit(attempt, final, known)


def read_commit(final: AnyPath) -> dict[str, Any] | None:
    """The commit record of an object-store output directory, or None if nothing is committed."""
    p = path(final) / COMMIT_NAME
    try:
        raw = json.loads(p.read_bytes())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        raise ContractError(p, f"not valid JSON ({e})") from None
    if not isinstance(raw, dict) or raw.get("schema") != COMMIT_SCHEMA:
        raise ContractError(p, f"not a commit record (schema {raw.get('schema') if isinstance(raw, dict) else raw!r})")
    check_record(raw, p)
    return raw


def check_record(record: dict[str, Any], where: object) -> None:
    """A commit record names its attempt by a plain `_attempt-<hex>` name and every file by a plain
    relative name inside it (`/`-separated, no absolute path, no `.` or `..` part): anything else
    would stage or read outside the output. Raises ContractError naming the record and the entry."""
    attempt = record.get("attempt")
    if not isinstance(attempt, str) or not _ATTEMPT_NAME.match(attempt):
        raise ContractError(where, f"attempt {attempt!r} is not a plain {ATTEMPT_PREFIX}<hex> name", field="attempt")
    files = record.get("files")
    if not isinstance(files, list):
        raise ContractError(where, f"expected a list of files, got {type(files).__name__}", field="files")
    seen: set[str] = set()
    for i, f in enumerate(files):
        rel = f.get("path") if isinstance(f, dict) else None
        problem = entry_problem(rel) if isinstance(f, dict) else "is not an object"
        if problem is None and rel in seen:
            problem = "is listed twice"
        elif problem is None and not (isinstance(f.get("n_bytes"), int) and f["n_bytes"] >= 0):
            problem = f"has n_bytes {f.get('n_bytes')!r}, not a size"
        elif problem is None and not (isinstance(f.get("sha256"), str) and _SHA256.match(f["sha256"])):
            problem = f"has sha256 {f.get('sha256')!r}, not 64 hex digits"
        if problem is not None:
            raise ContractError(where, f"entry {i} ({rel!r}) {problem}: refused", field=f"files[{i}]")
        seen.add(rel)


def entry_problem(rel: Any) -> str | None:
    """Why `rel` is not a plain relative file name inside an output, or None if it is."""
    if not isinstance(rel, str) or not rel:
        return "is not a non-empty file name"
    if rel.startswith("/") or "\\" in rel or re.match(r"^[A-Za-z]:", rel):
        return "is an absolute path or uses a separator other than '/'"
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return "has an empty, '.' or '..' part (names must stay inside the output)"
    if any(ord(c) < 32 for c in rel):
        return "holds a control character"
    return None


def committed(final: AnyPath):
    """Where the committed files of output directory `final` are: `final` itself on POSIX (or
    None if it is not a directory); its committed attempt on an object store (None if none)."""
    if not is_remote(final):
        p = Path(final)
        return p if p.is_dir() else None
    record = read_commit(final)
    return path(final) / record["attempt"] if record else None


def has_committed(directory: AnyPath, name: str) -> bool:
    """Whether output directory `directory` has a committed file `name` (e.g. its manifest)."""
    if not is_remote(directory):
        return (Path(directory) / name).is_file()
    record = read_commit(directory)
    return record is not None and any(f["path"] == name for f in record["files"])


def clean_uncommitted(final: AnyPath) -> list:
    """Delete the attempts under object-store output `final` that its commit record does not name
    (none while the record is unreadable: its reader reports it, a new commit replaces it)."""
    if not is_remote(final):
        return []
    try:
        record = read_commit(final)
    except ContractError:
        return []
    keep = record["attempt"] if record else None
    fs, inner = filesystem(final)
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for child in fs.ls(inner, detail=False):
            name = child.rstrip("/").rsplit("/", 1)[-1]
            if name.startswith(ATTEMPT_PREFIX) and name != keep:
                fs.rm(child, recursive=True)
                removed.append(path(f"{protocol(final)}://{child}"))
    return removed


# ---- staging object-store inputs locally -----------------------------------------------------

def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "purokit")


def _scratch_root() -> Path:
    root = cache_root() / "scratch"
    root.mkdir(parents=True, exist_ok=True)
    return root


def local_scratch(p: AnyPath) -> Path:
    """`p` itself when it is local; for a URL, a local directory standing for it in the cache
    (work files, spills, logs that a job keeps beside an object-store output)."""
    if not is_remote(p):
        return Path(p)
    return cache_root() / "scratch" / hashlib.sha256(str(p).rstrip("/").encode()).hexdigest()[:24]


@contextlib.contextmanager
def writer_lock(final: AnyPath) -> Iterator[None]:
    """Be the one process of this machine (of this cache) writing output `final`: a second one is
    refused at once, naming the output, instead of sharing its work files. Writers on other
    machines are kept apart by the commit record's conditional PUT (`commit`)."""
    where = str(path(final)) if is_remote(final) else str(Path(final).resolve())
    lock = cache_root() / "locks" / (hashlib.sha256(where.rstrip("/").encode()).hexdigest()[:24] + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with builtins.open(lock, "a") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ContractError(final, f"another process on this machine is writing this output (it holds {lock}); "
                                       "wait for it to finish, or write elsewhere") from None
        yield                                # the lock goes with the file handle, also when the process dies


def local_copy(directory: AnyPath) -> Path:
    """A local directory with the committed content of `directory`: `directory` itself when it is
    local; for an object store, a copy in the cache (`$PUROKIT_CACHE_DIR`, keyed by the committed
    attempt), each file checked against the commit record's size and sha256 before it is used
    (memory-mapped shards, checkpoints). A file already staged and intact is not fetched again."""
    if not is_remote(directory):
        return Path(directory)
    record = read_commit(directory)
    if record is None:
        raise ContractError(directory, f"nothing committed here (no {COMMIT_NAME}: the job that writes it has "
                                       "not finished, or this is not an output directory)")
    key = hashlib.sha256(f"{str(directory).rstrip('/')}\0{record['attempt']}".encode()).hexdigest()[:24]
    local = cache_root() / "staged" / key
    src = path(directory) / record["attempt"]
    fs, inner = filesystem(src)
    for i, f in enumerate(record["files"]):
        dest = _staged_path(local, f["path"], path(directory) / COMMIT_NAME, i)
        if dest.is_file() and dest.stat().st_size == f["n_bytes"] and sha256_file(dest) == f["sha256"]:
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = _local_tmp_beside(dest)
        try:
            _fetch(fs, src, f["path"], tmp)
            got = sha256_file(tmp)
            if got != f["sha256"] or tmp.stat().st_size != f["n_bytes"]:
                raise ContractError(src / f["path"], f"sha256 {got[:16]}… / {tmp.stat().st_size} bytes do not match "
                                                     f"the commit record's {f['sha256'][:16]}… / {f['n_bytes']} bytes")
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
    return local


def _staged_path(local: Path, rel: str, record: object, i: int) -> Path:
    """Where entry `rel` of a commit record is staged: resolved, and refused (naming the record and
    the entry) unless it stays inside the output's staging directory in the cache."""
    dest = (local / rel).resolve()
    if not (dest.is_relative_to(local.resolve()) and dest.is_relative_to(cache_root().resolve())):
        raise ContractError(record, f"entry {i} ({rel!r}) would be staged at {dest}, outside {local}: refused",
                            field=f"files[{i}]")
    return dest


def _fetch(fs: Any, src: Any, rel: str, dest: Path) -> None:
    """Download object `src/rel` to `dest`; a missing object is an error naming its URL."""
    _, inner = filesystem(src)
    try:
        fs.get_file(f"{inner}/{rel}", str(dest))
    except FileNotFoundError:
        why = ("the commit record lists it, but the object does not exist" if fs.exists(inner) else
               f"the commit record names attempt {src.name}, which holds no objects (deleted?)")
        raise ContractError(src / rel, why + "; the output is damaged, write it again") from None


def _dump(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
