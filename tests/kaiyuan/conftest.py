"""One local Spark session for all kaiyuan tests, and small corpora with planted duplicates."""

import json
import random
from pathlib import Path

import pytest

WORDS = ("the of and to in is was for on that with as by at from his her an are this which be or have had "
         "not were but they all one their has been its who more when some would there after new first also two "
         "time into only other over such these most may any many then them state year about people well work").split()


def prose(rng: random.Random, n_words: int) -> str:
    """English-looking text (stop words + rare words) with sentences: passes or fails filters on its merits."""
    out, sentence = [], []
    for _ in range(n_words):
        w = rng.choice(WORDS) if rng.random() < 0.55 else f"{rng.choice('bcdfghklmnprst')}{rng.choice('aeiou')}{rng.choice('nrstlm')}{rng.choice('aeiou')}{rng.choice('kstnrm')}"
        sentence.append(w)
        if len(sentence) > rng.randrange(8, 18):
            out.append(" ".join(sentence).capitalize() + ".")
            sentence = []
    if sentence:
        out.append(" ".join(sentence).capitalize() + ".")
    return " ".join(out)


def mutate(rng: random.Random, text: str, n_edits: int) -> str:
    words = text.split()
    for pos in rng.sample(range(len(words)), n_edits):
        words[pos] = f"edit{rng.randrange(10**6)}"
    return " ".join(words)


def write_jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
    return path


def planted_corpus(seed: int, n_unique: int, n_groups: int, prefix: str = "d"):
    """Unique documents plus groups of near-duplicates (3 light edits of a base, J ~ 0.9) and one
    exact duplicate (different case and spacing). Returns records and the expected clusters."""
    rng = random.Random(seed)
    records, clusters = [], []
    for i in range(n_unique):
        records.append({"id": f"{prefix}{i:04d}", "text": prose(rng, 220), "url": f"https://example.org/{i}"})
    for g in range(n_groups):
        base = records[g]
        members = [base["id"]]
        for k in range(rng.randrange(1, 4)):
            rid = f"{prefix}{g:04d}-v{k}"
            records.append({"id": rid, "text": mutate(rng, base["text"], 3)})
            members.append(rid)
        clusters.append(sorted(members))
    exact_src = records[n_groups + 1]
    records.append({"id": f"{prefix}zz-exact", "text": "  " + exact_src["text"].upper().replace(" ", "   ") + " "})
    clusters.append(sorted([exact_src["id"], f"{prefix}zz-exact"]))
    rng.shuffle(records)
    return records, clusters


_SESSION = {}


def _live_session():
    from pyspark.sql import SparkSession

    s = _SESSION.get("spark")
    if s is None or s.sparkContext._jsc is None or s.sparkContext._jsc.sc().isStopped():
        s = (SparkSession.builder.master("local[2]").appName("kaiyuan-tests")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4").config("spark.driver.memory", "2g")
             .config("spark.sql.session.timeZone", "UTC").config("spark.sql.parquet.compression.codec", "zstd")
             .config("spark.python.worker.reuse", "true").getOrCreate())
        s.sparkContext.setLogLevel("ERROR")
        _SESSION["spark"] = s
    return s


@pytest.fixture
def spark():
    """The shared local[2] session (re-created if another package's tests stopped it)."""
    return _live_session()


def pytest_sessionfinish(session, exitstatus):
    s = _SESSION.get("spark")
    # another package's tests may have stopped it (getOrCreate hands out the same session)
    if s is not None and s.sparkContext._jsc is not None:
        s.stop()
