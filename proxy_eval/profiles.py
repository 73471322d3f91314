"""Capability profiles: the slice × benchmark table, group scores, averages and rankings (Puro §3.6).

Every benchmark result becomes a *score* on one scale, a percentage where higher is better:
fractions (accuracy, exact match, pass@1, gold-answer probability) times 100, as the paper reports
them; bits per byte as 100·2^(−bpb), the geometric-mean probability per byte in percent, so a
likelihood task and an accuracy task can share a group mean without one's units drowning the
other's (other lower-is-better metrics are negated). A group score is the unweighted mean of its members' scores, the overall average the
unweighted mean over all benchmarks (Puro §4.1.3: "Avg is the unweighted arithmetic mean"; group
means are the spec's [CHOICE] for §3.4). Means use exact summation (`math.fsum`), so rankings do
not change when the benchmark order changes (behaviour 17).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from purokit import atomic
from purokit.errors import ContractError

LONG_COLUMNS = ["slice", "task", "group", "format", "metric", "value", "stderr", "n", "higher_is_better", "score",
                "score_stderr"]


def to_score(value: float, higher_is_better: bool, percent: bool, fmt: str | None = None) -> float:
    if fmt == "bits_per_byte":
        return 100.0 * 2.0 ** (-value)
    if not higher_is_better:
        return -value
    return 100.0 * value if percent else value


def to_score_stderr(value: float, stderr: float, higher_is_better: bool, percent: bool, fmt: str | None = None) -> float:
    if fmt == "bits_per_byte":      # delta method: d/dx 100·2^-x = -ln2 · 100·2^-x
        return math.log(2.0) * 100.0 * 2.0 ** (-value) * stderr
    return 100.0 * stderr if (percent and higher_is_better) else stderr


def _fmean(values: Iterable[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return math.fsum(vals) / len(vals) if vals else float("nan")


@dataclass
class Profile:
    """`long`: one row per (slice, task); `scores`: slice × task (oriented scores); `groups`:
    slice × group; `average`: per slice; `ranks`: slice × (overall, groups...), 1 = best, empty
    for reference rows (the base model)."""

    long: pd.DataFrame
    scores: pd.DataFrame
    groups: pd.DataFrame
    average: pd.Series
    ranks: pd.DataFrame
    task_groups: dict[str, str]

    def wide(self) -> pd.DataFrame:
        out = self.scores.copy()
        for g in self.groups.columns:
            out[f"group:{g}"] = self.groups[g]
        out["average"] = self.average
        out["rank"] = self.ranks["overall"]
        return out.sort_values(["rank"], kind="stable", na_position="first")

    def write(self, directory: str | Path) -> dict[str, str]:
        """profile.parquet (long), profile.csv (wide), groups.csv, ranks.csv, atomically."""
        d = Path(directory)
        paths = {"parquet": d / "profile.parquet", "csv": d / "profile.csv", "groups": d / "groups.csv",
                 "ranks": d / "ranks.csv"}
        with atomic.atomic_path(paths["parquet"]) as tmp:
            self.long.to_parquet(tmp, index=False)
        atomic.write_text(paths["csv"], self.wide().to_csv(float_format="%.6g", index_label="slice"))
        groups = self.groups.copy()
        groups["average"] = self.average
        atomic.write_text(paths["groups"], groups.to_csv(float_format="%.6g", index_label="slice"))
        atomic.write_text(paths["ranks"], self.ranks.to_csv(index_label="slice"))
        return {k: str(v) for k, v in paths.items()}

    def table_lines(self, max_width: int = 12) -> list[str]:
        """A plain-text table for terminals: slice, groups, average, rank."""
        cols = list(self.groups.columns)
        name_w = max([len("slice")] + [len(str(s)) for s in self.scores.index])
        head = f"{'slice':<{name_w}}  " + "  ".join(f"{c[:max_width]:>{max_width}}" for c in cols + ["average"]) + "  rank"
        lines = [head, "-" * len(head)]
        for s in self.wide().index:
            vals = [self.groups.loc[s, c] for c in cols] + [self.average[s]]
            lines.append(f"{s:<{name_w}}  " + "  ".join(f"{v:>{max_width}.3f}" for v in vals)
                         + (f"  {int(self.ranks.loc[s, 'overall']):>4}" if pd.notna(self.ranks.loc[s, "overall"])
                            else "   ref"))
        return lines


def rank_desc(values: pd.Series) -> pd.Series:
    """Rank 1 = highest; ties share the best rank; NaN last. Deterministic."""
    return values.rank(ascending=False, method="min", na_option="bottom").astype(int)


REFERENCE_ROWS = frozenset({"base"})


def build_profile(rows: list[dict[str, Any]], task_groups: dict[str, str] | None = None,
                  reference: frozenset[str] | set[str] = REFERENCE_ROWS) -> Profile:
    """Rows: {slice, task, group, format, metric, value, stderr, n, higher_is_better}. Rows named in
    `reference` (the base model a proxy run continues) are shown but not ranked."""
    if not rows:
        raise ValueError("no results to build a profile from")
    recs = []
    for r in rows:
        fmt = r.get("format")
        hib = bool(r["higher_is_better"])
        percent = fmt != "bits_per_byte" and hib
        value = float(r["value"])
        se = float(r.get("stderr", float("nan")))
        recs.append({**{k: r.get(k) for k in LONG_COLUMNS if k in r},
                     "score": to_score(value, hib, percent, fmt),
                     "score_stderr": to_score_stderr(value, se, hib, percent, fmt)})
    long = pd.DataFrame.from_records(recs)
    for c in LONG_COLUMNS:
        if c not in long.columns:
            long[c] = None
    long = long[LONG_COLUMNS].sort_values(["slice", "task"], kind="stable").reset_index(drop=True)
    groups_of = dict(task_groups or {})
    for t, g in zip(long["task"], long["group"]):
        groups_of.setdefault(t, g)
    scores = long.pivot(index="slice", columns="task", values="score")
    scores = scores[sorted(scores.columns)]
    group_names = sorted(set(groups_of[t] for t in scores.columns))
    groups = pd.DataFrame(index=scores.index, columns=group_names, dtype=float)
    for s in scores.index:
        for g in group_names:
            groups.loc[s, g] = _fmean(scores.loc[s, t] for t in scores.columns if groups_of[t] == g)
    average = pd.Series({s: _fmean(scores.loc[s, t] for t in scores.columns) for s in scores.index}, name="average")
    ranked = [r for r in scores.index if r not in reference]
    ranks = pd.DataFrame({"overall": rank_desc(average[ranked])}, index=scores.index)
    for g in group_names:
        ranks[g] = rank_desc(groups.loc[ranked, g])
    ranks = ranks.astype("Int64")
    return Profile(long, scores, groups, average, ranks, groups_of)


def read_profile(path: str | Path) -> Profile:
    """Rebuild a Profile from its long parquet (profile.parquet or its directory)."""
    p = Path(path)
    if p.is_dir():
        p = p / "profile.parquet"
    long = pd.read_parquet(p)
    missing = [c for c in ("slice", "task", "group", "value", "higher_is_better") if c not in long.columns]
    if missing:
        raise ContractError(p, f"not a profile table: missing columns {missing}")
    return build_profile(long.drop(columns=["score", "score_stderr"], errors="ignore").to_dict("records"))
