"""Validators and pure steps of the financial-reasoning generator (Nemotron 3 Super §3.1.1
"Financial reasoning"; spec §2.4; FinLLMs' executable-program idea, anchors §2.2).

- `expand_templates` / `instance_problems`: seed question templates with placeholders expanded
  over a company table (ticker, name, GICS sub-industry) and fiscal years; a comparison only pairs
  companies of one GICS sub-industry, and `instance_problems` rejects anything else.
- `paraphrase_problems`: a paraphrase keeps every company and year of its instance.
- `cap_markdown`: the context document under a token cap, dropping whole sections from the end.
- `check_arithmetic`: where the answer is numeric and the context holds the figures, the
  candidate's `Calculation:` line is executed (a safe arithmetic evaluator, no `eval`), its
  operands must be figures of the context, and its result must equal the stated answer.
- `parse_selection` / `parse_answerability`: GenSelect's judge verdict and the answerability label.
- `percentile_bounds` / `remove_outliers`, `dedup_questions`: the final filters.
"""

from __future__ import annotations

import ast
import itertools
import math
import operator
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

# ---------------------------------------------------------------------------------------------
# Companies and templates
# ---------------------------------------------------------------------------------------------

_PLACEHOLDER_RE = re.compile(r"\{([a-z_]+)\}")
SINGLE_FIELDS = {"company", "ticker", "year", "prev_year"}
COMPARISON_FIELDS = SINGLE_FIELDS | {"peer", "peer_ticker"}


@dataclass(frozen=True)
class Company:
    ticker: str
    name: str
    gics_sub_industry: str
    sector: str = ""


@dataclass(frozen=True)
class Template:
    id: str
    text: str
    kind: str = "single"            # single | comparison
    numeric: bool = True
    sections: tuple[str, ...] = ()  # filing sections the question needs (SecQue metadata)

    def placeholders(self) -> set[str]:
        return set(_PLACEHOLDER_RE.findall(self.text))


def template_problems(t: Template) -> list[str]:
    fields = t.placeholders()
    allowed = COMPARISON_FIELDS if t.kind == "comparison" else SINGLE_FIELDS
    problems = []
    if t.kind not in ("single", "comparison"):
        problems.append(f"template {t.id}: kind must be single or comparison")
    if fields - allowed:
        problems.append(f"template {t.id}: unknown placeholders {sorted(fields - allowed)} for kind {t.kind}")
    if "year" not in fields:
        problems.append(f"template {t.id}: needs a {{year}} placeholder")
    if not fields & {"company", "ticker"}:
        problems.append(f"template {t.id}: needs a {{company}} or {{ticker}} placeholder")
    if t.kind == "comparison" and not fields & {"peer", "peer_ticker"}:
        problems.append(f"template {t.id}: a comparison needs a {{peer}} or {{peer_ticker}} placeholder")
    return problems


@dataclass
class Instance:
    """One template filled with companies and years."""

    template_id: str
    kind: str
    tickers: list[str]
    gics_sub_industry: str
    fiscal_years: list[int]
    question: str
    numeric: bool = True
    sections: list[str] = field(default_factory=list)

    @property
    def combo_key(self) -> str:
        return f"{self.template_id}|{','.join(self.tickers)}|{','.join(map(str, self.fiscal_years))}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fill_template(t: Template, company: Company, year: int, peer: Company | None = None) -> Instance:
    values = {"company": company.name, "ticker": company.ticker, "year": str(year), "prev_year": str(year - 1)}
    if peer is not None:
        values.update(peer=peer.name, peer_ticker=peer.ticker)
    question = _PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], t.text)
    years = [year - 1, year] if "prev_year" in t.placeholders() else [year]
    tickers = [company.ticker] + ([peer.ticker] if peer is not None else [])
    return Instance(template_id=t.id, kind=t.kind, tickers=tickers, gics_sub_industry=company.gics_sub_industry,
                    fiscal_years=years, question=question, numeric=t.numeric, sections=list(t.sections))


def expand_templates(templates: Sequence[Template], companies: Sequence[Company], years: Sequence[int],
                     rng: Any, max_per_template: int | None = None) -> list[Instance]:
    """All (template, company[, peer], year) combinations, comparisons only within one GICS
    sub-industry (Nemotron 3 §3.1.1), optionally sampled down to `max_per_template` each with
    `rng` (a `random.Random`; the caller records its seed). Order is deterministic."""
    out: list[Instance] = []
    by_sub: dict[str, list[Company]] = {}
    for c in companies:
        by_sub.setdefault(c.gics_sub_industry, []).append(c)
    for t in templates:
        combos: list[tuple[Company, Company | None, int]] = []
        # a year-over-year question needs the previous year inside the range too
        usable = [y for y in years if "prev_year" not in t.placeholders() or (y - 1) in years]
        for year in usable:
            if t.kind == "comparison":
                for group in by_sub.values():
                    combos.extend((a, b, year) for a, b in itertools.permutations(group, 2))
            else:
                combos.extend((c, None, year) for c in companies)
        if max_per_template is not None and len(combos) > max_per_template:
            idx = sorted(rng.sample(range(len(combos)), max_per_template))
            combos = [combos[i] for i in idx]
        out.extend(fill_template(t, a, y, b) for a, b, y in combos)
    return out


def instance_problems(inst: Instance, companies: dict[str, Company], year_range: tuple[int, int]) -> list[str]:
    """Why an instance breaks §2.4's rules (unknown ticker, year out of range, cross-sub-industry
    comparison); empty when it is fine."""
    problems = []
    for t in inst.tickers:
        if t not in companies:
            problems.append(f"ticker {t} is not in the company table")
    lo, hi = year_range
    for y in inst.fiscal_years:
        if not lo <= y <= hi:
            problems.append(f"fiscal year {y} outside {lo}-{hi}")
    if inst.kind == "comparison":
        if len(inst.tickers) != 2 or inst.tickers[0] == inst.tickers[1]:
            problems.append("a comparison needs two different companies")
        elif all(t in companies for t in inst.tickers):
            subs = {companies[t].gics_sub_industry for t in inst.tickers}
            if len(subs) != 1:
                problems.append(f"comparison across GICS sub-industries: {' vs '.join(sorted(subs))}")
    return problems


# ---------------------------------------------------------------------------------------------
# Paraphrases
# ---------------------------------------------------------------------------------------------

def normalize_question(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9%.$]+", " ", text.lower()).split())


def _mentions(text: str, company: Company) -> bool:
    low = text.lower()
    if re.search(rf"\b{re.escape(company.ticker.lower())}\b", low):
        return True
    name = company.name.lower().replace(",", "")
    core = re.sub(r"\b(inc|incorporated|corp|corporation|co|company|plc|ltd|holdings|group|the)\b\.?", "", name).strip()
    core = " ".join(core.split())
    return bool(core) and core in " ".join(low.replace(",", "").split())


def paraphrase_problems(paraphrase: str, inst: Instance, companies: dict[str, Company],
                        earlier: Iterable[str] = (), max_length_ratio: float = 3.0) -> list[str]:
    """A paraphrase must keep every company and fiscal year of its instance, differ from the
    original and from earlier paraphrases, and not balloon."""
    problems = []
    text = paraphrase.strip()
    if not text:
        return ["empty paraphrase"]
    for t in inst.tickers:
        if t in companies and not _mentions(text, companies[t]):
            problems.append(f"drops the company {companies[t].name} ({t})")
    for y in inst.fiscal_years:
        if str(y) not in text and not re.search(rf"\bFY\s?'?{str(y)[2:]}\b", text):
            problems.append(f"drops the fiscal year {y}")
    norm = normalize_question(text)
    if norm == normalize_question(inst.question):
        problems.append("identical to the original question")
    if norm in {normalize_question(e) for e in earlier}:
        problems.append("identical to an earlier paraphrase")
    if len(text) > max_length_ratio * max(len(inst.question), 1):
        problems.append(f"{len(text)} characters, more than {max_length_ratio}x the original")
    return problems


# ---------------------------------------------------------------------------------------------
# Context documents
# ---------------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def count_tokens_regex(text: str) -> int:
    """Words and punctuation marks: a tokenizer-free count that is stable across runs."""
    return len(_TOKEN_RE.findall(text))


def cap_markdown(markdown: str, max_tokens: int, count_tokens: Callable[[str], int] = count_tokens_regex) -> tuple[str, int, bool]:
    """(capped text, its token count, truncated?). Whole `#` sections are kept in order while they
    fit; a first section that alone exceeds the cap is cut at a line boundary."""
    total = count_tokens(markdown)
    if total <= max_tokens:
        return markdown, total, False
    sections = re.split(r"(?m)^(?=#{1,6}\s)", markdown)
    kept: list[str] = []
    used = 0
    for sec in sections:
        n = count_tokens(sec)
        if used + n > max_tokens:
            break
        kept.append(sec)
        used += n
    if not kept:
        lines_kept: list[str] = []
        for line in markdown.splitlines(keepends=True):
            n = count_tokens(line)
            if used + n > max_tokens:
                break
            lines_kept.append(line)
            used += n
        kept = lines_kept
    text = "".join(kept).rstrip() + "\n"
    return text, count_tokens(text), True


# ---------------------------------------------------------------------------------------------
# Executable arithmetic (FinLLMs)
# ---------------------------------------------------------------------------------------------

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.Pow: operator.pow, ast.Mod: operator.mod}
_FUNCS: dict[str, Callable[..., float]] = {"abs": abs, "round": round, "min": min, "max": max, "sum": lambda *a: sum(a)}
# Numbers a calculation may use without finding them in the context: percent, scales, periods.
DEFAULT_CONSTANTS = frozenset({0.0, 1.0, 2.0, 3.0, 4.0, 12.0, 100.0, 365.0, 1000.0, 1e6, 1e9})
_NUMBER_RE = re.compile(r"(?<![\w.])\(?-?\$?\s?(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?\)?%?")


def eval_arithmetic(expr: str) -> tuple[float, list[float]]:
    """(value, operands) of an arithmetic expression: numbers, + - * / ** %, parentheses,
    abs/round/min/max/sum. Anything else raises ValueError; nothing is executed with `eval`."""
    expr = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", expr).replace("$", "").replace("×", "*").replace("−", "-").strip().rstrip(".")
    expr = re.sub(r"(\d+(?:\.\d+)?)%", r"(\1/100)", expr)
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expr[:80]!r}") from None
    operands: list[float] = []

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            operands.append(float(node.value))
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 100:
                raise ValueError("exponent too large")
            try:
                return float(_BINOPS[type(node.op)](left, right))
            except ZeroDivisionError:
                raise ValueError("division by zero") from None
            except OverflowError:
                raise ValueError("the calculation is not finite") from None
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords:
            args = [ev(a) for a in node.args]
            if node.func.id == "round" and len(args) == 2:
                if not float(args[1]).is_integer():
                    raise ValueError("round() needs a whole number of digits")
                args[1] = int(args[1])
            try:
                return float(_FUNCS[node.func.id](*args))
            except TypeError as e:
                raise ValueError(f"{node.func.id}(): {e}") from None
        raise ValueError(f"not allowed in a calculation: {ast.unparse(node)[:60]!r}")

    value = ev(tree.body)
    if not math.isfinite(value):
        raise ValueError("the calculation is not finite")
    return value, operands


def _number_spans(text: str) -> list[tuple[float, re.Match]]:
    out = []
    for m in _NUMBER_RE.finditer(text):
        raw = m.group(1).replace(",", "") + (m.group(2) or "")
        try:
            v = float(raw)
        except ValueError:
            continue
        whole = m.group(0).rstrip("%")
        neg = (whole.startswith("(") and whole.endswith(")")) or whole.lstrip("(").startswith("-")
        out.append((-v if neg else v, m))
    return out


def numbers_in_text(text: str) -> list[float]:
    """Every number written in `text` (thousands separators, $, %, accounting parentheses)."""
    return [v for v, _ in _number_spans(text)]


# Numbers an answer mentions for comparison, not as its result: "up from 1.2", "(from 394,328 to ...)".
_ASIDE_RE = re.compile(r"\([^()]*[A-Za-z][^()]*\)")
_REFERENCE_WORDS = re.compile(r"(?:\bfrom|\bcompared\s+(?:to|with)|\bversus|\bvs\.?|\bthan|\bagainst)\s*\$?\s*$", re.I)


def stated_number(answer: str) -> tuple[float, str] | None:
    """(value, as written) of the figure an answer states as its result: the last number outside
    asides in parentheses, not a year, not a figure it compares against ("from X", "than X"), else
    the last number (Issue 14: the first number of "In 2023, revenue fell 2.8%" is the year). None when it states no number."""
    spans = _number_spans(answer)
    if not spans:
        return None
    masked = _ASIDE_RE.sub(lambda m: " " * len(m.group(0)), answer)
    kept = []
    for v, m in spans:
        if masked[m.start(): m.end()].strip() != m.group(0).strip():
            continue                                   # inside an aside
        if _REFERENCE_WORDS.search(answer[: m.start()]):
            continue
        if float(v).is_integer() and 1900 <= v <= 2100 and "," not in m.group(0) and "$" not in m.group(0) \
                and "%" not in m.group(0) and len(spans) > 1:
            continue                                   # a fiscal year
        kept.append((v, m))
    v, m = (kept or spans)[-1]
    return v, answer[m.start(): m.end() + 12]


def _close(a: float, b: float, rel: float) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)


_DECLINE_RE = re.compile(r"\b(?:fell|falls?|declined?|declines|decreased?|decreases|down|lower|dropped|drops?|"
                         r"shrank|reduction|loss)\b", re.I)


def _answer_matches(stated: float, value: float, written: str, rel: float, answer: str = "") -> bool:
    """`written` is the stated number as written plus what follows it (its % or scale word); a
    decline said in words ("fell by 2.8%") states the magnitude of a negative result."""
    candidates = [value]
    if value < 0 and stated > 0 and _DECLINE_RE.search(answer):
        candidates = [-value]
    low = written.lower()
    if "%" in written or "percent" in low:
        candidates.append(value * 100)
    if re.search(r"\b(thousand|million|billion|trillion|[kmb]n?)\b", low):
        candidates += [value * f for f in (1e-3, 1e-6, 1e-9, 1e3, 1e6, 1e9)]
    decimals = len(re.search(r"\d+(?:\.(\d+))?", written.replace(",", "")).group(1) or "")
    for c in candidates:
        if _close(stated, c, rel) or round(c, decimals) == round(stated, decimals):
            return True
    return False


@dataclass
class ArithmeticCheck:
    """status: verified | mismatch | operand_not_in_context | no_calculation | invalid | not_numeric."""

    status: str
    expression: str = ""
    value: float | None = None
    stated: float | None = None
    detail: str = ""

    @property
    def verified(self) -> bool:
        return self.status == "verified"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_CALC_RE = re.compile(r"(?im)^\s*\**calculation\**\s*:\s*`*(.+?)`*\s*$")
_ANSWER_RE = re.compile(r"(?im)^\s*\**(?:final\s+)?answer\**\s*:\s*(.+?)\s*$")


def parse_final_answer(text: str) -> str:
    found = _ANSWER_RE.findall(text)
    return found[-1].strip() if found else ""


def check_arithmetic(candidate: str, context: str, *, rel_tol: float = 5e-3,
                     constants: frozenset[float] = DEFAULT_CONSTANTS) -> ArithmeticCheck:
    """Execute the candidate's `Calculation:` and check it against the context and its `Answer:`.

    Every operand must be a figure written in the context (or a small constant such as 100 for
    percentages); the result must equal the stated answer within `rel_tol` or at its rounding
    (allowing % and million/billion scale words).
    """
    answer = parse_final_answer(candidate)
    found = stated_number(answer)
    if found is None:
        return ArithmeticCheck("not_numeric", detail="the answer states no number")
    stated, written = found
    calcs = _CALC_RE.findall(candidate)
    if not calcs:
        return ArithmeticCheck("no_calculation", stated=stated, detail="no 'Calculation:' line")
    expr = calcs[-1].split("=")[0].strip()
    try:
        value, operands = eval_arithmetic(expr)
    except ValueError as e:
        return ArithmeticCheck("invalid", expression=expr, stated=stated, detail=str(e))
    figures = numbers_in_text(context)
    missing = [o for o in operands if abs(o) not in constants and not any(_close(abs(o), abs(f), 1e-9) for f in figures)]
    if missing:
        return ArithmeticCheck("operand_not_in_context", expr, value, stated,
                               f"operands not found in the context: {', '.join(f'{m:g}' for m in missing)}")
    if not _answer_matches(stated, value, written, rel_tol, answer):
        return ArithmeticCheck("mismatch", expr, value, stated, f"the calculation gives {value:.6g}, the answer says {answer!r}")
    return ArithmeticCheck("verified", expr, value, stated)


# ---------------------------------------------------------------------------------------------
# GenSelect and answerability
# ---------------------------------------------------------------------------------------------

_SELECT_RE = re.compile(r"(?im)^\s*\**(?:best|selected|choice|answer)(?:\s+candidate)?\**\s*[:=]\s*\**\s*(?:candidate\s*)?#?\[?(\d+)")


def parse_selection(judge_output: str, eligible: Sequence[int]) -> int:
    """The candidate index the judge chose (`Best: N`, last occurrence); ValueError when it names
    none, or one outside `eligible` (e.g. a candidate whose arithmetic failed)."""
    found = _SELECT_RE.findall(judge_output)
    if not found:
        raise ValueError("the judge named no candidate ('Best: N')")
    idx = int(found[-1])
    if idx not in eligible:
        raise ValueError(f"the judge chose candidate {idx}, not one of {list(eligible)}")
    return idx


def parse_answerability(output: str) -> str:
    """'ANSWERABLE' or 'UNANSWERABLE' from a classifier's answer; ValueError when it gives neither or both."""
    up = output.upper()
    unans = len(re.findall(r"\bUNANSWERABLE\b", up))
    ans = len(re.findall(r"\bANSWERABLE\b", up))
    if unans and not ans:
        return "UNANSWERABLE"
    if ans and not unans:
        return "ANSWERABLE"
    raise ValueError("no single ANSWERABLE/UNANSWERABLE label")


# ---------------------------------------------------------------------------------------------
# Outliers and duplicates
# ---------------------------------------------------------------------------------------------

def percentile_bounds(values: Sequence[float], lo_pct: float, hi_pct: float) -> tuple[float, float]:
    """The [p_lo, p_hi] band of `values` (linear interpolation, numpy's default)."""
    if not values:
        raise ValueError("no values")
    arr = np.asarray(values, dtype=float)
    return float(np.percentile(arr, lo_pct)), float(np.percentile(arr, hi_pct))


def remove_outliers(items: Sequence[Any], feature: Callable[[Any], float], lo_pct: float = 1.0, hi_pct: float = 99.0,
                    min_items: int = 100) -> tuple[list[Any], list[Any], tuple[float, float] | None]:
    """(kept, removed, bounds): items whose feature lies outside the [lo, hi] percentile band are
    removed (§3.1.1 "percentile-based outlier removal"). Below `min_items` percentiles say nothing
    and all items are kept (bounds None)."""
    if len(items) < min_items or not items:
        return list(items), [], None
    values = [feature(x) for x in items]
    lo, hi = percentile_bounds(values, lo_pct, hi_pct)
    kept, removed = [], []
    for x, v in zip(items, values):
        (kept if lo <= v <= hi else removed).append(x)
    return kept, removed, (lo, hi)


def _shingles(text: str, n: int = 3) -> set[str]:
    words = normalize_question(text).split()
    if len(words) < n:
        return {" ".join(words)}
    return {" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


def dedup_questions(items: Sequence[Any], text_of: Callable[[Any], str], near_threshold: float = 0.8,
                    num_perm: int = 128, seed: int = 1) -> tuple[list[Any], list[tuple[Any, str]]]:
    """(kept, [(removed, reason)]): exact duplicates of the normalized text, then near duplicates
    (MinHash LSH over word 3-shingles, estimated Jaccard >= `near_threshold`, confirmed exactly).
    The first item of each group is kept, in input order."""
    from datasketch import MinHash, MinHashLSH

    kept: list[Any] = []
    removed: list[tuple[Any, str]] = []
    seen_exact: set[str] = set()
    lsh = MinHashLSH(threshold=near_threshold, num_perm=num_perm)
    shingles: dict[str, set[str]] = {}
    for i, item in enumerate(items):
        text = text_of(item)
        norm = normalize_question(text)
        if norm in seen_exact:
            removed.append((item, "exact duplicate"))
            continue
        sh = _shingles(text)
        mh = MinHash(num_perm=num_perm, seed=seed)
        for s in sh:
            mh.update(s.encode("utf-8"))
        near = [k for k in lsh.query(mh) if len(sh & shingles[k]) / max(len(sh | shingles[k]), 1) >= near_threshold]
        if near:
            removed.append((item, f"near duplicate of item {near[0]}"))
            continue
        key = str(i)
        lsh.insert(key, mh)
        shingles[key] = sh
        seen_exact.add(norm)
        kept.append(item)
    return kept, removed
