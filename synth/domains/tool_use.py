"""Tool-use generators (Nemotron 3 Super §3.1.1; spec §2.11-2.12; APIGen's format, execution and
semantic checks).

General tool use (`tool_use.yaml`), per sampled task (toolsets, <= 15 tools, persona,
conversation type, topic conditioned on the type):

  tool_query            the User model writes the task
  tool_query_gate       a judge passes or fails it (fits the persona, solvable with the tools, right type)
  tool_simulate         User, Assistant and Tool models play the conversation; every call goes
                        through the Tool Verifier (jsonschema + rules) and every assistant turn
                        through the inline turn-level judge (sub-stages in the manifest)
  tool_rules            rule checks on the whole conversation (structure, conversation type, <= 15 tools)
  tool_trajectory_judge the trajectory-level judge
  format_tool_use       records in the OpenAI `tool_calls` message format, the exposed tools in
                        the record's `tools` field

The Assistant model calls tools natively (OpenAI `tools` in the request, `tool_calls` in the
answer) or prompted (the Hermes/Qwen layout in the prompt), by `tool_protocol: native | prompted
| auto` of the simulation steps; `auto` (the default) probes the assistant's endpoint once
(`synth.backends.tool_support`) and takes native where the endpoint accepts tools and its chat
template renders them, prompted otherwise (the demo's SmolLM2). Both give the same records and
the same validation; each record says which in `meta.tool_protocol`.

The specialized conversational pipeline is `synth.domains.customer_service`; it shares the
simulation (`SimCfg`, `sim_callables`, `resolve_tool_protocol`) defined here.
"""

from __future__ import annotations

import json
import random
from typing import Any, Iterator, Literal

from pydantic import Field

from purokit.config import StrictModel, validate
from purokit.hashing import stable_id
from purokit.records import Verification
from synth.backends import tool_support
from synth.client import RetriesExhausted
from synth.domains import tool_sim
from synth.domains.mcp_tools import McpServerConfig, McpTools, ToolsConfig, list_tools_now
from synth.domains.seeds import Toolset, load_personas, load_toolsets, load_topics
from synth.domains.tool_validate import MAX_TOOLS_PER_TASK, conversation_problems
from synth.pipeline import Ask, Candidate, Row, RowError, Step, register_source, register_step, render, sampling_config
from synth.steps import JudgeParams, judge_candidate, judge_pass_fail

TYPE_INSTRUCTIONS = {
    "single_turn": "Everything needed is in this one message; the assistant can finish the task in one reply (after calling tools if needed).",
    "multi_step": "The task needs several tool calls in sequence, where a later call uses what an earlier call returned.",
    "multi_turn": "Start with one part of the task; the person will follow up with related requests later in the conversation.",
}


def tool_list(tools: list[dict[str, Any]]) -> str:
    return "\n".join(f"- {t['function']['name']}: {t['function'].get('description', '')}" for t in tools)


# ---- general tool use: source ---------------------------------------------------------------------

def sample_tasks(seed: int, n: int, toolsets: list[Any], personas: list[Any], topics: dict[str, list[str]],
                 max_tools: int = MAX_TOOLS_PER_TASK, max_toolsets: int = 2,
                 type_weights: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """`n` tasks: 1..max_toolsets toolsets, a subset of at most `max_tools` of their tools (at
    least 2), a persona, a conversation type (weighted) and a topic of that type."""
    rng = random.Random(seed)
    weights = type_weights or {"single_turn": 1.0, "multi_step": 1.0, "multi_turn": 1.0}
    types = [t for t in ("single_turn", "multi_step", "multi_turn") if weights.get(t, 0) > 0]
    out = []
    for i in range(n):
        k = rng.randint(1, min(max_toolsets, len(toolsets)))
        chosen = sorted(rng.sample(range(len(toolsets)), k))
        pool = [t for j in chosen for t in toolsets[j].tools]
        size = rng.randint(min(2, len(pool)), min(max_tools, len(pool)))
        tools = [pool[j] for j in sorted(rng.sample(range(len(pool)), size))]
        persona = rng.choice(personas)
        ctype = rng.choices(types, weights=[weights[t] for t in types])[0]
        topic = rng.choice(topics[ctype])
        names = [t["function"]["name"] for t in tools]
        out.append({
            "id": f"tool-{seed}-{i}-" + stable_id(*names, persona.id, ctype, topic, n_hex=8),
            "prompt": f"{ctype} | {persona.id} | {topic} | {', '.join(names)}",
            "toolset_ids": [toolsets[j].id for j in chosen], "tools": tools, "persona_id": persona.id,
            "persona": persona.description, "conversation_type": ctype, "topic": topic, "category": "tool_calling",
        })
    return out


@register_source("tool_tasks")
def tool_task_source(seed: int, n: int = 100, toolsets: str = "toolsets.yaml", personas: str = "personas.yaml",
                     topics: str = "tool_topics.yaml", max_tools: int = MAX_TOOLS_PER_TASK, max_toolsets: int = 2,
                     type_weights: dict[str, float] | None = None,
                     tools: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Tasks over the shipped toolsets, or (`tools: {mcp: {command: [...]} | {url: ...}}`) over
    the tools an MCP server lists, which the rollout then calls for real."""
    if max_tools > MAX_TOOLS_PER_TASK:
        raise ValueError(f"max_tools {max_tools}: at most {MAX_TOOLS_PER_TASK} tools per task (Nemotron 3 §3.1.1)")
    if tools is None:
        yield from sample_tasks(seed, n, load_toolsets(toolsets), load_personas(personas), load_topics(topics),
                                max_tools, max_toolsets, type_weights)
        return
    server = validate(ToolsConfig, tools, "source.tools").mcp
    listed = Toolset(id=f"mcp:{server.describe()}", description="tools of an MCP server", tools=list_tools_now(server))
    for task in sample_tasks(seed, n, [listed], load_personas(personas), load_topics(topics), max_tools, 1,
                             type_weights):
        yield dict(task, tool_server=server.model_dump(mode="json", exclude_none=True))


def _fields(row: Row, **extra: Any) -> dict[str, Any]:
    tools = row.fields.get("tools") or []
    out = dict(row.fields, tool_list=tool_list(tools), tool_names=", ".join(t["function"]["name"] for t in tools),
               type_instruction=TYPE_INSTRUCTIONS.get(row.fields.get("conversation_type", ""), ""))
    out.update(extra)
    return out


# ---- general tool use: steps ------------------------------------------------------------------------

QUERY_PROMPT = """You are role-playing this person: {persona}

They can ask an AI assistant for help; the assistant can use these tools:
{tool_list}

Write the first message this person sends to the assistant. It is about {topic}, fits the person, and can be solved with the tools above. {type_instruction}
Write only the message, in the person's own words."""

GATE_PROMPT = """You check tasks for a tool-use dataset.
Person: {persona}
Tools:
{tool_list}
Conversation type: {conversation_type} ({type_instruction})
Task message: {query}

Does the task message fit the person, can it be solved with the listed tools, and does it match the conversation type? Reply with a JSON object {{"verdict": "PASS" or "FAIL", "reason": "<one sentence>"}}."""

TOOL_PROMPT = """You simulate the API behind the function "{name}".
Its definition: {definition}
{context}
The user's request: {query}
Results returned earlier in this conversation: {previous}
The call: {call}

First check the call for syntactic and semantic errors: a required argument missing, a value of the wrong type or format, or a value that contradicts the user's request. If the call is wrong, return {{"error": "<what is wrong>"}}. Otherwise return a realistic result, consistent with the request and with earlier results.
Reply with one JSON object and nothing else."""

FOLLOWUP_PROMPT = """You are role-playing this person: {persona}
They are talking to an AI assistant about {topic}. The conversation so far:
{transcript}

Write this person's next message: a natural follow-up that continues or changes the task and can still be solved with the assistant's tools ({tool_names}). If the person is fully satisfied and has nothing to add, reply exactly [DONE]."""

TURN_JUDGE_PROMPT = """You review one assistant turn of a tool-use conversation.
Tools available: {tool_names}
Conversation before the turn:
{transcript}

The assistant's turn:
{turn}

PASS if the turn is a correct next step: it calls the right tools with arguments taken from the conversation (not invented), or it answers faithfully from the tool results. FAIL otherwise. Reply with a JSON object {{"verdict": "PASS" or "FAIL", "reason": "<one sentence>"}}."""

TRAJECTORY_JUDGE_PROMPT = """You review a complete tool-use conversation.
Person: {persona}
Tools available: {tool_names}
Conversation:
{transcript}

PASS if the assistant did what the user asked, used the tools correctly, and its answers are faithful to the tool results; FAIL otherwise. Reply with a JSON object {{"verdict": "PASS" or "FAIL", "reason": "<one sentence>"}}."""

ASSISTANT_PREAMBLE = "You are a helpful assistant."


@register_step("tool_query")
class ToolQuery(Step):
    """The User model writes the task message."""

    class Config(sampling_config("user", QUERY_PROMPT, temperature=0.8, max_tokens=200)):
        min_chars: int = 15
        max_chars: int = 1200

    async def apply(self, row: Row) -> None:
        cands = await self.sample(row, "query", Ask(_fields(row), ("query",)),
                                  text=lambda reply: reply.strip().strip('"').strip())
        await self.keep(row, cands, self.problem)

    def problem(self, c: Candidate) -> str | None:
        if "<tool_call>" in c.text:
            return "the user message contains a tool call"
        if not self.cfg.min_chars <= len(c.text) <= self.cfg.max_chars:
            return f"{len(c.text)} characters, expected {self.cfg.min_chars}-{self.cfg.max_chars}"
        return None


@register_step("tool_query_gate")
class ToolQueryGate(Step):
    """The query gate: an LLM judge passes or fails the task."""

    class Config(StrictModel):
        judge: JudgeParams = Field(default_factory=JudgeParams)
        template: str = GATE_PROMPT

    async def apply(self, row: Row) -> None:
        await self.keep(row, "query", lambda c: judge_candidate(
            self, row, self.cfg.judge, render(self.cfg.template, _fields(row, query=c.text)), c, "query_gate", "query gate", c.index))


class SimCfg(StrictModel):
    assistant: str = "assistant"
    user: str = "user"
    tool: str = "tool"
    judge: JudgeParams = Field(default_factory=JudgeParams)
    turn_judge: bool = True
    max_steps_per_turn: int = 4
    tool_result_role: str = "user"
    stop_on_violation: bool = True
    assistant_params: dict[str, Any] = Field(default_factory=lambda: {"temperature": 0.6, "max_tokens": 400})
    user_params: dict[str, Any] = Field(default_factory=lambda: {"temperature": 0.8, "max_tokens": 200})
    tool_params: dict[str, Any] = Field(default_factory=lambda: {"temperature": 0.3, "max_tokens": 300})
    tool_template: str = TOOL_PROMPT
    turn_judge_template: str = TURN_JUDGE_PROMPT
    # how the Assistant model calls tools: native OpenAI tool calling, the prompted Hermes layout,
    # or auto (native where the assistant's endpoint supports it; probed once per run)
    tool_protocol: Literal["auto", "native", "prompted"] = "auto"


async def resolve_tool_protocol(step: Step, setting: str, role: str) -> tuple[str, str]:
    """(protocol, why) for the assistant teacher `role`."""
    if setting != "auto":
        return setting, "configured"
    backend = step.env.backend(role)
    try:
        support = await tool_support(backend)
    except RetriesExhausted as e:
        raise RowError(f"teacher '{role}' ({backend.cfg.model}): the tool-calling probe failed: {e}") from e
    return ("native" if support.native else "prompted"), support.reason


def system_prompt(protocol: str, preamble: str, tools: list[dict[str, Any]]) -> str:
    """The Assistant's system prompt: the preamble, plus the tool list and calling convention when
    they travel in the prompt (native: the server's chat template renders `tools`)."""
    if protocol == "native":
        return preamble
    return render(tool_sim.ASSISTANT_SYSTEM, {"preamble": preamble, "tools": tool_sim.render_tools(tools)})


def sim_callables(step: Step, row: Row, cfg: SimCfg, tools: list[dict[str, Any]], query_of: Any, key: tuple,
                  tool_context: str = "", followup: Any = None, protocol: str = "prompted") -> dict[str, Any]:
    """The teacher-backed callables `tool_sim.simulate` needs; `key` makes their seeds unique."""
    by_name = {t["function"]["name"]: t for t in tools}

    async def assistant(messages: list[dict[str, Any]], k: tuple) -> Any:
        if protocol == "native":
            res = await step.ask(row, cfg.assistant, messages, "assistant", *key, *k, params=cfg.assistant_params,
                            tools=tools, tool_choice="auto")
            return res.content, res.tool_calls
        return (await step.ask(row, cfg.assistant, messages, "assistant", *key, *k, params=cfg.assistant_params)).content

    async def tool_model(call: dict[str, Any], messages: list[dict[str, Any]], k: tuple) -> str:
        previous = [m["content"] for m in messages if m["role"] == "tool"][-4:]
        prompt = render(cfg.tool_template, {
            "name": call["function"]["name"], "definition": json.dumps(by_name[call["function"]["name"]], sort_keys=True),
            "context": tool_context, "query": query_of(messages), "previous": "; ".join(previous) or "none",
            "call": json.dumps({"name": call["function"]["name"], "arguments": tool_sim.call_arguments(call)}, sort_keys=True)})
        return (await step.ask(row, cfg.tool, [{"role": "user", "content": prompt}], "tool", *key, *k,
                          params=cfg.tool_params)).content

    async def turn_judge(before: list[dict[str, Any]], msg: dict[str, Any], k: tuple) -> tuple[bool | None, str]:
        prompt = render(cfg.turn_judge_template, _fields(row, transcript=tool_sim.transcript(before),
                                                          turn=tool_sim.transcript([msg]), tool_names=", ".join(by_name)))
        return await judge_pass_fail(step, row, cfg.judge, prompt, "turn", *key, *k)

    return {"assistant": assistant, "tool_model": tool_model, "turn_judge": turn_judge, "user_model": followup}


@register_step("tool_simulate")
class ToolSimulate(Step):
    """User, Assistant and Tool models play the conversation of each surviving query."""

    class Config(SimCfg):
        followup_template: str = FOLLOWUP_PROMPT
        multi_turn_user_turns: int = 2
        system_preamble: str = ASSISTANT_PREAMBLE

    async def apply(self, row: Row) -> None:
        alive = self.alive(row, "query")
        tools = row.fields["tools"]
        ctype = row.fields["conversation_type"]
        user_turns = self.cfg.multi_turn_user_turns if ctype == "multi_turn" else 1
        protocol, _ = await resolve_tool_protocol(self, self.cfg.tool_protocol, self.cfg.assistant) if alive else ("", "")
        system = system_prompt(protocol, self.cfg.system_preamble, tools)
        made: list[tuple[Candidate, str]] = []
        for q in alive:
            async def followup(messages: list[dict[str, Any]], turn: int, k: tuple) -> str | None:
                prompt = render(self.cfg.followup_template, _fields(row, transcript=tool_sim.transcript(messages)))
                text = (await self.ask(row, self.cfg.user, [{"role": "user", "content": prompt}], "followup", q.index, *k,
                                  params=self.cfg.user_params)).content.strip()
                return None if not text or "[DONE]" in text else text.strip('"')

            first = q.text
            fns = sim_callables(self, row, self.cfg, tools, lambda msgs: first, (q.index,), followup=followup,
                                protocol=protocol)
            if row.fields.get("tool_server"):
                fns["tool_model"] = self.real_tools(row.fields["tool_server"])
            opts = tool_sim.SimOptions(max_steps_per_turn=self.cfg.max_steps_per_turn, user_turns=user_turns,
                                       tool_result_role=self.cfg.tool_result_role, turn_judge=self.cfg.turn_judge,
                                       stop_on_violation=self.cfg.stop_on_violation, protocol=protocol)
            sim = await tool_sim.simulate(tools=tools, system=system, first_user=q.text, opts=opts, **fns)
            for stage, (a, b) in sim.stage_counts.items():
                self.count(row, a, b, stage=stage)
            c = self.add_candidate(row, "trajectory", json.dumps(sim.messages, ensure_ascii=False), self.cfg.assistant,
                              self.cfg.assistant_params, None, self.request_seed(row, "assistant", q.index),
                              messages=sim.messages, turn_judgements=sim.turn_judgements,
                              schema_violations=sim.schema_violations, query_gate=q.parsed.get("query_gate"),
                              tool_protocol=protocol)
            made.append((c, "" if sim.ok else sim.reason))
        why = {id(c): reason for c, reason in made}
        await self.keep(row, [c for c, _ in made], lambda c: why[id(c)] or None)

    def real_tools(self, server: dict[str, Any]) -> Any:
        """A `tool_model` that calls the task's MCP server instead of simulating it (one
        connection per server per run)."""
        cfg = McpServerConfig.model_validate(server)
        conn = self.env.resource("mcp:" + json.dumps(server, sort_keys=True), lambda: McpTools(cfg))

        async def call(c: dict[str, Any], messages: list[dict[str, Any]], k: tuple) -> str:
            return await conn.call(c["function"]["name"], tool_sim.call_arguments(c))

        return call


@register_step("tool_rules")
class ToolRules(Step):
    """Rule checks over the whole conversation (tool_validate.conversation_problems)."""

    class Config(StrictModel):
        max_calls_per_turn: int = 8

    async def apply(self, row: Row) -> None:
        def rules(c: Candidate) -> str | None:
            v = conversation_problems(c.parsed["messages"], row.fields["tools"],
                                      conversation_type=row.fields["conversation_type"],
                                      max_calls_per_turn=self.cfg.max_calls_per_turn)
            c.parsed["rule_checks"] = v.to_dict()
            return None if v.ok else "; ".join(v.problems()[:3])

        await self.keep(row, "trajectory", rules)


@register_step("tool_trajectory_judge")
class ToolTrajectoryJudge(Step):
    class Config(StrictModel):
        judge: JudgeParams = Field(default_factory=JudgeParams)
        template: str = TRAJECTORY_JUDGE_PROMPT

    async def apply(self, row: Row) -> None:
        async def judge(c: Candidate) -> str | None:
            prompt = render(self.cfg.template, _fields(row, transcript=tool_sim.transcript(c.parsed["messages"])))
            return await judge_candidate(self, row, self.cfg.judge, prompt, c, "trajectory_judgement", "trajectory judge", c.index)

        await self.keep(row, "trajectory", judge)


@register_step("format_tool_use")
class FormatToolUse(Step):
    """Records in the OpenAI `tool_calls` message format; the exposed tools in the record's `tools`."""

    class Config(StrictModel):
        tool_teacher: str = "tool"

    async def apply(self, row: Row) -> None:
        alive = self.alive(row, "trajectory")
        for c in alive:
            msgs = c.parsed["messages"]
            meta = {
                "toolset_ids": row.fields["toolset_ids"], "persona_id": row.fields["persona_id"],
                "tool_protocol": c.parsed.get("tool_protocol"),
                "conversation_type": row.fields["conversation_type"], "topic": row.fields["topic"],
                "query_gate": c.parsed.get("query_gate"), "turn_judgements": c.parsed["turn_judgements"],
                "schema_violations": len(c.parsed["schema_violations"]),
                "trajectory_judgement": c.parsed.get("trajectory_judgement"),
                "n_tool_calls": (c.parsed.get("rule_checks") or {}).get("n_tool_calls"),
                "simulator_model": ("mcp:" + McpServerConfig.model_validate(row.fields["tool_server"]).describe()
                                    if row.fields.get("tool_server") else self.env.backend(self.cfg.tool_teacher).cfg.model),
            }
            verification = Verification(method="tool_schema+rules+judges", verdict=True, score=None,
                                        rule="query_gate,tool_verifier,turn_judge,rules,trajectory_judge")
            self.record(row, ("trajectory", c.index), msgs, teacher=c.teacher,
                                            verification=verification, meta=meta, category="tool_calling",
                                            tools=row.fields["tools"])
        self.count(row, len(alive), len(alive))
