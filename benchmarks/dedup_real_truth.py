"""Real-text dedup corpus and its exact ground truth (used by benchmarks/dedup_real.py).

Corpus: text that is installed on this machine, in five sources, each document one file:
  copyright  /usr/share/doc/*/copyright (Debian licence summaries: GPL/BSD/MIT boilerplate, templated)
  licenses   /usr/share/common-licenses/* and the LICENSE*/COPYING* files of installed Python packages
  man        English manual pages, /usr/share/man/man*/*.gz decompressed (raw troff source)
  docs       *.md / *.rst / *.txt documentation and the METADATA (README) of installed Python packages
  code       *.py files of installed Python packages (vendored and versioned copies are near-duplicates)
Files below 200 bytes or above 300 KB, or that are not UTF-8 text, are skipped; the larger sources
are sampled deterministically (xxh64 of the path) down to a cap. Nothing is generated or planted.

Ground truth (exact, no sketches): a document's shingle set is the set of its word 5-grams after
kaiyuan's normalization (NFKC, lower-case, words = runs of letters, digits and marks; a document of
1-4 words is one shingle), each 5-gram an exact tuple of word ids (no hashing). Every pair with
Jaccard >= t is found by prefix filtering (Chaudhuri et al. 2006; Xiao et al., PPJoin, 2008): with
words ordered by document frequency, two sets with J >= t share a word among the first
|A| - ceil(t |A|) + 1 of each, so only pairs sharing a prefix shingle (and with size ratio >= t)
are candidates, and each candidate's intersection is counted exactly (`kaiyuan.minhash.jaccard`).
Documents with the same normalized text (kaiyuan's exact key) are also duplicates (J = 1).

Removed-set ground truth: the connected components of the graph of true edges (J >= t) within each
source; an ideal exact dedup keeps one document per component and removes the others, so it
removes sum(|C| - 1). A system's removal set R is scored per component: a removal is correct while
it leaves at least one member of its true component (true positives = sum over components of
min(|R & C|, |C| - 1)); every other removal (a document with no true duplicate, or the last member
of a component) is a false positive. precision = TP / |R|, recall = TP / sum(|C| - 1). This does not
depend on which member a system keeps; kaiyuan keeps the smallest id, and its `strict` score
compares R with exactly "every member but the smallest id" as well.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from kaiyuan import exact as ex
from kaiyuan import minhash as mh

MIN_BYTES, MAX_BYTES = 200, 300_000
SITE_DIRS = ("/work/main/.venv/lib", "/root/.pyenv/versions", "/usr/lib/python3", "/usr/lib/python3.11",
             "/usr/local/lib")
CAPS = {"copyright": None, "licenses": None, "man": 8000, "docs": 6000, "code": 3000}


# ---- corpus ----------------------------------------------------------------------------------

def _read_text(path: Path) -> str | None:
    try:
        raw = path.read_bytes() if path.suffix != ".gz" else gzip.decompress(path.read_bytes())
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    if not MIN_BYTES <= len(raw) <= MAX_BYTES or b"\x00" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _walk(roots: Iterable[str], match) -> list[Path]:
    out = set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", ".git"))
            for f in filenames:
                p = Path(dirpath) / f
                if match(p) and not p.is_symlink():
                    out.add(p)
    return sorted(out)


def source_paths() -> dict[str, list[Path]]:
    sites = [d for d in SITE_DIRS if os.path.isdir(d)]
    return {
        "copyright": sorted(p for p in Path("/usr/share/doc").glob("*/copyright") if not p.is_symlink()),
        "licenses": sorted(p for p in Path("/usr/share/common-licenses").iterdir() if p.is_file())
                    + _walk(sites, lambda p: p.name.upper().startswith(("LICENSE", "LICENCE", "COPYING"))),
        "man": sorted(p for p in Path("/usr/share/man").glob("man*/*.gz") if not p.is_symlink()),
        "docs": _walk(sites + ["/usr/share/doc"], lambda p: p.suffix in (".md", ".rst", ".txt") or p.name == "METADATA"),
        "code": _walk(sites, lambda p: p.suffix == ".py"),
    }


def build_corpus(out: Path, caps: dict[str, int | None] = CAPS) -> dict:
    """Two jsonl files per source under `out/<source>/` ({"id": path, "text": ...}), sorted by id;
    returns the file lists and counts."""
    index = out / "corpus.json"
    if index.is_file():
        return json.loads(index.read_text())
    out.mkdir(parents=True, exist_ok=True)
    files, counts = {}, {}
    for source, paths in source_paths().items():
        docs = []
        for p in paths:
            text = _read_text(p)
            if text is not None and text.strip():
                docs.append((str(p), text))
        cap = caps.get(source)
        if cap is not None and len(docs) > cap:
            docs = sorted(docs, key=lambda d: xxhash.xxh64_intdigest(d[0]))[:cap]
        docs.sort()                                   # by id: the smallest id is the first of a cluster
        half = (len(docs) + 1) // 2                   # two files per source: both systems use 2 workers
        (out / source).mkdir(exist_ok=True)
        files[source] = []
        for k, part in enumerate((docs[:half], docs[half:])):
            path = out / source / f"part-{k}.jsonl"
            with open(path, "w", encoding="utf-8") as fh:
                for doc_id, text in part:
                    fh.write(json.dumps({"id": doc_id, "text": text}) + "\n")
            files[source].append(str(path))
        counts[source] = len(docs)
    info = {"files": files, "docs": counts, "n_docs": sum(counts.values())}
    index.write_text(json.dumps(info, indent=1))
    return info


def read_source(paths: list[str]) -> tuple[list[str], list[str]]:
    ids, texts = [], []
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                r = json.loads(line)
                ids.append(r["id"])
                texts.append(r["text"])
    return ids, texts


# ---- exact shingle sets ----------------------------------------------------------------------

def word_lists(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """kaiyuan's words of every text as dense word ids: (ids, lengths)."""
    normalized = mh.normalize_for_shingles(pa.array(texts, type=pa.large_string()).cast(pa.string()))
    words = pc.split_pattern_regex(normalized, mh._SEPARATORS)
    flat = pc.list_flatten(words)
    parents = pc.list_parent_indices(words).to_numpy(zero_copy_only=False)
    keep = pc.greater(pc.utf8_length(flat), 0).to_numpy(zero_copy_only=False)
    encoded = pc.dictionary_encode(flat.filter(pa.array(keep)))
    ids = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    lengths = np.bincount(parents[keep], minlength=len(texts)).astype(np.int64)
    return ids, lengths


def shingle_id_sets(texts: list[str], n: int = 5) -> list[np.ndarray]:
    """Each document's set of word n-grams as sorted dense ids (exact: the n-gram's word ids, not a hash)."""
    ids, lengths = word_lists(texts)
    if ids.size and ids.max() >= 1 << 25:
        raise ValueError("more than 2^25 distinct words: widen the packing")
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    grams, owners = [], []
    for d in range(len(texts)):
        w = ids[offsets[d]:offsets[d + 1]]
        if len(w) == 0:
            continue
        if len(w) < n:
            w = np.concatenate([w, np.full(n - len(w), -1)])   # the whole short document, padded
            win = w[None, :]
        else:
            win = np.lib.stride_tricks.sliding_window_view(w, n)
        grams.append(win + 1)                                    # 0..2^25, padding 0
        owners.append(np.full(len(win), d, dtype=np.int64))
    if not grams:
        return [np.zeros(0, dtype=np.int64) for _ in texts]
    g = np.concatenate(grams).astype(np.uint64)
    own = np.concatenate(owners)
    # 5 x 25 bits in two words, exactly
    hi = (g[:, 0] << np.uint64(38)) | (g[:, 1] << np.uint64(13)) | (g[:, 2] >> np.uint64(12))
    lo = ((g[:, 2] & np.uint64(0xFFF)) << np.uint64(50)) | (g[:, 3] << np.uint64(25)) | g[:, 4]
    order = np.lexsort((lo, hi))
    new = np.ones(len(order), dtype=bool)
    new[1:] = (hi[order][1:] != hi[order][:-1]) | (lo[order][1:] != lo[order][:-1])
    dense = np.empty(len(order), dtype=np.int64)
    dense[order] = np.cumsum(new) - 1
    by_doc = np.lexsort((dense, own))
    dense, own = dense[by_doc], own[by_doc]
    out = [np.zeros(0, dtype=np.int64) for _ in texts]
    bounds = np.flatnonzero(np.diff(own)) + 1
    for seg_own, seg in zip(own[np.r_[0, bounds]], np.split(dense, bounds)):
        out[int(seg_own)] = np.unique(seg)
    return out


# ---- all pairs with J >= t (prefix filtering) ------------------------------------------------

def similar_pairs(sets: list[np.ndarray], t: float) -> list[tuple[int, int, float]]:
    """Every pair (i < j) of non-empty sets with exact Jaccard >= t, with its Jaccard."""
    nonempty = [i for i, s in enumerate(sets) if len(s)]
    # identical sets: one representative enters the join, its copies get J = 1 edges
    groups: dict[bytes, list[int]] = defaultdict(list)
    for i in nonempty:
        groups[sets[i].tobytes()].append(i)
    edges = [(g[0], k, 1.0) for g in groups.values() for k in g[1:]]
    reps = [g[0] for g in groups.values()]
    if len(reps) < 2:
        return edges
    df = np.bincount(np.concatenate([sets[i] for i in reps]))
    rank = np.empty(len(df), dtype=np.int64)
    rank[np.lexsort((np.arange(len(df)), df))] = np.arange(len(df))   # rarest first
    toks, docs = [], []
    for i in reps:
        r = np.sort(rank[sets[i]])
        p = len(r) - math.ceil(t * len(r) - 1e-9) + 1
        toks.append(r[:p])
        docs.append(np.full(p, i, dtype=np.int64))
    toks, docs = np.concatenate(toks), np.concatenate(docs)
    order = np.lexsort((docs, toks))
    toks, docs = toks[order], docs[order]
    bounds = np.flatnonzero(np.diff(toks)) + 1
    size = {i: len(sets[i]) for i in reps}
    cand = set()
    for seg in np.split(docs, bounds):
        if len(seg) < 2:
            continue
        seg = seg.tolist()
        for x in range(len(seg)):
            a = seg[x]
            for b in seg[x + 1:]:
                lo, hi = (size[a], size[b]) if size[a] <= size[b] else (size[b], size[a])
                if lo >= t * hi:
                    cand.add((a, b) if a < b else (b, a))
    cand = sorted(cand)
    for k in range(0, len(cand), 20_000):
        chunk = cand[k:k + 20_000]
        a = mh.Ragged(np.concatenate([sets[i] for i, _ in chunk]).astype(np.uint64), np.array([len(sets[i]) for i, _ in chunk]))
        b = mh.Ragged(np.concatenate([sets[j] for _, j in chunk]).astype(np.uint64), np.array([len(sets[j]) for _, j in chunk]))
        js = mh.jaccard(mh.intersection_sizes(a, b), a.lengths, b.lengths)
        edges.extend((i, j, float(x)) for (i, j), x in zip(chunk, js) if x >= t)
    # copies of a representative share its edges through the J = 1 edge: enough for components
    return edges


def exact_key_edges(texts: list[str]) -> list[tuple[int, int, float]]:
    first: dict[bytes, int] = {}
    out = []
    for i, t in enumerate(texts):
        k = ex.exact_key(t)
        if k in first:
            out.append((first[k], i, 1.0))
        else:
            first[k] = i
    return out


def components(n: int, edges: Iterable[tuple[int, int, float]]) -> np.ndarray:
    """Union-find: the smallest member of each document's component."""
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b, _ in edges:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return np.array([find(i) for i in range(n)])


def source_truth(ids: list[str], texts: list[str], thresholds=(0.7, 0.8), n_grams: int = 5) -> dict:
    """Per threshold: component root (index of the smallest id) of every document, and edge counts.
    `ids` must be sorted ascending so that the smallest index is the smallest id."""
    if ids != sorted(ids):
        raise ValueError("ids must be sorted")
    sets = shingle_id_sets(texts, n_grams)
    edges = similar_pairs(sets, min(thresholds)) + exact_key_edges(texts)
    out = {}
    for t in thresholds:
        e = [x for x in edges if x[2] >= t]
        roots = components(len(ids), e)
        sizes = np.bincount(roots, minlength=len(ids))
        out[t] = {"roots": roots, "edges": len(e), "to_remove": int((roots != np.arange(len(ids))).sum()),
                  "clusters": int((sizes > 1).sum()), "largest": int(sizes.max()) if len(ids) else 0}
    return out


# ---- scoring ---------------------------------------------------------------------------------

def score(ids: list[str], roots: np.ndarray, removed: set[str]) -> dict:
    """Removed-set precision and recall of `removed` against the components `roots` (see the top)."""
    index = {d: i for i, d in enumerate(ids)}
    unknown = [r for r in removed if r not in index]
    if unknown:
        raise ValueError(f"{len(unknown)} removed ids are not in the corpus, e.g. {unknown[0]!r}")
    sizes = np.bincount(roots, minlength=len(ids))
    hit = np.zeros(len(ids), dtype=np.int64)
    for r in removed:
        hit[roots[index[r]]] += 1
    room = np.maximum(sizes - 1, 0)                  # removals a component can take (0 for non-roots)
    tp = int(np.minimum(hit, room).sum())
    ideal = int(room.sum())
    strict_ideal = {ids[i] for i in np.flatnonzero(roots != np.arange(len(ids)))}
    strict_tp = len(removed & strict_ideal)
    return {"removed": len(removed), "ideal": ideal, "tp": tp,
            "precision": round(tp / len(removed), 4) if removed else 1.0,
            "recall": round(tp / ideal, 4) if ideal else 1.0,
            "strict_precision": round(strict_tp / len(removed), 4) if removed else 1.0,
            "strict_recall": round(strict_tp / len(strict_ideal), 4) if strict_ideal else 1.0}
