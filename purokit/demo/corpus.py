"""Demo stage "corpus": a multi-source raw corpus from text that exists on any such machine, no network.

Sources (each in a different input format, so the readers are all exercised):
- `code`  (parquet: path, content): the Python standard library's .py files, large files cut at
  top-level definitions;
- `prose` (jsonl + jsonl.gz): documentation text: standard-library docstrings, the package
  descriptions in site-packages (*.dist-info/METADATA), and README/changelog/copyright files
  under /usr/share/doc where the machine has them;
- `math`  (jsonl.zst: text, problem, answer): generated arithmetic word problems with worked
  solutions, the answer in its own field (the synth stage poses these problems to a teacher).

Planted on purpose, and recorded in `planted.json` so the kaiyuan stage can score itself:
near-duplicates (a few words edited, or a line added) and exact duplicates (case and spacing
changed) of about 3% of documents, junk documents (spam, navigation boilerplate, gibberish), and
bad records (malformed JSON, invalid UTF-8, empty and non-string text, an oversized document,
a repeated id).

Also written:
- `eval/<source>.jsonl`: a held-out split (2% of each source, by a seeded hash of the id; never
  in the raw sources), for held-out loss in later stages;
- `labelled/{positives,negatives}.jsonl`: labelled data for the prose quality classifier,
  disjoint from the corpus: documentation prose (docstrings, package descriptions) as positives,
  changelog/copyright boilerplate and generated junk as negatives (DCLM-style: "text like what
  we want" vs "ordinary text").
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import random
import re
import sysconfig
from pathlib import Path
from typing import Any, Iterator

SEED = 1234
EVAL_FRACTION = 0.02
LABELLED_FRACTION = 0.25
CHUNK_CHARS = 4000
MIN_CHARS = 200


# ---- helpers -----------------------------------------------------------------------------------

def unit(key: str, salt: str) -> float:
    """A uniform number in [0, 1) from a key: deterministic choices that do not depend on order."""
    return int.from_bytes(hashlib.blake2b(f"{salt}:{key}".encode(), digest_size=8).digest(), "little") / 2**64


def chunks(text: str, max_chars: int = CHUNK_CHARS) -> list[str]:
    """Paragraph-aligned pieces of at most about `max_chars` (a paragraph longer than that is its own piece)."""
    out, cur = [], ""
    for para in re.split(r"\n\s*\n", text.strip()):
        para = para.strip("\n")
        if not para.strip():
            continue
        if cur and len(cur) + len(para) + 2 > max_chars:
            out.append(cur)
            cur = ""
        cur = f"{cur}\n\n{para}" if cur else para
    if cur:
        out.append(cur)
    return out


# ---- code ----------------------------------------------------------------------------------

def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def code_documents(max_bytes: int) -> list[dict[str, Any]]:
    """Standard-library modules (tests and site-packages excluded), sorted by path; files over
    40 KB are cut at top-level `def`/`class` lines into pieces of about 20 KB."""
    root = stdlib_dir()
    docs, total = [], 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if any(part in ("site-packages", "test", "tests", "idle_test") for part in path.relative_to(root).parts):
            continue
        try:
            src = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        pieces = [src] if len(src) <= 40_000 else _cut_source(src, 20_000)
        for i, piece in enumerate(pieces):
            if len(piece) < MIN_CHARS:
                continue
            docs.append({"path": rel if len(pieces) == 1 else f"{rel}#{i}", "content": piece,
                         "n_lines": piece.count("\n") + 1})
            total += len(piece.encode("utf-8"))
            if total >= max_bytes:
                return docs
    return docs


def _cut_source(src: str, target: int) -> list[str]:
    lines = src.splitlines(keepends=True)
    out, cur, size = [], [], 0
    for line in lines:
        if size >= target and (line.startswith("def ") or line.startswith("class ")):
            out.append("".join(cur))
            cur, size = [], 0
        cur.append(line)
        size += len(line)
    if cur:
        out.append("".join(cur))
    return out


# ---- prose ---------------------------------------------------------------------------------

def docstring_documents() -> Iterator[dict[str, Any]]:
    """One document per module: its docstring and its classes' and functions' docstrings."""
    root = stdlib_dir()
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if any(p in ("site-packages", "test", "tests", "idle_test") for p in parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        paras = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                d = ast.get_docstring(node)
                if d and len(d) > 80:
                    paras.append(d.strip())
        text = "\n\n".join(paras)
        for i, piece in enumerate(chunks(text)):
            if len(piece) >= MIN_CHARS:
                yield {"id": f"doc:{path.relative_to(root).as_posix()}:{i}", "text": piece, "kind": "docstring"}


def package_descriptions() -> Iterator[dict[str, Any]]:
    """The long descriptions (README text) in the installed packages' METADATA files."""
    import importlib.metadata as md

    seen = set()
    for dist in sorted(md.distributions(), key=lambda d: (d.metadata.get("Name") or "").lower()):
        name = (dist.metadata.get("Name") or "").lower()
        if not name or name in seen:
            continue
        seen.add(name)
        body = dist.read_text("METADATA") or ""
        i = body.find("\n\n")
        desc = body[i + 2:] if i >= 0 else ""
        for j, piece in enumerate(chunks(desc)):
            if len(piece) >= MIN_CHARS:
                yield {"id": f"pkg:{name}:{j}", "text": piece, "kind": "readme"}


def share_doc_documents(max_file_chars: int = 30_000) -> Iterator[dict[str, Any]]:
    """README, changelog and copyright text under /usr/share/doc (plain or gzipped), if present."""
    root = Path("/usr/share/doc")
    if not root.is_dir():
        return
    for path in sorted(root.rglob("*")):
        name = path.name.lower()
        if not path.is_file() or path.is_symlink():
            continue
        base = name[:-3] if name.endswith(".gz") else name
        if base.startswith("readme") or base.endswith((".md", ".txt", ".rst")):
            kind = "readme"
        elif base.startswith("changelog") or base == "news" or base.startswith("news."):
            kind = "changelog"
        elif base == "copyright":
            kind = "copyright"
        else:
            continue
        try:
            raw = gzip.open(path).read(max_file_chars * 2) if name.endswith(".gz") else path.read_bytes()[: max_file_chars * 2]
            text = raw.decode("utf-8")[:max_file_chars]
        except (OSError, UnicodeDecodeError, EOFError):
            continue
        rel = path.relative_to(root).as_posix()
        for j, piece in enumerate(chunks(text)):
            if len(piece) >= MIN_CHARS:
                yield {"id": f"share:{rel}:{j}", "text": piece, "kind": kind}


# ---- math ----------------------------------------------------------------------------------

NAMES = ["Ava", "Ben", "Chen", "Dara", "Eli", "Farah", "Gus", "Hana", "Ivan", "Jun", "Kofi", "Lena", "Mo", "Nia",
         "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Vik", "Wen", "Yara", "Zoe", "Amir", "Bea", "Caleb",
         "Dev", "Esme", "Femi", "Greta", "Hugo", "Ines", "Jonah", "Kira", "Luis", "Maya", "Nico", "Olga"]
ITEMS = [("apple", "apples"), ("book", "books"), ("marble", "marbles"), ("stamp", "stamps"), ("pencil", "pencils"),
         ("card", "cards"), ("shell", "shells"), ("coin", "coins"), ("sticker", "stickers"), ("cookie", "cookies"),
         ("plant", "plants"), ("brick", "bricks"), ("ticket", "tickets"), ("bead", "beads"), ("ribbon", "ribbons"),
         ("crayon", "crayons"), ("puzzle", "puzzles"), ("lemon", "lemons"), ("bottle", "bottles"), ("kite", "kites")]
PLACES = ["the market", "school", "the library", "a garage sale", "the park", "a bakery", "the fair", "a bookshop",
          "the harbour", "a toy shop"]
VEHICLES = ["train", "bus", "cyclist", "ferry", "truck", "runner", "delivery van", "tram"]


def math_problem(rng: random.Random, i: int) -> dict[str, Any]:
    """One arithmetic word problem with a worked solution; `answer` is the final number as text.
    Names, items, places and wide number ranges vary independently, so two problems of one
    template rarely share more than a few word 5-grams."""
    name, other = rng.sample(NAMES, 2)
    item, items = rng.choice(ITEMS)
    place = rng.choice(PLACES)
    kind = rng.choice(["add_sub", "multiply", "divide", "two_step", "percent", "rate", "price"])
    if kind == "add_sub":
        a, b, c = rng.randint(20, 900), rng.randint(5, 400), rng.randint(1, 19)
        problem = rng.choice([
            f"{name} has {a} {items}. At {place}, {other} gives {name} {b} more, and then {name} gives away {c}. "
            f"How many {items} does {name} have now?",
            f"On Monday {name} collected {a} {items} and on Tuesday {b} more at {place}. {c} of them got lost. "
            f"How many {items} are left?"])
        ans = a + b - c
        steps = f"Start with {a}. Adding {b} gives {a} + {b} = {a + b}. Taking away {c} leaves {a + b} - {c} = {ans}."
    elif kind == "multiply":
        a, b = rng.randint(3, 60), rng.randint(3, 60)
        problem = rng.choice([
            f"{name} packs {items} for {place}: there are {a} boxes and each box holds {b} {items}. How many {items} are there in all?",
            f"A shelf at {place} has {a} rows with {b} {items} in every row. How many {items} does {name} count on the shelf?"])
        ans = a * b
        steps = f"There are {a} groups of {b}, so the total is {a} x {b} = {ans}."
    elif kind == "divide":
        b = rng.randint(2, 15)
        q, r = rng.randint(3, 90), rng.randint(0, b - 1)
        a = b * q + r
        problem = (f"{name} shares {a} {items} from {place} equally among {b} friends and keeps what is left over. "
                   f"How many {items} does {name} keep?")
        ans = r
        steps = f"{a} divided by {b} is {q} with remainder {r}: {b} x {q} = {b * q}, and {a} - {b * q} = {r}."
    elif kind == "two_step":
        a, b, c = rng.randint(2, 30), rng.randint(4, 50), rng.randint(3, 99)
        problem = rng.choice([
            f"{name} buys {a} packs of {items} at {place} with {b} in each pack, then {other} adds {c} more. "
            f"How many {items} does {name} have?",
            f"There are {a} bags of {items} with {b} {items} in each bag, and {c} loose {items} on the table at {place}. "
            f"How many {items} are there altogether?"])
        ans = a * b + c
        steps = f"The {a} groups hold {a} x {b} = {a * b}. Adding the {c} more: {a * b} + {c} = {ans}."
    elif kind == "percent":
        p = rng.choice([5, 10, 15, 20, 25, 30, 40, 50, 60, 75, 80])
        a = rng.randint(2, 250) * 20
        problem = (f"{name}'s class collected {a} {items} for {place}. {p}% of them were given to {other}. "
                   f"How many {items} did {other} get?")
        ans = a * p // 100
        steps = f"{p}% of {a} is {a} x {p} / 100 = {ans}."
    elif kind == "rate":
        v, t = rng.randint(3, 120), rng.randint(2, 14)
        vehicle = rng.choice(VEHICLES)
        problem = (f"A {vehicle} carrying {name}'s {items} travels at {v} kilometres per hour for {t} hours to reach {place}. "
                   f"How many kilometres does it travel?")
        ans = v * t
        steps = f"Distance is speed times time: {v} x {t} = {ans} kilometres."
    else:
        p, n = rng.randint(2, 40), rng.randint(2, 12)
        paid = (p * n // 10 + 1) * 10 + rng.choice([0, 10, 20, 50])
        problem = (f"At {place} one {item} costs {p} dollars. {name} buys {n} {items} and pays with {paid} dollars. "
                   f"How much change does {name} get?")
        ans = paid - p * n
        steps = f"The {items} cost {p} x {n} = {p * n} dollars. The change is {paid} - {p * n} = {ans} dollars."
    text = f"Problem: {problem}\n\nSolution: {steps} The answer is {ans}."
    return {"id": f"math-{i:06d}", "text": text, "problem": problem, "answer": str(ans), "kind": kind}


# ---- planting ------------------------------------------------------------------------------

JUNK = [
    lambda rng: " ".join(rng.choice(["cheap", "best", "price", "buy", "now", "watches", "free", "shipping", "deal",
                                     "click", "online", "discount"]) for _ in range(rng.randint(150, 300))),
    lambda rng: "\n".join(rng.choice(["Home", "About us", "Contact", "Privacy Policy", "Terms of Use", "Login",
                                      "Sign up", "Cart (0)", "Subscribe", "Follow us"]) for _ in range(rng.randint(40, 90))),
    lambda rng: "".join(rng.choice("qwxzjkv#@$%^&*()0123456789 ") for _ in range(rng.randint(800, 2000))),
    lambda rng: ("Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * rng.randint(10, 40)).strip(),
    lambda rng: ("Click here to read more. " + "Share this page on social media! ") * rng.randint(10, 30),
]


def near_copy(rng: random.Random, text: str, code: bool) -> str:
    """A light edit: a few words replaced (prose, math) or a comment line added and one line
    changed (code). Word 5-gram Jaccard with the original stays around 0.8-0.95."""
    if code:
        lines = text.split("\n")
        pos = rng.randrange(len(lines))
        lines.insert(pos, f"# note {rng.randrange(10**6)}: kept for backwards compatibility")
        return "\n".join(lines)
    words = text.split(" ")
    n_edits = max(1, len(words) // 120)
    for pos in rng.sample(range(len(words)), min(n_edits, len(words))):
        words[pos] = rng.choice(["also", "indeed", "often", "usually", "still", "simply"])
    return " ".join(words)


def exact_copy(text: str) -> str:
    """Equal after NFKC + case-fold + whitespace collapse."""
    return "  " + text.upper().replace(" ", "   ") + "\n"


def plant(rng: random.Random, docs: list[dict[str, Any]], id_key: str, text_key: str, source: str,
          code: bool = False, fraction: float = 0.03) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    planted, extra = [], []
    for d in docs:
        if rng.random() >= fraction or len(d[text_key]) < 400:
            continue
        copies = []
        for k in range(rng.choice([1, 1, 2])):
            c = dict(d)
            c[id_key] = f"{d[id_key]}~near{k}"
            c[text_key] = near_copy(rng, d[text_key], code)
            extra.append(c)
            copies.append(c[id_key])
        kind = "near"
        if rng.random() < 0.3:
            c = dict(d)
            c[id_key] = f"{d[id_key]}~exact"
            c[text_key] = exact_copy(d[text_key])
            extra.append(c)
            copies.append(c[id_key])
            kind = "near+exact"
        planted.append({"source": source, "original": d[id_key], "copies": copies, "kind": kind})
    return docs + extra, planted


# ---- the stage -------------------------------------------------------------------------------

def _write_jsonl(path: Path, records: list[dict[str, Any]], opener=open) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with opener(path, "wt", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")


def _hold_out(docs: list[dict[str, Any]], id_key: str, source: str) -> tuple[list, list]:
    keep, held = [], []
    for d in docs:
        (held if unit(d[id_key], f"eval:{source}") < EVAL_FRACTION else keep).append(d)
    return keep, held


def run(ctx) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    from purokit import atomic

    out = ctx.stage_dir()
    for sub in ("sources", "eval", "labelled"):
        if (out / sub).exists():
            import shutil

            shutil.rmtree(out / sub)
    rng = random.Random(SEED)
    mb = 1_000_000
    code_mb = float(ctx.size("corpus_code_mb", 6.0))
    prose_mb = float(ctx.size("corpus_prose_mb", 6.0))
    math_n = int(ctx.size("corpus_math_problems", 5000))

    # code
    ctx.step(f"code: Python standard library ({stdlib_dir()}), up to {code_mb:g} MB")
    code = code_documents(int(code_mb * mb))
    code, code_eval = _hold_out(code, "path", "code")
    code, code_planted = plant(rng, code, "path", "content", "code", code=True)

    # prose: documentation; a hash-chosen part goes to the classifier's labelled data instead
    ctx.step(f"prose: docstrings, package descriptions, /usr/share/doc, up to {prose_mb:g} MB")
    positives, negatives, prose = [], [], []
    budget = int(prose_mb * mb)
    used = 0
    sources = [docstring_documents(), package_descriptions(), share_doc_documents()]
    # interleave the three so a small budget still mixes all kinds
    iters = [iter(s) for s in sources]
    while iters and used < budget:
        for it in list(iters):
            d = next(it, None)
            if d is None:
                iters.remove(it)
                continue
            if unit(d["id"], "labelled") < LABELLED_FRACTION:
                (positives if d["kind"] in ("docstring", "readme") and not d["id"].startswith("share:") else
                 negatives if d["kind"] in ("changelog", "copyright") else positives).append(d)
                continue
            prose.append(d)
            used += len(d["text"].encode("utf-8"))
            if used >= budget:
                break
    prose, prose_eval = _hold_out(prose, "id", "prose")
    junk = [{"id": f"junk-{i:04d}", "text": JUNK[i % len(JUNK)](rng), "kind": "junk"} for i in range(max(5, len(prose) // 50))]
    prose, prose_planted = plant(rng, prose + junk, "id", "text", "prose")
    for i in range(max(50, len(negatives) // 4)):
        negatives.append({"id": f"neg-junk-{i}", "text": JUNK[i % len(JUNK)](rng), "kind": "junk"})

    # math
    ctx.step(f"math: {math_n} generated word problems with answers")
    math = [math_problem(rng, i) for i in range(math_n)]
    math, math_eval = _hold_out(math, "id", "math")
    math, math_planted = plant(rng, math, "id", "text", "math")

    src = out / "sources"
    for lst in (code, prose, math):
        rng.shuffle(lst)
    # code as parquet
    (src / "code").mkdir(parents=True, exist_ok=True)
    t = pa.table({"path": [d["path"] for d in code], "content": [d["content"] for d in code],
                  "n_lines": [d["n_lines"] for d in code]})
    pq.write_table(t, src / "code" / "stdlib.parquet", row_group_size=512)
    # prose as jsonl (with the bad records) + jsonl.gz
    half = len(prose) // 2
    _write_jsonl(src / "prose" / "docs-0.jsonl", prose[:half])
    with open(src / "prose" / "docs-0.jsonl", "ab") as fh:
        fh.write(b'{"id": "broken", "text": "this line was cut off\n')                 # malformed JSON
        fh.write(b'{"id": "latin1", "text": "caf\xe9 au lait"}\n')                    # invalid UTF-8
        fh.write(b'{"id": "blank", "text": "   "}\n')                                # empty text
        fh.write(b'{"id": "number", "text": 12345}\n')                               # non-string text
        fh.write(json.dumps({"id": prose[0]["id"], "text": "a second record with a used id"}).encode() + b"\n")
        fh.write(json.dumps({"id": "huge", "text": "word " * 400_000}).encode() + b"\n")   # 2 MB > the 1 MiB limit
    _write_jsonl(src / "prose" / "docs-1.jsonl.gz", prose[half:], opener=gzip.open)
    # math as jsonl.zst
    (src / "math").mkdir(parents=True, exist_ok=True)
    raw = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in math).encode("utf-8")
    (src / "math" / "problems.jsonl.zst").write_bytes(zstandard.ZstdCompressor(level=3).compress(raw))

    eval_files = {}
    for name, held, text_key, id_key in (("code", code_eval, "content", "path"), ("prose", prose_eval, "text", "id"),
                                         ("math", math_eval, "text", "id")):
        eval_files[name] = str(out / "eval" / f"{name}.jsonl")
        _write_jsonl(out / "eval" / f"{name}.jsonl", [{"id": d[id_key], "text": d[text_key],
                                                       **({"problem": d["problem"], "answer": d["answer"]} if name == "math" else {})}
                                                      for d in held])
    _write_jsonl(out / "labelled" / "positives.jsonl", [{"id": d["id"], "text": d["text"]} for d in positives])
    _write_jsonl(out / "labelled" / "negatives.jsonl", [{"id": d["id"], "text": d["text"]} for d in negatives])
    planted = code_planted + prose_planted + math_planted
    atomic.write_json(out / "planted.json", {"schema": "demo.planted/1", "groups": planted,
                                             "bad_records": {"prose": ["malformed_json", "invalid_utf8", "empty_text",
                                                                       "non_string_text", "duplicate_id", "too_large"]}})
    sizes = {
        "code": sum(len(d["content"].encode()) for d in code),
        "prose": sum(len(d["text"].encode()) for d in prose),
        "math": sum(len(d["text"].encode()) for d in math),
    }
    counts = {"code": len(code), "prose": len(prose), "math": len(math)}
    ctx.step("written: " + ", ".join(f"{k} {counts[k]} docs / {sizes[k] / mb:.1f} MB" for k in counts)
             + f"; {sum(len(g['copies']) for g in planted)} planted copies in {len(planted)} groups, "
               f"{len(junk)} junk documents; labelled {len(positives)} positive / {len(negatives)} negative")
    return {
        "sources": {"code": str(src / "code"), "prose": str(src / "prose"), "math": str(src / "math")},
        "formats": {"code": "parquet (path, content)", "prose": "jsonl + jsonl.gz", "math": "jsonl.zst (text, problem, answer)"},
        "eval": eval_files,
        "labelled": {"positives": str(out / "labelled" / "positives.jsonl"),
                     "negatives": str(out / "labelled" / "negatives.jsonl")},
        "planted": str(out / "planted.json"),
        "n_docs": counts,
        "n_bytes": sizes,
    }


def summary(result: dict[str, Any]) -> list[str]:
    mb = 1_000_000
    lines = [f"{k:<6} {result['n_docs'][k]:>6} docs  {result['n_bytes'][k] / mb:5.1f} MB  {result['sources'][k]}  "
             f"({result['formats'][k]})" for k in ("code", "prose", "math")]
    lines.append(f"held-out eval split (2% per source): {Path(result['eval']['code']).parent}/<source>.jsonl")
    lines.append(f"planted duplicates and junk: {result['planted']}")
    return lines
