"""Fixtures for the domain generators' end-to-end tests: a scripted teacher behind the engine's
fake OpenAI-compatible server (real HTTP), and a helper that runs a generator config on it."""

from __future__ import annotations

import importlib
import json
import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.synth.domains.sql_servers import (held_sql_servers, mysql_dsn, mysql_min_dsn, pg_dsn,  # noqa: F401
                                             pg_min_dsn)  # (session fixtures: throwaway servers)


class Script:
    """A scripted teacher: the first rule whose needles all occur in the last user message (or,
    with `system=True`, in the system message) answers; replies are strings or functions of
    (text, request). Counts what each rule answered, so tests can assert which paths ran."""

    def __init__(self) -> None:
        self.rules: list[tuple[tuple[str, ...], Any, bool, str]] = []
        self.hits: dict[str, int] = {}
        self.unmatched: list[str] = []
        self._lock = threading.Lock()

    def on(self, *needles: str, reply: str | Callable[[str, dict[str, Any]], Any], system: bool = False,
           name: str = "") -> "Script":
        self.rules.append((needles, reply, system, name or "|".join(needles)))
        return self

    def __call__(self, req: dict[str, Any]) -> Any:
        msgs = req.get("messages") or []
        last_user = next((m.get("content") or "" for m in reversed(msgs) if m.get("role") == "user"), "")
        system = next((m.get("content") or "" for m in msgs if m.get("role") == "system"), "")
        for needles, reply, on_system, name in self.rules:
            hay = system if on_system else last_user
            if all(n in hay for n in needles):
                with self._lock:
                    self.hits[name] = self.hits.get(name, 0) + 1
                return reply(hay, req) if callable(reply) else reply
        with self._lock:
            self.unmatched.append(last_user[:200])
        return "I do not know."


@pytest.fixture
def script() -> Script:
    return Script()


@pytest.fixture
def teacher(script: Script):
    from synth.fakeserver import FakeOpenAIServer

    with FakeOpenAIServer(script, model="teacher") as srv:
        yield srv


def run_generator(name_or_path: str, endpoint: str, out: Path, overrides: list[str] | None = None,
                  source: dict[str, Any] | None = None, update: dict[str, Any] | None = None,
                  step_updates: dict[str, dict[str, Any]] | None = None):
    """Run a shipped generator config against `endpoint` (every teacher role), as the CLI does.
    `step_updates` patches steps by name ({"rollouts": {"k": 4}})."""
    from synth.engine import apply_teacher_overrides, load_generator, run

    cfg = load_generator(name_or_path, overrides or [])
    for mod in cfg.imports:          # the domain module registers its sources and steps
        importlib.import_module(mod)
    changes = dict(update or {})
    if source is not None:
        changes["source"] = source
    if step_updates:
        names = {s.get("name") for s in cfg.steps}
        missing = set(step_updates) - names
        assert not missing, f"no steps named {missing} in {name_or_path}"
        changes["steps"] = [dict(s, **step_updates.get(s.get("name"), {})) for s in cfg.steps]
    if changes:
        cfg = cfg.model_copy(update=changes)
    teachers = {k: v.model_copy(update={"ready_timeout_s": 10.0, "max_retries": 2, "timeout_s": 30.0})
                for k, v in cfg.teachers.items()}
    cfg = cfg.model_copy(update={"teachers": teachers})
    cfg = apply_teacher_overrides(cfg, [endpoint], "teacher", None)
    return run(cfg, out, progress=False)


@pytest.fixture
def run_gen() -> Callable[..., Any]:
    return run_generator


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


@pytest.fixture
def jsonl() -> Callable[[Path], list[dict[str, Any]]]:
    return read_jsonl
