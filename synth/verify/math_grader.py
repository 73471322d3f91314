"""The math grader (LN §2.1 keeps solutions that reach the expected answer), at the level of
lm-eval's minerva_math, Qwen2.5-Math and PRM800K's graders.

- The committed final answer, after any thinking (`format.after_thinking`): the last `\\boxed{}`,
  else "answer is X" (markdown emphasis around the label allowed), "#### X", the last number
  (e-notation and Unicode minus signs read); hedged answers such as "Maybe 3 or 4." are rejected.
- Cleaned of presentation (math delimiters, `\\left`, spacing, `\\text{}`, `\\dfrac`, Unicode
  minus), units, money signs, degree signs and thousands separators, then parsed as a structure
  (tuples and intervals with their brackets, sets, unions, "3 or 4", matrices, `x = 5`, mixed
  numbers `2\\frac{1}{2}` and `3\\frac12`) and compared exactly (rationals) or numerically at fixed
  test points (expressions), by a parser and evaluator of our own that cannot hang (no sympy, no
  eval; exact powers and factorials are bounded).
- Percent convention: an answer written with a percent sign, `p%`, equals both p and p/100 (the
  reference may carry the sign instead); without a sign, 0.5 and 50 differ. Units are dropped, not
  converted (`5 cm` equals 5).
- Majority vote (LN §2.1, §2.3 fallback when no reference exists): the most common answer over
  the samples, grouped by equivalence, ties broken by first appearance in sample order.
"""

from __future__ import annotations

import cmath
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Sequence

from synth.verify.format import after_thinking


# ---- final answers ------------------------------------------------------------------------------

def boxed_spans(text: str) -> list[tuple[int, str]]:
    """(start, content) of every \\boxed{...} / \\fbox{...} (braces balanced) and `\\boxed 5`,
    in one pass over the text (no box rescans the rest: a reply of 10^5 unclosed boxes is linear)."""
    closes: dict[int, int] = {}
    stack: list[int] = []
    for i, c in enumerate(text):
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            closes[stack.pop()] = i
    out: list[tuple[int, str]] = []
    for m in re.finditer(r"\\(?:boxed|fbox)\s*(\{)?", text):
        if m.group(1) is None:            # `\boxed 5`: one token
            t = re.match(r"\s*([^\s$]+)", text[m.end(): m.end() + 200])
            if t:
                out.append((m.start(), t.group(1)))
        elif m.start(1) in closes:
            out.append((m.start(), text[m.end(): closes[m.start(1)]].strip()))
    return out


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), braces balanced."""
    spans = boxed_spans(text)
    return spans[-1][1] if spans else None


_NUMBER = r"-?\$?\d[\d,]*(?:\.\d+)?(?:[eE][+-]?\d+)?(?:/\d+)?%?"
# "answer is X", "Answer: X", "**Answer:** X" (markdown emphasis around the label or the answer)
_ANSWER_IS = re.compile(r"(?:final answer|answer)\s*(?:is|:|=)\s*:?\s*(?:\*\*|__|\*|_)?\s*\$?([^\n$]+?)\$?\s*"
                        r"(?:\.\s|\.$|$|\n)", re.I)
# Minus signs other than U+002D that prose uses before a number (U+2212 minus, small and fullwidth hyphen-minus).
_MINUS_SIGNS = str.maketrans({"\u2212": "-", "\ufe63": "-", "\uff0d": "-"})
# Words that hedge a final answer (minerva and PRM800K grade a committed answer, not a guess).
_HEDGE = re.compile(r"\b(?:maybe|perhaps|possibly|probably|(?:might|could|may)\s+be|not\s+sure|unsure|i\s+guess)\b"
                    r"|\beither\b.*\bor\b", re.I)


def _final_text(text: str) -> str:
    return after_thinking(text).translate(_MINUS_SIGNS)


def _unemphasize(answer: str) -> str:
    """An answer without the markdown emphasis around it (`**42**`, `*x = 3*`)."""
    return answer.strip().strip("*_").strip()


def extract_final_answer(text: str) -> str | None:
    """The final answer a response commits to, or None when it commits to none (lenient: the
    last box, else "answer is X", "#### X", else the last number), outside any think block."""
    text = _final_text(text)
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    m = re.search(r"####\s*([^\n]+)", text)
    if m:
        return _unemphasize(m.group(1))
    found = _ANSWER_IS.findall(text)
    if found:
        return _unemphasize(found[-1])
    nums = re.findall(_NUMBER, text)
    return nums[-1] if nums else None


def _sentence_at(text: str, i: int) -> str:
    """The sentence of `text` around position `i` (split at line breaks and at ". ", "! ", "? ")."""
    start = max(text.rfind(p, 0, i) + len(p) if text.rfind(p, 0, i) != -1 else 0 for p in ("\n", ". ", "! ", "? "))
    ends = [j for j in (text.find("\n", i), text.find(". ", i), text.find("? ", i)) if j != -1]
    return text[start: min(ends) if ends else len(text)]


_MAX_FINAL_BOXES = 8


def committed_answer(text: str) -> tuple[str | None, str]:
    """(answer, problem): what the response commits to, strictly. Several different boxed answers
    in the final paragraph come back joined by " or " (a set when the reference is one, else a
    rejection); a hedged answer ("Maybe 3 or 4.", "\\boxed{4?}") is None with the reason. Only the
    text after the thinking counts (`after_thinking`)."""
    text = _final_text(text)
    spans = boxed_spans(text)
    if spans:
        last_start = spans[-1][0]
        para = text.rfind("\n\n", 0, last_start)
        finals: list[str] = []
        for start, content in [sp for sp in spans if sp[0] > para][-_MAX_FINAL_BOXES:]:
            if not any(math_equivalent(content, f) for f in finals):
                finals.append(content)
        answer, where = " or ".join(finals), last_start
    elif (m := list(re.finditer(r"####\s*([^\n]+)", text))):
        answer, where = _unemphasize(m[-1].group(1)), m[-1].start()
    elif (m := list(_ANSWER_IS.finditer(text))):
        answer, where = _unemphasize(m[-1].group(1)), m[-1].start()
    else:
        nums = list(re.finditer(_NUMBER, text))
        if not nums:
            return None, "no final answer found"
        where = nums[-1].start()
        sentence = _sentence_at(text, where)
        answer = nums[-1].group(0)
        if len(re.findall(_NUMBER, sentence)) > 1 and re.search(r"\bor\b", sentence):
            return None, f"several answers in {sentence.strip()[:80]!r}"
    if not answer.strip():
        return None, "empty final answer"
    sentence = _sentence_at(text, where)
    if _HEDGE.search(sentence) or "?" in answer or re.search(r"\}\s*\$?\s*\?", sentence):
        return None, f"hedged answer {sentence.strip()[:80]!r}"
    return answer, ""


# ---- normalisation (minerva's normalize_final_answer, Hendrycks' strip_string, Qwen2.5-Math) ------

_UNICODE = {"−": "-", "–": "-", "—": "-", "×": "\\times ", "·": "\\cdot ", "⋅": "\\cdot ", "÷": "\\div ",
            "π": "\\pi ", "∞": "\\infty ", "√": "\\sqrt", "°": "^\\circ", "≤": "\\le ", "≥": "\\ge ", "∪": "\\cup ",
            "\u2009": " ", "\u202f": " ", "\xa0": " ", "’": "'"}
_SPACING = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)[lr]?(?![a-zA-Z])|\\displaystyle|\\!|\\limits")
_THIN = re.compile(r"(?<!\\)\\[,;:> ]|\\q?quad(?![a-zA-Z])|~")
_WRAPPERS = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|rm|operatorname|boxed)\s*\{([^{}]*)\}")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\degree|\s*\bdegrees?\b", re.I)
_MONEY = re.compile(r"\\\$|\$|\\euro|€|£|\bUSD\b|\bdollars?\b|\bcents?\b", re.I)
_PERCENT = re.compile(r"\s*(?:\\%|%|\bpercent\b)\s*$", re.I)
# Trailing units: words (or one SI letter) after the value, with powers and per-units (minerva's list, generalised).
_UNITS = re.compile(r"(?<=[\d}).])\s*(?:[a-zA-Z]{2,}|(?<=\s)[mgsLhKNJWVA])(?![a-zA-Z])(?:\s+[a-zA-Z]+)*"
                    r"(?:\s*/\s*[a-zA-Z]+)*(?:\^\{?\d\}?)?\s*$")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:(?:,|\{,\}|\\,| )\d{3})+(?:\.\d+)?")
_INFINITY = re.compile(r"^(?:\+|-)?\s*(?:\\infty|infinity|inf|oo)$", re.I)


def _unwrap(s: str) -> str:
    for _ in range(4):
        t = _WRAPPERS.sub(r"\1", s)
        if t == s:
            break
        s = t
    return s


def clean_latex(s: str) -> str:
    """Presentation stripped, structure kept: math delimiters, \\left/\\right, spacing commands,
    \\text{} and \\mathrm{} wrappers, \\dfrac/\\tfrac, Unicode minus and symbols, a final period."""
    s = s.strip()
    for a, b in _UNICODE.items():
        s = s.replace(a, b)
    for lead, trail in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(lead) and s.endswith(trail) and len(s) > len(lead) + len(trail):
            s = s[len(lead): -len(trail)].strip()
    s = _SPACING.sub("", s)
    s = _THIN.sub(" ", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\cfrac", "\\frac")
    s = s.replace("\\ldots", "").replace("\\dots", "").replace("\\cdots", "")
    s = _unwrap(s)
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"(?<!\\)[.,;]+$", "", s).strip()
    return s


def normalize_answer(s: str) -> str:
    """A string key for answers that are not numbers or expressions: `clean_latex`, no degree or
    money signs, no spaces or thousands separators, lower case."""
    s = _DEGREES.sub("", clean_latex(s))
    s = _MONEY.sub("", s)
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)
    return re.sub(r"\s+", "", s).lower()


# ---- a small, bounded expression language ----------------------------------------------------------
# Answers are parsed by our own recursive-descent parser and evaluated exactly (Fraction) where they
# are rational, else as complex floats: no sympy, no eval, so `9^{9^{9}}` or `1000000!` cannot hang
# (exact powers above _MAX_EXACT_BITS and factorials above 1000 are "too large" and never equal).

MAX_EXPR_CHARS = 200
MAX_ANSWER_CHARS = 2000
_MAX_EXACT_BITS = 65_536
_FUNCS = {"sin": cmath.sin, "cos": cmath.cos, "tan": cmath.tan, "cot": lambda z: 1 / cmath.tan(z),
          "sec": lambda z: 1 / cmath.cos(z), "csc": lambda z: 1 / cmath.sin(z), "arcsin": cmath.asin,
          "arccos": cmath.acos, "arctan": cmath.atan, "sinh": cmath.sinh, "cosh": cmath.cosh, "tanh": cmath.tanh,
          "ln": cmath.log, "log": cmath.log, "exp": cmath.exp}
_GREEK = {"alpha", "beta", "gamma", "delta", "theta", "lambda", "mu", "phi", "psi", "omega", "sigma", "tau", "rho"}
_TOKEN = re.compile(r"\s*(?:((?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)|\\([a-zA-Z]+)|([a-zA-Z]+)|(\S))")

Value = Fraction | complex


class _TooLarge(ArithmeticError):
    pass


class _Undefined(ArithmeticError):
    pass


class _Parser:
    """expr := term (+|- term)*; term := unary ((*|/|implicit) unary)*; unary := -unary | power;
    power := postfix (^ unary)?; postfix := atom !*; atom := number | name | group | function."""

    def __init__(self, text: str):
        self.toks: list[tuple[str, str]] = []
        for m in _TOKEN.finditer(text):
            num, cmd, word, ch = m.groups()
            if num:
                self.toks.append(("num", num))
            elif cmd:
                self.toks.append(("cmd", cmd))
            elif word:
                lw = word.lower()
                if lw in _FUNCS or lw in ("sqrt", "pi"):
                    self.toks.append(("cmd", lw))
                elif len(word) <= 2:          # "xy" is x*y; longer words are text, not algebra
                    self.toks += [("var", c) for c in word]
                else:
                    raise ValueError(f"word {word!r}")
            elif ch:
                self.toks.append(("op", ch))
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, kind: str | None = None, text: str | None = None) -> tuple[str, str]:
        t = self.peek()
        if t is None or (kind and t[0] != kind) or (text and t[1] != text):
            raise ValueError(f"expected {text or kind}, found {t}")
        self.i += 1
        return t

    def at(self, kind: str, text: str | None = None) -> bool:
        t = self.peek()
        return t is not None and t[0] == kind and (text is None or t[1] == text)

    def parse(self) -> tuple:
        node = self.expr()
        if self.peek() is not None:
            raise ValueError(f"unexpected {self.peek()}")
        return node

    def expr(self) -> tuple:
        node = self.term()
        while self.at("op", "+") or self.at("op", "-"):
            op = self.take()[1]
            node = (op, node, self.term())
        return node

    def term(self) -> tuple:
        node = self.unary()
        while True:
            if self.at("op", "*") or self.at("op", "/") or self.at("cmd", "cdot") or self.at("cmd", "times") \
                    or self.at("cmd", "div"):
                op = self.take()[1]
                node = ("/" if op in ("/", "div") else "*", node, self.unary())
            elif self.starts_atom():
                node = ("*", node, self.power())
            else:
                return node

    def starts_atom(self) -> bool:
        t = self.peek()
        return t is not None and (t[0] in ("num", "var") or (t[0] == "op" and t[1] in "({[")
                                  or (t[0] == "cmd" and t[1] not in ("cdot", "times", "div", "le", "ge", "cup")))

    def unary(self) -> tuple:
        if self.at("op", "-"):
            self.take()
            return ("neg", self.unary())
        if self.at("op", "+"):
            self.take()
            return self.unary()
        return self.power()

    def power(self) -> tuple:
        base = self.postfix()
        if self.at("op", "^"):
            self.take()
            return ("^", base, self.unary())
        return base

    def postfix(self) -> tuple:
        node = self.atom()
        while self.at("op", "!"):
            self.take()
            node = ("!", node)
        return node

    def arg(self) -> tuple:
        """A LaTeX macro argument: a {group}, or one token (`\\frac12` is 1/2)."""
        if self.at("op", "{"):
            self.take()
            node = self.expr()
            self.take("op", "}")
            return node
        t = self.peek()
        if t is not None and t[0] == "num" and len(t[1]) > 1 and "." not in t[1]:
            self.toks[self.i] = ("num", t[1][1:])
            return ("n", Fraction(t[1][0]))
        return self.atom()

    def atom(self) -> tuple:
        t = self.take()
        kind, text = t
        if kind == "num":
            return ("n", Fraction(text))
        if kind == "var":
            node: tuple = ("c", "i") if text == "i" else ("c", "e") if text == "e" else ("v", text)
            if self.at("op", "_"):
                self.take()
                sub = self.take()[1] if not self.at("op", "{") else self.group_text()
                node = ("v", f"{text}_{sub}")
            return node
        if kind == "op" and text in "({[":
            close = {"(": ")", "{": "}", "[": "]"}[text]
            node = self.expr()
            self.take("op", close)
            return node
        if kind == "op" and text == "|":
            node = self.expr()
            self.take("op", "|")
            return ("abs", node)
        if kind == "cmd":
            if text == "frac":
                return ("/", self.arg(), self.arg())
            if text == "sqrt":
                if self.at("op", "["):
                    self.take()
                    n = self.expr()
                    self.take("op", "]")
                    return ("^", self.arg(), ("/", ("n", Fraction(1)), n))
                return ("^", self.arg(), ("n", Fraction(1, 2)))
            if text == "pi":
                return ("c", "pi")
            if text in _GREEK:
                return ("v", text)
            if text in _FUNCS:
                power = None
                if self.at("op", "^"):            # \sin^2 x = (\sin x)^2
                    self.take()
                    power = self.arg()
                if text == "log" and self.at("op", "_"):
                    self.take()
                    base = self.arg()
                    node = ("/", ("f", "ln", self.fn_arg()), ("f", "ln", base))
                else:
                    node = ("f", text, self.fn_arg())
                return ("^", node, power) if power is not None else node
        raise ValueError(f"unexpected {t}")

    def fn_arg(self) -> tuple:
        if self.at("op", "(") or self.at("op", "{"):
            return self.atom()
        return self.power()

    def group_text(self) -> str:
        self.take("op", "{")
        parts = []
        while not self.at("op", "}"):
            parts.append(self.take()[1])
        self.take("op", "}")
        return "".join(parts)


def parse_expression(text: str) -> tuple | None:
    """The expression tree of a LaTeX/plain math answer, or None when it is not one."""
    if not text or len(text) > MAX_EXPR_CHARS or re.search(r"\.\s*[a-zA-Z]", text):
        return None
    try:
        return _Parser(text).parse()
    except (ValueError, IndexError, ZeroDivisionError, RecursionError):
        return None


def _variables(node: tuple) -> set[str]:
    """The free variables of an expression tree (its depth is bounded by MAX_EXPR_CHARS)."""
    if node[0] == "v":
        return {node[1]}
    return set().union(*(_variables(c) for c in node[1:] if isinstance(c, tuple)))


def _int_root(n: int, q: int) -> int | None:
    """The exact integer q-th root of n >= 0, or None (Newton's method on integers: no floats)."""
    if n < 2:
        return n
    r = math.isqrt(n) if q == 2 else 1 << -(-n.bit_length() // q)      # an upper bound for Newton
    if q != 2:
        for _ in range(200):
            nxt = ((q - 1) * r + n // r ** (q - 1)) // q
            if nxt >= r:
                break
            r = nxt
        while r ** q > n:
            r -= 1
        while (r + 1) ** q <= n:
            r += 1
    return r if r ** q == n else None


def _exact_root(x: Fraction, q: int) -> Fraction | None:
    if x < 0 or q > 64 or max(x.numerator, x.denominator).bit_length() > _MAX_EXACT_BITS:
        return None
    num, den = _int_root(x.numerator, q), _int_root(x.denominator, q)
    return Fraction(num, den) if num is not None and den is not None else None


def _pow(a: Value, b: Value) -> Value:
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        if b.denominator == 1:
            bits = math.log2(max(abs(a.numerator), a.denominator, 1))
            if abs(b.numerator) * bits > _MAX_EXACT_BITS:
                if abs(a) in (0, 1):
                    return a ** int(b) if a != 0 or b > 0 else _undefined()
                raise _TooLarge("power too large to compute exactly")
            if a == 0 and b < 0:
                raise _Undefined("0 to a negative power")
            return a ** int(b)
        root = _exact_root(a, b.denominator) if abs(b.numerator) <= 64 else None
        if root is not None:
            return _pow(root, Fraction(b.numerator))
    try:
        za, zb = complex(a), complex(b)
        if abs(zb) > 1e6 and abs(za) > 1:
            raise _TooLarge("power too large")
        return za ** zb
    except (OverflowError, ZeroDivisionError) as e:
        raise _TooLarge(str(e)) from None


def _undefined() -> Value:
    raise _Undefined("undefined")


def _evaluate(node: tuple, env: dict[str, complex]) -> Value:
    op = node[0]
    if op == "n":
        return node[1]
    if op == "c":
        return {"pi": complex(math.pi), "e": complex(math.e), "i": 1j}[node[1]]
    if op == "v":
        return env[node[1]]
    if op == "neg":
        return -_evaluate(node[1], env)
    if op == "abs":
        v = _evaluate(node[1], env)
        return abs(v) if isinstance(v, Fraction) else complex(abs(v))
    if op == "!":
        v = _evaluate(node[1], env)
        if isinstance(v, Fraction) and v.denominator == 1 and v >= 0:
            if v > 1000:
                raise _TooLarge("factorial too large")
            return Fraction(math.factorial(int(v)))
        z = complex(v)
        if abs(z.imag) > 1e-12 or not -1 < z.real < 170:
            raise _Undefined("factorial outside the reals it is defined on here")
        return complex(math.gamma(z.real + 1))
    if op == "f":
        z = complex(_evaluate(node[2], env))
        if node[1] == "exp" and z.real > 700:
            raise _TooLarge("exp too large")
        try:
            return _FUNCS[node[1]](z)
        except (ValueError, ZeroDivisionError, OverflowError) as e:
            raise _Undefined(str(e)) from None
    a, b = _evaluate(node[1], env), _evaluate(node[2], env)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0:
            raise _Undefined("division by zero")
        return a / b
    if op == "^":
        return _pow(a, b)
    raise ValueError(f"unknown node {op!r}")


def _value(node: tuple, env: dict[str, complex]) -> Value:
    """`_evaluate`, with every arithmetic failure mapped onto too-large or undefined."""
    try:
        return _evaluate(node, env)
    except (OverflowError, RecursionError, MemoryError) as e:
        raise _TooLarge(type(e).__name__) from None
    except (ZeroDivisionError, ValueError, TypeError) as e:
        raise _Undefined(str(e)) from None


def _close(a: Value, b: Value, rel: float = 1e-9) -> bool:
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        return a == b
    try:
        za, zb = complex(a), complex(b)
    except OverflowError:
        return False
    if not (cmath.isfinite(za) and cmath.isfinite(zb)):
        return False
    return abs(za - zb) <= rel * max(1.0, abs(za), abs(zb))


# Points at which two expressions in free variables are compared (fixed: verdicts are deterministic).
_POINTS = (0.5377, -1.3077, 2.1765, 0.8622, -0.4336, 1.7119, 3.0349, -2.2588)


def _environments(names: list[str], n: int = 6) -> list[dict[str, complex]]:
    return [{v: complex(_POINTS[(k * 3 + j * 5) % len(_POINTS)] + 0.01 * j) for j, v in enumerate(names)}
            for k in range(n)]


def expressions_equal(a: tuple, b: tuple) -> bool:
    """Same value (exactly, for rational numbers), or the same function of their variables at
    every test point where both are defined (at least 3, no point where only one is)."""
    names = sorted(_variables(a) | _variables(b))
    envs = _environments(names) if names else [{}]
    agree = 0
    for env in envs:
        try:
            va = _value(a, env)
        except _Undefined:
            va = None
        except _TooLarge:
            return False
        try:
            vb = _value(b, env)
        except _Undefined:
            vb = None
        except _TooLarge:
            return False
        if va is None and vb is None:
            continue
        if va is None or vb is None or not _close(va, vb):
            return False
        agree += 1
    return agree >= (3 if names else 1)


def _fingerprint(node: tuple) -> str | None:
    names = sorted(_variables(node))
    out = []
    for env in _environments(names) if names else [{}]:
        try:
            v = _value(node, env)
            if not isinstance(v, Fraction):
                v = complex(v)
        except (_Undefined, _TooLarge, OverflowError):
            out.append("u")
            continue
        if isinstance(v, Fraction):
            out.append(str(v) if v.numerator.bit_length() < 256 else f"{v.numerator.bit_length()}b{hash(v)}")
        else:
            if abs(v.imag) < 1e-12 * max(1.0, abs(v.real)) and abs(v.real - round(v.real)) < 1e-9:
                out.append(str(round(v.real)))
            else:
                out.append(f"{v.real:.9g},{v.imag:.9g}" if abs(v.imag) > 1e-12 else f"{v.real:.9g}")
    return ",".join(names) + ":" + ";".join(out)


# ---- answers as structures ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Scalar:
    """One value: an expression tree (with `percent` if written with %) or, failing that, text."""

    text: str
    expr: tuple | None
    percent: bool = False


@dataclass(frozen=True)
class Many:
    """Several values. kind: tuple (ordered; `brackets` such as "()" or "[)" for intervals),
    set (unordered: \\{...\\}, bare comma lists), union (of intervals), alt ("3 or 4"), matrix (rows)."""

    kind: str
    items: tuple
    brackets: str = ""


Answer = Scalar | Many


def _split_top(s: str, seps: tuple[str, ...]) -> list[str]:
    """`s` split at separators outside brackets and braces."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            for sep in seps:
                if s.startswith(sep, i):
                    parts.append(s[start:i])
                    start = i + len(sep)
                    i = start - 1
                    break
        i += 1
    parts.append(s[start:])
    return [p.strip() for p in parts]


def _encloses(s: str) -> bool:
    """The first bracket of `s` closes at its last character."""
    depth = 0
    for i, c in enumerate(s):
        depth += 1 if c in "([{" else -1 if c in ")]}" else 0
        if depth == 0 and i < len(s) - 1:
            return False
    return depth == 0


# A mixed number: `2\frac{1}{2}`, `3\frac12` (TeX's one-token arguments), `2 1/2`.
_MIXED = re.compile(r"(-?)(\d+)\s*(?:\\frac\s*(?:\{(\d+)\}|(\d))\s*(?:\{(\d+)\}|(\d))|\s(\d+)\s*/\s*(\d+))")
_EQUATION = re.compile(r"^\\?([a-zA-Z]+)(?:_\{?\w+\}?)?(?:\([a-z]\))?\s*=\s*([^=]+)$")


def _scalar(s: str) -> Scalar:
    s = s.strip()
    s = re.sub(r"^\\(?:approx|sim)\s*", "", s)
    percent = bool(_PERCENT.search(s))
    t = _PERCENT.sub("", s)
    t = _DEGREES.sub("", t)
    t = _MONEY.sub("", t).strip()
    t = _UNITS.sub("", t).strip() if re.search(r"\d", t) else t
    if _INFINITY.match(t):
        return Scalar(("-" if t.startswith("-") else "") + "\\infty", None, percent)
    if _THOUSANDS.fullmatch(t):
        t = re.sub(r"\{,\}|,|\\,| ", "", t)
    mixed = _MIXED.fullmatch(t)
    if mixed:
        sign, whole = -1 if mixed.group(1) else 1, int(mixed.group(2))
        num, den = (int(x) for x in [g for g in mixed.groups()[2:] if g is not None])
        if den != 0:
            return Scalar(t, ("n", sign * (whole + Fraction(num, den))), percent)
    return Scalar(t, parse_expression(t), percent)


def parse_answer(s: str) -> Answer:
    """A final answer as a structure (see `Scalar`, `Many`), after `clean_latex`."""
    s = clean_latex(s)
    alts = [a for a in re.split(r"\s+(?:or|\\text\{\s*or\s*\}|\\lor|and)\s+|\s*\\(?:lor|vee)\s*", s) if a]
    if len(alts) > 1:
        return Many("alt", tuple(parse_answer(a) for a in alts))
    m = re.fullmatch(r"\\begin\{([pbvBV]?matrix|array)\}(?:\{[^}]*\})?(.*?)\\end\{\1\}", s, re.S)
    if m:
        rows = [r for r in re.split(r"\\\\", m.group(2)) if r.strip()]
        return Many("matrix", tuple(tuple(_scalar(c) for c in r.split("&")) for r in rows))
    if "\\cup" in s:
        parts = _split_top(s, ("\\cup",))
        if len(parts) > 1:
            return Many("union", tuple(parse_answer(p) for p in parts))
    if s.startswith("\\{") and s.endswith("\\}"):
        inner = s[2:-2].strip()
        return Many("set", tuple(parse_answer(p) for p in _split_top(inner, (",", ";")) if p))
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and _encloses(s):
        parts = _split_top(s[1:-1], (",",))
        if len(parts) > 1:
            return Many("tuple", tuple(parse_answer(p) for p in parts), s[0] + s[-1])
    if "," in s and not _THOUSANDS.fullmatch(_MONEY.sub("", s).strip()):
        parts = [p for p in _split_top(s, (",", ";")) if p]
        if len(parts) > 1:
            eqs = [_EQUATION.match(p) for p in parts]
            if all(eqs) and len({e.group(1) for e in eqs}) == len(eqs):       # x = 1, y = 2: a point
                return Many("tuple", tuple(parse_answer(e.group(2)) for e in sorted(eqs, key=lambda e: e.group(1))))
            return Many("set", tuple(parse_answer(p) for p in parts))
    eq = _EQUATION.match(s)
    if eq:
        return parse_answer(eq.group(2))
    return _scalar(s)


def _scalars_equal(a: Scalar, b: Scalar) -> bool:
    if a.expr is not None and b.expr is not None:
        if expressions_equal(a.expr, b.expr):
            return True
        # the percent convention: "p%" equals p and p/100 (either side may carry the sign)
        for x, y in ((a, b), (b, a)):
            if x.percent and expressions_equal(("/", x.expr, ("n", Fraction(100))), y.expr):
                return True
        return False
    return normalize_answer(a.text) == normalize_answer(b.text) and bool(normalize_answer(a.text))


def _unordered_equal(xs: Sequence[Answer], ys: Sequence[Answer], unordered: bool) -> bool:
    if len(xs) != len(ys):
        return False
    left = list(ys)
    for x in xs:
        hit = next((k for k, y in enumerate(left) if answers_equal(x, y, unordered)), None)
        if hit is None:
            return False
        left.pop(hit)
    return True


def answers_equal(a: Answer, b: Answer, unordered: bool = False) -> bool:
    """Structural equality: tuples in order (with the same brackets, so `[1,2)` != `(1,2]`),
    sets, unions and alternatives in any order, matrices cell by cell; `unordered` also lets
    tuples match in any order (the question asks for all solutions)."""
    if isinstance(a, Scalar) and isinstance(b, Scalar):
        return _scalars_equal(a, b)
    if isinstance(a, Scalar) or isinstance(b, Scalar):
        many, one = (a, b) if isinstance(a, Many) else (b, a)
        return many.kind in ("set", "alt") and len(many.items) == 1 and answers_equal(many.items[0], one, unordered)
    if a.kind == "matrix" or b.kind == "matrix":
        if a.kind == b.kind == "matrix":
            return len(a.items) == len(b.items) and all(
                len(ra) == len(rb) and all(answers_equal(x, y) for x, y in zip(ra, rb)) for ra, rb in zip(a.items, b.items))
        m, t = (a, b) if a.kind == "matrix" else (b, a)          # a row or column vector against a tuple
        cells = tuple(c for row in m.items for c in row)
        return t.kind == "tuple" and (len(m.items) == 1 or all(len(r) == 1 for r in m.items)) and \
            len(cells) == len(t.items) and all(answers_equal(x, y) for x, y in zip(cells, t.items))
    sets = ("set", "alt")
    if a.kind in sets and b.kind in sets:
        return _unordered_equal(a.items, b.items, unordered)
    if a.kind == b.kind == "union":
        return _unordered_equal(a.items, b.items, unordered)
    if a.kind == b.kind == "tuple":
        if a.brackets and b.brackets and a.brackets != b.brackets:
            return False
        if unordered and (a.brackets or "()") in ("()", "[]"):
            return _unordered_equal(a.items, b.items, unordered)
        return len(a.items) == len(b.items) and all(answers_equal(x, y, unordered) for x, y in zip(a.items, b.items))
    if unordered and {a.kind, b.kind} == {"tuple", "set"}:
        return _unordered_equal(a.items, b.items, unordered)
    return False


def math_equivalent(pred: str | None, ref: str | None, *, unordered: bool = False) -> bool:
    """True when `pred` and `ref` denote the same answer (see `answers_equal`); never hangs."""
    if pred is None or ref is None:
        return False
    if not clean_latex(pred) or not clean_latex(ref):
        return False
    if normalize_answer(pred) == normalize_answer(ref):
        return True
    if max(len(pred), len(ref)) > MAX_ANSWER_CHARS:
        return False           # no final answer is this long; only the exact text could match
    try:
        return answers_equal(parse_answer(pred), parse_answer(ref), unordered)
    except RecursionError:
        return False


def _key(a: Answer) -> str:
    if isinstance(a, Scalar):
        if a.expr is not None:
            fp = _fingerprint(("/", a.expr, ("n", Fraction(100))) if a.percent else a.expr)
            if fp is not None and "u" not in fp.split(":", 1)[1].split(";"):
                return "num:" + fp
        return "str:" + normalize_answer(a.text)
    items = [_key(x) if not isinstance(x, tuple) else "(" + ",".join(_key(c) for c in x) + ")" for x in a.items]
    if a.kind in ("set", "alt", "union"):
        items = sorted(items)
    return f"{a.kind}{a.brackets}[" + "|".join(items) + "]"


def canonical_math_key(ans: str | None) -> str | None:
    """A grouping key under which equivalent answers collide (for majority vote): exact values,
    or an expression's values at the fixed test points, or the normalised text."""
    if ans is None or not normalize_answer(ans):
        return None
    if len(ans) > MAX_ANSWER_CHARS:
        return "str:" + normalize_answer(ans)
    try:
        return _key(parse_answer(ans))
    except RecursionError:
        return "str:" + normalize_answer(ans)


_ALL_SOLUTIONS = re.compile(r"\b(?:find|enter|list|give)\s+all\b|\ball\s+(?:the\s+)?(?:real\s+|possible\s+|integer\s+|complex\s+)?"
                            r"(?:solutions|roots|values|zeros|zeroes|numbers)\b|separated\s+by\s+commas", re.I)


def asks_for_all_solutions(question: str | None) -> bool:
    """The question wants every solution, in any order ("Find all x ...", "separated by commas")."""
    return bool(question and _ALL_SOLUTIONS.search(question))


# ---- majority vote ------------------------------------------------------------------------------

def majority_answer(answers: list[str | None], key: Callable[[str | None], str | None] = canonical_math_key
                    ) -> tuple[str | None, int]:
    """(answer, votes): the most common answer by `key`, ties broken by first appearance.
    Returns the first raw answer of the winning group, so the stored reference is a real sample."""
    counts: dict[str, int] = {}
    first: dict[str, tuple[int, str]] = {}
    for i, ans in enumerate(answers):
        k = key(ans)
        if k is None:
            continue
        counts[k] = counts.get(k, 0) + 1
        first.setdefault(k, (i, ans))  # type: ignore[arg-type]
    if not counts:
        return None, 0
    best = max(counts, key=lambda k: (counts[k], -first[k][0]))
    return first[best][1], counts[best]
