"""Validators for synthetic code-concept problems and solutions (Nemotron 3 Super §2.3.2-2.3.3;
spec §1.3-1.4).

A problem teacher writes a Python function signature whose docstring states the problem (and a
short title, and optionally `assert` tests); a solution teacher writes the function. The paper's
cleaning, as pure functions:

- `parse_problem`: the problem is one descriptively named function whose body is its docstring;
  its text up to the end of the docstring is kept byte for byte (the solver often rewrites it).
- `splice_solution`: only the *body* the solver wrote (plus its helpers and allowed imports) is
  appended to the original problem text; the problem text is a prefix of the final code.
- `check_solution`: the final code parses (`ast`), the solution imports nothing beyond the
  problem's imports (dynamic `__import__`/`importlib` included), it has at most 60 lines, and,
  where the problem carries tests, they pass. A test is judged here, never by the solution's
  objects: each call of the function runs in `purokit.sandbox` (time and memory limits, no network,
  a fresh temporary directory), its result crosses the boundary as plain data (exact builtin types;
  an object with its own `__eq__`, an `int` subclass or a `__class__` spoof is refused by type), and
  the rest of the assert is evaluated outside on those values (`ValueTest`).
- `normalize_title` / `dedup_by_title`: dedup by the generated title (§2.3.3).
- `normalized_body` / `exact_match_benchmark`: exact-match decontamination against benchmark
  solutions such as HumanEval's (§2.3.3 step 1), after stripping docstrings, comments and layout.
"""

from __future__ import annotations

import ast
import builtins
import math
import re
import textwrap
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from purokit.sandbox import PlainValue, SandboxLimits, run_python_values

MAX_SOLUTION_LINES = 60          # Nemotron 3 §2.3.2: "each <= 60 lines"
_CODE_BLOCK_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_TITLE_RE = re.compile(r"^\s*(?:#+\s*)?\**title\**\s*[:\-]\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_NON_DESCRIPTIVE = {"f", "g", "fn", "func", "function", "solve", "solution", "main", "foo", "bar", "test", "run", "answer"}


def extract_code_blocks(text: str, languages: tuple[str, ...] = ("python", "py", "")) -> list[str]:
    """Fenced code blocks of the given languages, in order (an unclosed last block counts)."""
    return [m.group(2) for m in _CODE_BLOCK_RE.finditer(text) if m.group(1).lower() in languages]


def import_roots(tree: ast.AST) -> set[str]:
    """Top-level package names imported anywhere in `tree` (`import a.b` and `from a.b import c` -> a)."""
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def dynamic_imports(tree: ast.AST) -> list[str]:
    """Calls that import by name at run time: `__import__(...)`, `importlib.import_module(...)`."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "__import__":
                found.append("__import__")
            elif isinstance(f, ast.Attribute) and f.attr == "import_module":
                found.append("importlib.import_module")
    return found


def _docstring_node(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.Expr | None:
    first = fn.body[0] if fn.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first
    return None


def _is_stub(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                                          and stmt.value.value is Ellipsis)


def _line_offsets(text: str) -> list[int]:
    offsets = [0]
    for line in text.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    return offsets


# ---------------------------------------------------------------------------------------------
# Problems
# ---------------------------------------------------------------------------------------------

@dataclass
class Problem:
    """A parsed problem. `problem_text` is the teacher's text up to the end of the docstring."""

    title: str
    func_name: str
    problem_text: str
    imports: list[str]
    tests: str = ""
    n_tests: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_descriptive_name(name: str) -> bool:
    """The paper asks for a *descriptive* function name: not `f`/`solve`, at least two words or 8 letters."""
    if name.lower() in _NON_DESCRIPTIVE:
        return False
    parts = [p for p in re.split(r"_|(?<=[a-z])(?=[A-Z])", name) if p]
    return len(parts) >= 2 or len(name) >= 8


def parse_tests(text: str, func_name: str) -> tuple[str, int]:
    """(tests source, number of asserts) from a tests block: only top-level `assert`s that call
    `func_name`, each one that `value_tests` can judge on plain data."""
    tree = ast.parse(text)
    kept: list[str] = []
    for node in tree.body:
        if not isinstance(node, ast.Assert):
            raise ValueError(f"tests may only contain assert statements, found {type(node).__name__} at line {node.lineno}")
        if not any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == func_name for n in ast.walk(node)):
            raise ValueError(f"test at line {node.lineno} does not call {func_name}()")
        kept.append(ast.get_source_segment(text, node) or ast.unparse(node))
    source = "\n".join(kept) + ("\n" if kept else "")
    value_tests(source, func_name)
    return source, len(kept)


# ---------------------------------------------------------------------------------------------
# Tests judged on plain data
# ---------------------------------------------------------------------------------------------

# What the outside half of an assert may use: pure builtins on plain data, and `math`.
_CHECK_BUILTINS = {n: getattr(builtins, n) for n in (
    "abs", "all", "any", "bool", "bytes", "chr", "complex", "dict", "divmod", "enumerate", "float", "frozenset",
    "int", "isinstance", "len", "list", "max", "min", "ord", "range", "repr", "reversed", "round", "set", "sorted",
    "str", "sum", "tuple", "type", "zip")}
_CHECK_NODES = (ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp, ast.Constant, ast.List,
                ast.Tuple, ast.Set, ast.Dict, ast.Name, ast.Load, ast.Store, ast.Subscript, ast.Slice, ast.Call,
                ast.keyword, ast.Attribute, ast.Starred, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp,
                ast.comprehension, ast.boolop, ast.operator, ast.unaryop, ast.cmpop)
_SCOPES = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Lambda)
_MAX_EXPONENT = 64


@dataclass(frozen=True)
class ValueTest:
    """One assert, split where the solution's values enter it: `calls` (the outermost calls of the
    function, with their arguments) run in the sandbox; `check` (the assert's expression with each
    call replaced by `_r0`, `_r1`, ...) is evaluated outside on the plain values they returned."""

    line: int
    source: str
    check: str
    calls: tuple[str, ...]


class _LiftCalls(ast.NodeTransformer):
    def __init__(self, func_name: str):
        self.func_name, self.calls, self.depth = func_name, [], 0

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if isinstance(node.func, ast.Name) and node.func.id == self.func_name:
            if self.depth:
                raise ValueError(f"calls {self.func_name}() inside a comprehension or lambda (write one assert per case)")
            self.calls.append(ast.unparse(node))
            return ast.copy_location(ast.Name(f"_r{len(self.calls) - 1}", ast.Load()), node)
        return self.generic_visit(node)

    def _scope(self, node: ast.AST) -> ast.AST:
        self.depth += 1
        try:
            return self.generic_visit(node)
        finally:
            self.depth -= 1

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_Lambda = _scope


def _check_problem(check: ast.Expression, n_calls: int) -> str | None:
    """Why `check` cannot be evaluated outside the sandbox on plain data, or None."""
    bound = {f"_r{i}" for i in range(n_calls)} | set(_CHECK_BUILTINS) | {"math"}
    bound |= {n.id for n in ast.walk(check) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for n in ast.walk(check):
        if not isinstance(n, _CHECK_NODES):
            return f"uses {type(n).__name__}"
        if isinstance(n, ast.Name) and n.id not in bound:
            return f"uses the name {n.id!r} (only the function's results, builtins on plain data and math)"
        if isinstance(n, ast.Attribute) and n.attr.startswith("_"):
            return f"uses the attribute {n.attr!r}"
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) and not (
                isinstance(n.right, ast.Constant) and isinstance(n.right.value, int) and abs(n.right.value) <= _MAX_EXPONENT):
            return f"raises to a power other than a constant of at most {_MAX_EXPONENT}"
    return None


def value_tests(tests: str, func_name: str) -> list[ValueTest]:
    """The asserts of a tests block split for judging on plain data; ValueError(reason) for an assert
    that cannot be judged that way (it names the line)."""
    out = []
    for node in ast.parse(tests).body:
        if not isinstance(node, ast.Assert):
            raise ValueError(f"tests may only contain assert statements, found {type(node).__name__} at line {node.lineno}")
        lift = _LiftCalls(func_name)
        try:
            check = ast.fix_missing_locations(ast.Expression(lift.visit(node.test)))
        except ValueError as e:
            raise ValueError(f"test at line {node.lineno} {e}") from None
        why = _check_problem(check, len(lift.calls))
        if why:
            raise ValueError(f"test at line {node.lineno} {why}")
        out.append(ValueTest(node.lineno, ast.unparse(node), ast.unparse(check), tuple(lift.calls)))
    return out


def judge_value_test(test: ValueTest, values: list[PlainValue], func_name: str) -> str | None:
    """Why `test` fails on the plain `values` its calls returned, or None when it holds."""
    for i, v in enumerate(values):
        if not v.plain:
            return (f"test at line {test.line}: {func_name}() returned a {v.type_name}, not plain data "
                    f"(exact int, float, complex, str, bytes, bool, None, list, tuple, set, frozenset, dict)")
    env = {f"_r{i}": v.value for i, v in enumerate(values)}
    try:
        held = eval(compile(test.check, f"<test line {test.line}>", "eval"),   # noqa: S307 - checked by _check_problem
                    {"__builtins__": _CHECK_BUILTINS, "math": math}, env)
    except Exception as e:       # a failing comparison of the values (TypeError, ...) fails the test
        return f"test at line {test.line}: {test.source} raised {type(e).__name__}: {str(e)[:120]}"
    return None if held is True or (type(held) in (bool, int) and bool(held)) else f"test at line {test.line} failed: {test.source}"


def parse_problem(output: str) -> Problem:
    """Parse a problem teacher's answer: `Title: ...`, a python block with the function and its
    docstring, and an optional second python block of `assert` tests. Raises ValueError(reason)."""
    m = _TITLE_RE.search(output)
    title = m.group(1).strip().strip("*`\"'") if m else ""
    blocks = extract_code_blocks(output)
    if not blocks:
        raise ValueError("no python code block")
    code = blocks[0]
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        raise ValueError(f"problem does not parse: {e.msg} (line {e.lineno})") from None
    funcs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if len(funcs) != 1:
        raise ValueError(f"problem must define exactly one top-level function, found {len(funcs)}")
    fn = funcs[0]
    doc = _docstring_node(fn)
    if doc is None:
        raise ValueError(f"function {fn.name} has no docstring (the problem statement goes there)")
    if len((ast.get_docstring(fn) or "").split()) < 5:
        raise ValueError(f"the docstring of {fn.name} is too short to state a problem")
    rest = fn.body[1:]
    if any(not _is_stub(s) for s in rest):
        raise ValueError(f"function {fn.name} already has a body beyond its docstring (the problem must not contain the solution)")
    others = [n for n in tree.body if n is not fn and not isinstance(n, (ast.Import, ast.ImportFrom))]
    if others:
        raise ValueError(f"problem has top-level code besides imports and the function (line {others[0].lineno})")
    if not is_descriptive_name(fn.name):
        raise ValueError(f"function name {fn.name!r} is not descriptive")
    offsets = _line_offsets(code)
    problem_text = code[: offsets[doc.end_lineno - 1] + doc.end_col_offset] + "\n"
    tests, n_tests = "", 0
    if len(blocks) > 1:
        try:
            tests, n_tests = parse_tests(blocks[1], fn.name)
        except (SyntaxError, ValueError) as e:
            raise ValueError(f"tests block is unusable: {e}") from None
    return Problem(title=title, func_name=fn.name, problem_text=problem_text,
                   imports=sorted(import_roots(tree)), tests=tests, n_tests=n_tests)


# ---------------------------------------------------------------------------------------------
# Solutions
# ---------------------------------------------------------------------------------------------

@dataclass
class Spliced:
    solution_part: str      # what comes from the solver: the body, its allowed imports and helpers
    final_code: str         # problem_text + solution_part
    n_lines: int            # non-blank lines of solution_part
    dropped: list[str] = field(default_factory=list)   # solver top-level code not kept (demo calls, prints)


def _reindent(lines: list[str], old: str, new: str) -> list[str]:
    out = []
    for line in lines:
        if not line.strip():
            out.append("")
        elif line.startswith(old):
            out.append(new + line[len(old):])
        else:
            out.append(line)          # continuation inside a bracket or string: leave as written
    return out


def splice_solution(problem: Problem, solver_output: str) -> Spliced:
    """Take the body of `problem.func_name` (and helpers) from the solver's code and append it to
    the original problem text (Nemotron 3 §2.3.2 step 5b). Raises ValueError(reason)."""
    candidates = extract_code_blocks(solver_output) or [solver_output]
    chosen = None
    for code in candidates:
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        fns = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == problem.func_name]
        if fns:
            chosen = (code, tree, fns[0])
            break
    if chosen is None:
        if not any(_parses(c) for c in candidates):
            raise ValueError("solution does not parse")
        raise ValueError(f"solution does not define {problem.func_name}()")
    code, tree, fn = chosen
    lines = code.splitlines()
    body = list(fn.body)
    if _docstring_node(fn) is not None:
        body = body[1:]
    body = [s for s in body if not _is_stub(s)] or []
    if not body:
        raise ValueError(f"{problem.func_name}() has an empty body")
    problem_indent = _problem_indent(problem)
    if body[0].lineno > fn.lineno:
        solver_indent = lines[body[0].lineno - 1][: body[0].col_offset]
        body_lines = _reindent(lines[body[0].lineno - 1: fn.end_lineno], solver_indent, problem_indent)
    else:   # `def f(x): return x` on one line
        body_lines = textwrap.indent("\n".join(ast.unparse(s) for s in body), problem_indent).splitlines()
    extras: list[str] = []
    dropped: list[str] = []
    for node in tree.body:
        if node is fn:
            continue
        segment = ast.get_source_segment(code, node) or ast.unparse(node)
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            extras.append(segment)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and all(isinstance(t, ast.Name) and t.id.isupper()
                                                                 for t in (node.targets if isinstance(node, ast.Assign) else [node.target])):
            extras.append(segment)           # module constants the solution uses
        else:
            dropped.append(segment.splitlines()[0][:80])
    solution_part = "\n".join(body_lines).rstrip() + "\n"
    if extras:
        solution_part += "\n\n" + "\n\n".join(e.rstrip() for e in extras) + "\n"
    final_code = problem.problem_text + solution_part
    n_lines = sum(1 for line in solution_part.splitlines() if line.strip())
    return Spliced(solution_part=solution_part, final_code=final_code, n_lines=n_lines, dropped=dropped)


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
        return True
    except SyntaxError:
        return False


def _problem_indent(problem: Problem) -> str:
    """The indentation of the problem function's body (that of its docstring)."""
    for line in problem.problem_text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith(('"""', "'''", 'r"""', "r'''")) and line != stripped:
            return line[: len(line) - len(stripped)]
    return "    "


@dataclass
class CodeVerdict:
    ok: bool
    reason: str = ""
    n_lines: int = 0
    extra_imports: list[str] = field(default_factory=list)
    sandbox: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_solution(problem: Problem, spliced: Spliced, *, max_lines: int = MAX_SOLUTION_LINES,
                   run_tests: bool = True, limits: SandboxLimits | None = None) -> CodeVerdict:
    """Keep a solution iff it parses, adds no imports, fits `max_lines`, and passes the problem's tests."""
    if not spliced.final_code.startswith(problem.problem_text):
        return CodeVerdict(False, "the final code does not start with the problem text")
    try:
        final_tree = ast.parse(spliced.final_code)
    except SyntaxError as e:
        return CodeVerdict(False, f"final code does not parse: {e.msg} (line {e.lineno})", spliced.n_lines)
    try:
        solution_tree = ast.parse(textwrap.dedent(spliced.solution_part))
    except SyntaxError:
        solution_tree = final_tree
    extra = sorted(import_roots(solution_tree) - set(problem.imports)) + dynamic_imports(solution_tree)
    if extra:
        return CodeVerdict(False, f"imports beyond the problem's: {', '.join(extra)}", spliced.n_lines, extra_imports=extra)
    if spliced.n_lines > max_lines:
        return CodeVerdict(False, f"{spliced.n_lines} lines, at most {max_lines}", spliced.n_lines)
    if run_tests and problem.tests:
        return _run_tests(problem, spliced, limits or SandboxLimits(timeout_s=5, memory_mb=512))
    return CodeVerdict(True, "", spliced.n_lines)


def _run_tests(problem: Problem, spliced: Spliced, limits: SandboxLimits) -> CodeVerdict:
    """The problem's tests: the calls in the sandbox, the judgement here on their plain results."""
    try:
        tests = value_tests(problem.tests, problem.func_name)
    except (SyntaxError, ValueError) as e:
        return CodeVerdict(False, f"tests unusable: {e}", spliced.n_lines)
    verdict, values = run_python_values(spliced.final_code, [c for t in tests for c in t.calls], limits=limits)
    sandbox = {k: v for k, v in verdict.to_dict().items() if k in ("status", "detail", "duration_s", "network_isolated")}
    if not verdict.passed or values is None:
        return CodeVerdict(False, f"tests {verdict.status}: {verdict.detail}", spliced.n_lines, sandbox=sandbox)
    start = 0
    for t in tests:
        why = judge_value_test(t, values[start: start + len(t.calls)], problem.func_name)
        start += len(t.calls)
        if why:
            return CodeVerdict(False, f"tests failed: {why}", spliced.n_lines, sandbox=dict(sandbox, status="failed"))
    return CodeVerdict(True, "", spliced.n_lines, sandbox=sandbox)


# ---------------------------------------------------------------------------------------------
# Titles and decontamination
# ---------------------------------------------------------------------------------------------

def normalize_title(title: str) -> str:
    """Lower case, letters and digits only, single spaces: the key of title dedup."""
    return " ".join(re.sub(r"[^a-z0-9]+", " ", title.lower()).split())


def title_problem(title: str, min_words: int = 5, max_words: int = 8) -> str | None:
    """Why `title` is not a usable 5-8 word title (Nemotron 3 §2.3.3), or None."""
    n = len(normalize_title(title).split())
    if n == 0:
        return "no title"
    if not min_words <= n <= max_words:
        return f"title has {n} words, expected {min_words}-{max_words}"
    return None


def dedup_by_title(items: Iterable[Any], title_of: Any) -> tuple[list[Any], list[Any]]:
    """(kept, duplicates): the first item of each normalized title is kept, in input order."""
    seen: set[str] = set()
    kept, dups = [], []
    for item in items:
        key = normalize_title(title_of(item))
        if key in seen:
            dups.append(item)
        else:
            seen.add(key)
            kept.append(item)
    return kept, dups


class _StripDocstrings(ast.NodeTransformer):
    def _strip(self, node: Any) -> Any:
        self.generic_visit(node)
        if node.body and isinstance(node.body[0], ast.Expr) and isinstance(getattr(node.body[0], "value", None), ast.Constant) \
                and isinstance(node.body[0].value.value, str):
            node.body = node.body[1:] or [ast.Pass()]
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Module = _strip


def normalized_body(code: str, func_name: str | None = None) -> str | None:
    """The function's body with docstrings, comments and layout removed (`ast.unparse`), or the
    whole module's when `func_name` is None; None when the code does not parse."""
    try:
        tree = _StripDocstrings().visit(ast.parse(code))
    except SyntaxError:
        return None
    if func_name is None:
        return ast.unparse(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == func_name:
            return "\n".join(ast.unparse(s) for s in node.body)
    return None


def benchmark_bodies(items: Iterable[dict[str, Any]]) -> set[str]:
    """Normalized solution bodies of HumanEval-style items (`prompt` + `canonical_solution`,
    `entry_point`) or MBPP-style items (`code`, with the function named in it)."""
    out: set[str] = set()
    for it in items:
        if "canonical_solution" in it:
            body = normalized_body(it["prompt"] + it["canonical_solution"], it.get("entry_point"))
            if body:
                out.add(body)
        elif "code" in it:
            try:
                tree = ast.parse(it["code"])
            except SyntaxError:
                continue
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    body = normalized_body(it["code"], node.name)
                    if body:
                        out.add(body)
    return out


def exact_match_benchmark(final_code: str, func_name: str, bodies: set[str]) -> bool:
    """True when the solution's normalized body equals a benchmark solution's (renaming the
    function or rewording the docstring does not hide it)."""
    body = normalized_body(final_code, func_name)
    return body is not None and body in bodies
