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

The specialized conversational pipeline (`tool_use_conversational.yaml`), per seed domain:
  cs_subdomain -> cs_policy_tools (generation, self-refinement on failed checks, a few-shot
  LLM judge) -> cs_scenarios -> cs_rollouts (k simulated customer-service conversations per
  scenario) -> cs_verify (outcome- and process-level judges plus the expected tool calls) ->
  cs_select (keep scenarios solved neither always nor never; emit their successful rollouts).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from typing import Any, Iterator, Literal

from jsonschema import Draft202012Validator
from pydantic import Field

from common.hashing import stable_id
from synth.backends import tool_support
from synth.client import RetriesExhausted
from synth.domains import tool_sim
from synth.domains.glue import (VERDICT_SCHEMA, JudgeParams, StepCfg, add_candidate, ask, build_record,
                                parse_pass_fail, render, request_seed)
from synth.domains.seeds import load_domains, load_personas, load_toolsets, load_topics
from synth.domains.tool_validate import MAX_TOOLS_PER_TASK, conversation_problems, tool_definition_problems
from synth.pipeline import Row, RowError, Step, register_source, register_step
from common.records import Verification

TYPE_INSTRUCTIONS = {
    "single_turn": "Everything needed is in this one message; the assistant can finish the task in one reply (after calling tools if needed).",
    "multi_step": "The task needs several tool calls in sequence, where a later call uses what an earlier call returned.",
    "multi_turn": "Start with one part of the task; the person will follow up with related requests later in the conversation.",
}


def count_stage(row: Row, stage: str, n_in: int, n_out: int) -> None:
    """Acceptance of a sub-stage inside a step, reported in the run manifest like a step's."""
    c = row.step_counts.setdefault(stage, [0, 0])
    c[0] += n_in
    c[1] += n_out


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
                     type_weights: dict[str, float] | None = None) -> Iterator[dict[str, Any]]:
    if max_tools > MAX_TOOLS_PER_TASK:
        raise ValueError(f"max_tools {max_tools}: at most {MAX_TOOLS_PER_TASK} tools per task (Nemotron 3 §3.1.1)")
    yield from sample_tasks(seed, n, load_toolsets(toolsets), load_personas(personas), load_topics(topics),
                            max_tools, max_toolsets, type_weights)


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


def _first_line_reason(text: str) -> str:
    try:
        obj = tool_sim.parse_json_object(text)
        return str(obj.get("reason", ""))[:200]
    except ValueError:
        return text.strip()[:200]


async def judge_pass_fail(step: Step, row: Row, judge: JudgeParams, prompt: str, *key: Any) -> tuple[bool | None, str]:
    res = await ask(step, row, judge.teacher, [{"role": "user", "content": prompt}], *key, params=judge.params,
                    json_schema=VERDICT_SCHEMA if judge.constrained else None)
    verdict = parse_pass_fail(res.content)
    return verdict, (_first_line_reason(res.content) if verdict is not None else f"unparseable judge reply: {res.content.strip()[:120]!r}")


class ToolQuery(Step):
    """The User model writes the task message."""

    class Config(StepCfg):
        teacher: str = "user"
        template: str = QUERY_PROMPT
        params: dict[str, Any] = Field(default_factory=lambda: {"temperature": 0.8, "max_tokens": 200})
        min_chars: int = 15
        max_chars: int = 1200

    async def apply(self, row: Row) -> None:
        res = await ask(self, row, self.cfg.teacher, [{"role": "user", "content": render(self.cfg.template, _fields(row))}],
                        "query", params=self.cfg.params)
        text = res.content.strip().strip('"').strip()
        c = add_candidate(self, row, "query", text, self.cfg.teacher, self.cfg.params, res, request_seed(self, row, "query"))
        why = None
        if "<tool_call>" in text:
            why = "the user message contains a tool call"
        elif not self.cfg.min_chars <= len(text) <= self.cfg.max_chars:
            why = f"{len(text)} characters, expected {self.cfg.min_chars}-{self.cfg.max_chars}"
        if why:
            self.reject(row, c, why)
        self.count(row, 1, 0 if why else 1)


class ToolQueryGate(Step):
    """The query gate: an LLM judge passes or fails the task."""

    class Config(StepCfg):
        judge: JudgeParams = Field(default_factory=JudgeParams)
        template: str = GATE_PROMPT

    async def apply(self, row: Row) -> None:
        alive = self.alive(row, "query")
        kept = 0
        for c in alive:
            verdict, why = await judge_pass_fail(self, row, self.cfg.judge, render(self.cfg.template, _fields(row, query=c.text)), c.index)
            c.parsed["query_gate"] = {"pass": bool(verdict), "reason": why}
            if verdict:
                kept += 1
            else:
                self.reject(row, c, f"query gate: {why}")
        self.count(row, len(alive), kept)


class SimCfg(StepCfg):
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
            res = await ask(step, row, cfg.assistant, messages, "assistant", *key, *k, params=cfg.assistant_params,
                            tools=tools, tool_choice="auto")
            return res.content, res.tool_calls
        return (await ask(step, row, cfg.assistant, messages, "assistant", *key, *k, params=cfg.assistant_params)).content

    async def tool_model(call: dict[str, Any], messages: list[dict[str, Any]], k: tuple) -> str:
        previous = [m["content"] for m in messages if m["role"] == "tool"][-4:]
        prompt = render(cfg.tool_template, {
            "name": call["function"]["name"], "definition": json.dumps(by_name[call["function"]["name"]], sort_keys=True),
            "context": tool_context, "query": query_of(messages), "previous": "; ".join(previous) or "none",
            "call": json.dumps({"name": call["function"]["name"], "arguments": tool_sim.call_arguments(call)}, sort_keys=True)})
        return (await ask(step, row, cfg.tool, [{"role": "user", "content": prompt}], "tool", *key, *k,
                          params=cfg.tool_params)).content

    async def turn_judge(before: list[dict[str, Any]], msg: dict[str, Any], k: tuple) -> tuple[bool | None, str]:
        prompt = render(cfg.turn_judge_template, _fields(row, transcript=tool_sim.transcript(before),
                                                          turn=tool_sim.transcript([msg]), tool_names=", ".join(by_name)))
        return await judge_pass_fail(step, row, cfg.judge, prompt, "turn", *key, *k)

    return {"assistant": assistant, "tool_model": tool_model, "turn_judge": turn_judge, "user_model": followup}


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
        kept = 0
        for q in alive:
            async def followup(messages: list[dict[str, Any]], turn: int, k: tuple) -> str | None:
                prompt = render(self.cfg.followup_template, _fields(row, transcript=tool_sim.transcript(messages)))
                text = (await ask(self, row, self.cfg.user, [{"role": "user", "content": prompt}], "followup", q.index, *k,
                                  params=self.cfg.user_params)).content.strip()
                return None if not text or "[DONE]" in text else text.strip('"')

            first = q.text
            fns = sim_callables(self, row, self.cfg, tools, lambda msgs: first, (q.index,), followup=followup,
                                protocol=protocol)
            opts = tool_sim.SimOptions(max_steps_per_turn=self.cfg.max_steps_per_turn, user_turns=user_turns,
                                       tool_result_role=self.cfg.tool_result_role, turn_judge=self.cfg.turn_judge,
                                       stop_on_violation=self.cfg.stop_on_violation, protocol=protocol)
            sim = await tool_sim.simulate(tools=tools, system=system, first_user=q.text, opts=opts, **fns)
            for stage, (a, b) in sim.stage_counts.items():
                count_stage(row, f"{self.name}.{stage}", a, b)
            c = add_candidate(self, row, "trajectory", json.dumps(sim.messages, ensure_ascii=False), self.cfg.assistant,
                              self.cfg.assistant_params, None, request_seed(self, row, "assistant", q.index),
                              messages=sim.messages, turn_judgements=sim.turn_judgements,
                              schema_violations=sim.schema_violations, query_gate=q.parsed.get("query_gate"),
                              tool_protocol=protocol)
            if sim.ok:
                kept += 1
            else:
                self.reject(row, c, sim.reason)
        self.count(row, len(alive), kept)


class ToolRules(Step):
    """Rule checks over the whole conversation (tool_validate.conversation_problems)."""

    class Config(StepCfg):
        max_calls_per_turn: int = 8

    async def apply(self, row: Row) -> None:
        alive = self.alive(row, "trajectory")
        kept = 0
        for c in alive:
            v = conversation_problems(c.parsed["messages"], row.fields["tools"],
                                      conversation_type=row.fields["conversation_type"],
                                      max_calls_per_turn=self.cfg.max_calls_per_turn)
            c.parsed["rule_checks"] = v.to_dict()
            if v.ok:
                kept += 1
            else:
                self.reject(row, c, "; ".join(v.problems()[:3]))
        self.count(row, len(alive), kept)


class ToolTrajectoryJudge(Step):
    class Config(StepCfg):
        judge: JudgeParams = Field(default_factory=JudgeParams)
        template: str = TRAJECTORY_JUDGE_PROMPT

    async def apply(self, row: Row) -> None:
        alive = self.alive(row, "trajectory")
        kept = 0
        for c in alive:
            prompt = render(self.cfg.template, _fields(row, transcript=tool_sim.transcript(c.parsed["messages"])))
            verdict, why = await judge_pass_fail(self, row, self.cfg.judge, prompt, c.index)
            c.parsed["trajectory_judgement"] = {"pass": bool(verdict), "reason": why}
            if verdict:
                kept += 1
            else:
                self.reject(row, c, f"trajectory judge: {why}")
        self.count(row, len(alive), kept)


class FormatToolUse(Step):
    """Records in the OpenAI `tool_calls` message format; the exposed tools in the record's `tools`."""

    class Config(StepCfg):
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
                "simulator_model": self.env.backend(self.cfg.tool_teacher).cfg.model,
            }
            verification = Verification(method="tool_schema+rules+judges", verdict=True, score=None,
                                        rule="query_gate,tool_verifier,turn_judge,rules,trajectory_judge")
            row.records.append(build_record(self, row, ("trajectory", c.index), msgs, teacher=c.teacher,
                                            verification=verification, meta=meta, category="tool_calling",
                                            tools=row.fields["tools"]))
        self.count(row, len(alive), len(alive))


# ---- conversational (customer-service) pipeline: source ----------------------------------------

@register_source("service_domains")
def service_domain_source(seed: int, path: str = "service_domains.yaml", per_domain: int = 1,
                          domains: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """`per_domain` rows per seed domain (each draws its own sub-domain, policy and scenarios)."""
    for d in load_domains(path):
        if domains and d.id not in domains:
            continue
        for j in range(per_domain):
            yield {"id": f"cs-{d.id}-{j}", "prompt": f"{d.id}: {d.description}", "domain": d.id,
                   "domain_description": d.description, "subdomain_examples": ", ".join(d.subdomains) or "none",
                   "fixed_policy": d.policy, "fixed_tools": d.tools, "draw": j, "category": "tool_calling"}


SUBDOMAIN_PROMPT = """Domain: {domain_description}
Examples of specialized sub-domains: {subdomain_examples}

Propose one new, more specialized area of customer requests in this domain (draw {draw}). Reply with its name only, at most 8 words."""

POLICY_TOOLS_PROMPT = """You design the customer-service setup of a company.
Domain: {domain_description}
Sub-domain: {subdomain}

Write:
1. The policy the service agent must follow: 3 to 6 numbered rules (eligibility, limits, what to verify before acting).
2. The tools the agent can call: {min_tools} to {max_tools} functions in the OpenAI tools format, as a JSON array of {{"type": "function", "function": {{"name": ..., "description": ..., "parameters": <JSON schema>}}}}.

Answer in exactly this form:
Policy:
1. ...
Tools:
```json
[ ... ]
```"""

REFINE_PROMPT = """Here is a customer-service setup for {domain_description} ({subdomain}):

{draft}

Problems found: {problems}

Rewrite it so that every problem is fixed, the rules are unambiguous and the tool schemas are precise (types, formats, required fields). Answer in the same form (Policy: ... Tools: ```json ... ```)."""

SETUP_JUDGE_PROMPT = """You check customer-service setups for a training dataset. A good setup looks like this example:

Policy:
{example_policy}
Tools: {example_tools}

Setup to check ({domain_description}, {subdomain}):
Policy:
{policy}
Tools: {tool_names}

PASS if the policy rules are clear and enforceable with the tools, and the tools are what an agent in this sub-domain needs, in the same style as the example; FAIL otherwise. Reply with a JSON object {{"verdict": "PASS" or "FAIL", "reason": "<one sentence>"}}."""

SCENARIO_PROMPT = """Customer-service setup ({domain_description}, {subdomain}).
Policy:
{policy}
Tools:
{tool_list}

Write {n_scenarios} different customer scenarios for this setup. Each has a persona, background facts the customer knows (account ids, order numbers, dates), the inquiry, the outcome a correct agent reaches under the policy, and the tool calls a correct agent must make (the name and the arguments that matter).
Answer with a JSON array only:
[{{"persona": "...", "background": "...", "inquiry": "...", "expected_outcome": "...", "expected_actions": [{{"name": "...", "arguments": {{}}}}]}}]"""

CUSTOMER_PROMPT = """You are a customer contacting the customer service of a company ({domain_description}).
Who you are: {persona}
What you know: {background}
Your goal: {inquiry}

The conversation so far:
{transcript}

Write your next message as this customer. Give details only when asked. When your issue is resolved, or clearly cannot be, reply exactly [DONE]."""

OUTCOME_JUDGE_PROMPT = """You review a customer-service conversation.
Policy:
{policy}
The customer's goal: {inquiry}
The outcome a correct agent reaches: {expected_outcome}
Conversation:
{transcript}

PASS if the conversation reached that outcome; FAIL otherwise. Reply with a JSON object {{"verdict": "PASS" or "FAIL", "reason": "<one sentence>"}}."""

PROCESS_JUDGE_PROMPT = """You review how a customer-service agent worked.
Policy:
{policy}
Tools: {tool_names}
Conversation:
{transcript}

PASS if at every step the agent followed the policy (verified what it requires before acting, respected its limits), called tools with arguments the customer gave or the tools returned, and told the customer the truth about the results; FAIL otherwise. Reply with a JSON object {{"verdict": "PASS" or "FAIL", "reason": "<one sentence>"}}."""

AGENT_PREAMBLE = "You are a customer-service agent for a company ({domain_description}, {subdomain}). Follow this policy strictly:\n{policy}"

_POLICY_RE = re.compile(r"(?is)policy\s*:\s*(.+?)\s*(?:\n\s*\**tools\**\s*:|```)")


def parse_setup(text: str, min_tools: int, max_tools: int) -> tuple[str, list[dict[str, Any]], list[str]]:
    """(policy, tools, problems) from a policy-and-tools answer."""
    problems: list[str] = []
    m = _POLICY_RE.search(text)
    policy = m.group(1).strip() if m else ""
    if len(policy.split()) < 8:
        problems.append("no usable 'Policy:' section")
    tools: list[dict[str, Any]] = []
    blocks = re.findall(r"```(?:json)?\s*(\[.*?\])\s*```", text, re.DOTALL)
    if not blocks:
        problems.append("no ```json array of tools")
    else:
        try:
            tools = json.loads(blocks[-1])
            if not isinstance(tools, list):
                raise ValueError("not a list")
        except (json.JSONDecodeError, ValueError) as e:
            problems.append(f"tools are not a JSON array ({e})")
            tools = []
    if tools:
        problems += tool_definition_problems(tools)
        if not min_tools <= len(tools) <= max_tools:
            problems.append(f"{len(tools)} tools, expected {min_tools}-{max_tools}")
    return policy, tools, problems


def scenario_problems(sc: Any, tools: list[dict[str, Any]]) -> list[str]:
    """A scenario needs persona, background, inquiry, expected outcome; its expected actions name
    real tools with arguments that fit their schemas (required fields may be left out)."""
    if not isinstance(sc, dict):
        return ["not an object"]
    problems = [f"missing {k}" for k in ("persona", "background", "inquiry", "expected_outcome")
                if not isinstance(sc.get(k), str) or not sc[k].strip()]
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    acts = sc.get("expected_actions", [])
    if not isinstance(acts, list):
        return problems + ["expected_actions is not a list"]
    for a in acts:
        if not isinstance(a, dict) or a.get("name") not in by_name:
            problems.append(f"expected action {a!r:.80} names no tool of the setup")
            continue
        schema = {k: v for k, v in (by_name[a["name"]].get("parameters") or {}).items() if k != "required"}
        args = a.get("arguments") or {}
        errs = list(Draft202012Validator(schema).iter_errors(args)) if isinstance(args, dict) else ["arguments not an object"]
        if errs:
            problems.append(f"expected action {a['name']}: arguments do not fit its schema")
    return problems


# ---- conversational pipeline: steps -------------------------------------------------------------

class CsSubdomain(Step):
    """Progressive sub-domain sampling: the teacher specializes the seed domain."""

    class Config(StepCfg):
        teacher: str = "designer"
        template: str = SUBDOMAIN_PROMPT
        params: dict[str, Any] = Field(default_factory=lambda: {"temperature": 1.0, "max_tokens": 30})

    async def apply(self, row: Row) -> None:
        res = await ask(self, row, self.cfg.teacher, [{"role": "user", "content": render(self.cfg.template, row.fields)}],
                        "subdomain", params=self.cfg.params)
        name = res.content.strip().splitlines()[0].strip(" .\"'*#-") if res.content.strip() else ""
        ok = 1 <= len(name.split()) <= 8
        row.fields["subdomain"] = name if ok else row.fields["subdomain_examples"].split(",")[0].strip()
        self.count(row, 1, 1 if ok else 0)
        if not ok:
            row.rejects.append({"prompt_id": row.id, "step": self.name, "reason": f"unusable sub-domain {res.content[:80]!r}; "
                                "fell back to the first seed sub-domain", "level": "note"})


class CsPolicyTools(Step):
    """Policy and tools: generated, refined on failed checks, then judged (few-shot) for quality."""

    class Config(StepCfg):
        teacher: str = "designer"
        template: str = POLICY_TOOLS_PROMPT
        refine_template: str = REFINE_PROMPT
        judge_template: str = SETUP_JUDGE_PROMPT
        judge: JudgeParams = Field(default_factory=JudgeParams)
        params: dict[str, Any] = Field(default_factory=lambda: {"temperature": 0.7, "max_tokens": 1500})
        refine_rounds: int = 1
        min_tools: int = 3
        max_tools: int = MAX_TOOLS_PER_TASK
        example_domain: str = "library"

    async def apply(self, row: Row) -> None:
        fields = dict(row.fields, min_tools=self.cfg.min_tools, max_tools=self.cfg.max_tools)
        if row.fields.get("fixed_policy") and row.fields.get("fixed_tools"):
            policy, tools, problems, text = row.fields["fixed_policy"], row.fields["fixed_tools"], [], "(given)"
            rounds = 0
        else:
            res = await ask(self, row, self.cfg.teacher, [{"role": "user", "content": render(self.cfg.template, fields)}],
                            "setup", 0, params=self.cfg.params)
            text = res.content
            policy, tools, problems = parse_setup(text, self.cfg.min_tools, self.cfg.max_tools)
            rounds = 0
            while problems and rounds < self.cfg.refine_rounds:
                rounds += 1
                prompt = render(self.cfg.refine_template, dict(fields, draft=text, problems="; ".join(problems[:6])))
                res = await ask(self, row, self.cfg.teacher, [{"role": "user", "content": prompt}], "setup", rounds,
                                params=self.cfg.params)
                text = res.content
                policy, tools, problems = parse_setup(text, self.cfg.min_tools, self.cfg.max_tools)
        c = add_candidate(self, row, "setup", text, self.cfg.teacher, self.cfg.params, None, request_seed(self, row, "setup", rounds),
                          policy=policy, tools=tools, refine_rounds=rounds)
        if problems:
            self.reject(row, c, "; ".join(problems[:4]))
            self.count(row, 1, 0)
            return
        example = next((d for d in load_domains() if d.id == self.cfg.example_domain and d.policy), None)
        prompt = render(self.cfg.judge_template, dict(fields, policy=policy, tool_names=", ".join(t["function"]["name"] for t in tools),
                                                      example_policy=example.policy if example else "(none)",
                                                      example_tools=", ".join(t["function"]["name"] for t in (example.tools or [])) if example else ""))
        verdict, why = await judge_pass_fail(self, row, self.cfg.judge, prompt, "setup_judge")
        c.parsed["setup_judgement"] = {"pass": bool(verdict), "reason": why}
        if not verdict:
            self.reject(row, c, f"setup judge: {why}")
        self.count(row, 1, 1 if verdict else 0)


class CsScenarios(Step):
    class Config(StepCfg):
        teacher: str = "designer"
        template: str = SCENARIO_PROMPT
        n_scenarios: int = 3
        params: dict[str, Any] = Field(default_factory=lambda: {"temperature": 0.9, "max_tokens": 1500})

    async def apply(self, row: Row) -> None:
        setups = self.alive(row, "setup")
        if not setups:
            self.count(row, 0, 0)
            return
        s = setups[0]
        fields = dict(row.fields, policy=s.parsed["policy"], tool_list=tool_list(s.parsed["tools"]), n_scenarios=self.cfg.n_scenarios)
        res = await ask(self, row, self.cfg.teacher, [{"role": "user", "content": render(self.cfg.template, fields)}],
                        "scenarios", params=self.cfg.params)
        try:
            start, end = res.content.find("["), res.content.rfind("]")
            items = json.loads(res.content[start:end + 1]) if 0 <= start < end else None
            if not isinstance(items, list):
                raise ValueError("no JSON array")
        except (json.JSONDecodeError, ValueError) as e:
            c = add_candidate(self, row, "scenario", res.content, self.cfg.teacher, self.cfg.params, res,
                              request_seed(self, row, "scenarios"))
            self.reject(row, c, f"scenarios are not a JSON array ({e})")
            self.count(row, 1, 0)
            return
        kept = 0
        for sc in items[: self.cfg.n_scenarios]:
            c = add_candidate(self, row, "scenario", json.dumps(sc, ensure_ascii=False, sort_keys=True), self.cfg.teacher,
                              self.cfg.params, res, request_seed(self, row, "scenarios"), scenario=sc)
            problems = scenario_problems(sc, s.parsed["tools"])
            if problems:
                self.reject(row, c, "; ".join(problems[:3]))
            else:
                kept += 1
        self.count(row, min(len(items), self.cfg.n_scenarios), kept)


class CsRollouts(Step):
    """k simulated conversations per scenario (agent, customer, environment), each its own seeds."""

    class Config(SimCfg):
        k: int = 16
        max_user_turns: int = 4
        customer_template: str = CUSTOMER_PROMPT
        agent_preamble: str = AGENT_PREAMBLE
        turn_judge: bool = False

    async def apply(self, row: Row) -> None:
        setups = self.alive(row, "setup")
        scenarios = self.alive(row, "scenario")
        if not setups or not scenarios:
            self.count(row, 0, 0)
            return
        policy, tools = setups[0].parsed["policy"], setups[0].parsed["tools"]
        protocol, _ = await resolve_tool_protocol(self, self.cfg.tool_protocol, self.cfg.assistant)
        system = system_prompt(protocol, render(self.cfg.agent_preamble, dict(row.fields, policy=policy)), tools)

        async def one(sc_c: Any, r: int) -> tuple[Any, int, tool_sim.SimResult]:
            sc = sc_c.parsed["scenario"]

            async def customer(messages: list[dict[str, Any]], turn: int, k: tuple) -> str | None:
                prompt = render(self.cfg.customer_template, dict(row.fields, **sc, transcript=tool_sim.transcript(messages) or "(none yet)"))
                text = (await ask(self, row, self.cfg.user, [{"role": "user", "content": prompt}], "customer", sc_c.index, r, *k,
                                  params=self.cfg.user_params)).content.strip()
                return None if not text or "[DONE]" in text else text.strip('"')

            first = await customer([], 0, (0,))
            fns = sim_callables(self, row, self.cfg, tools, lambda msgs: sc["inquiry"], (sc_c.index, r),
                                tool_context=f"Facts of this case (keep results consistent with them): {sc['background']}",
                                followup=customer, protocol=protocol)
            opts = tool_sim.SimOptions(max_steps_per_turn=self.cfg.max_steps_per_turn, user_turns=self.cfg.max_user_turns,
                                       tool_result_role=self.cfg.tool_result_role, turn_judge=self.cfg.turn_judge,
                                       stop_on_violation=self.cfg.stop_on_violation, protocol=protocol)
            if first is None:
                return sc_c, r, tool_sim.SimResult([], ok=False, reason="the customer wrote no first message")
            return sc_c, r, await tool_sim.simulate(tools=tools, system=system, first_user=first, opts=opts, **fns)

        results = await asyncio.gather(*(one(sc_c, r) for sc_c in scenarios for r in range(self.cfg.k)))
        completed = 0
        for sc_c, r, sim in results:
            for stage, (a, b) in sim.stage_counts.items():
                count_stage(row, f"{self.name}.{stage}", a, b)
            add_candidate(self, row, "rollout", json.dumps(sim.messages, ensure_ascii=False), self.cfg.assistant,
                              self.cfg.assistant_params, None, request_seed(self, row, "assistant", sc_c.index, r),
                              scenario_idx=sc_c.index, rollout_idx=r, messages=sim.messages, sim_ok=sim.ok,
                              sim_reason=sim.reason, schema_violations=sim.schema_violations, success=False,
                              tool_protocol=protocol)
            completed += int(sim.ok)
        # a failed simulation is a failed attempt, not a removed one: every rollout stays for the count
        self.count(row, len(results), completed)


class CsVerify(Step):
    """Outcome- and process-level judges plus the expected tool calls decide each rollout's success."""

    class Config(StepCfg):
        judge: JudgeParams = Field(default_factory=JudgeParams)
        outcome_template: str = OUTCOME_JUDGE_PROMPT
        process_template: str = PROCESS_JUDGE_PROMPT
        require_expected_actions: bool = True

    async def apply(self, row: Row) -> None:
        setups = self.alive(row, "setup")
        rollouts = self.alive(row, "rollout")
        if not setups:
            self.count(row, len(rollouts), 0)
            return
        policy, tools = setups[0].parsed["policy"], setups[0].parsed["tools"]
        scen = {c.index: c.parsed["scenario"] for c in row.candidates.get("scenario", []) if "scenario" in c.parsed}

        async def verify(c: Any) -> None:
            sc = scen[c.parsed["scenario_idx"]]
            if not c.parsed["sim_ok"]:
                c.parsed.update(outcome={"pass": False, "reason": "not judged"}, process={"pass": False, "reason": "not judged"})
                c.parsed["failure"] = c.parsed["sim_reason"]
                return
            fields = dict(row.fields, **sc, policy=policy, transcript=tool_sim.transcript(c.parsed["messages"]),
                          tool_names=", ".join(t["function"]["name"] for t in tools))
            (ov, ow), (pv, pw) = await asyncio.gather(
                judge_pass_fail(self, row, self.cfg.judge, render(self.cfg.outcome_template, fields), "outcome", c.index),
                judge_pass_fail(self, row, self.cfg.judge, render(self.cfg.process_template, fields), "process", c.index))
            missing = tool_sim.expected_actions_met(c.parsed["messages"], sc.get("expected_actions") or []) \
                if self.cfg.require_expected_actions else []
            c.parsed.update(outcome={"pass": bool(ov), "reason": ow}, process={"pass": bool(pv), "reason": pw},
                            missing_actions=missing)
            c.parsed["success"] = bool(ov) and bool(pv) and not missing
            if not c.parsed["success"]:
                c.parsed["failure"] = ("outcome judge: " + ow if not ov else "process judge: " + pw if not pv
                                       else "expected tool calls not made: " + ", ".join(missing))

        await asyncio.gather(*(verify(c) for c in rollouts))
        n_ok = sum(1 for c in rollouts if c.parsed["success"])
        count_stage(row, f"{self.name}.outcome", sum(c.parsed["sim_ok"] for c in rollouts),
                    sum(1 for c in rollouts if c.parsed["outcome"]["pass"]))
        count_stage(row, f"{self.name}.process", sum(c.parsed["sim_ok"] for c in rollouts),
                    sum(1 for c in rollouts if c.parsed["process"]["pass"]))
        self.count(row, len(rollouts), n_ok)


class CsSelect(Step):
    """Keep scenarios solved by some but not all k rollouts; emit their successful rollouts."""

    class Config(StepCfg):
        pass

    async def apply(self, row: Row) -> None:
        setups = self.alive(row, "setup")
        by_sc: dict[int, list[Any]] = {}
        for c in row.candidates.get("rollout", []):
            by_sc.setdefault(c.parsed["scenario_idx"], []).append(c)
        kept = 0
        scen = {c.index: c for c in row.candidates.get("scenario", [])}
        for idx, rolls in sorted(by_sc.items()):
            k, s = len(rolls), sum(1 for c in rolls if c.parsed.get("success"))
            if s == 0 or s == k:
                why = f"scenario solved {s}/{k} times: " + ("never" if s == 0 else "always")
                for c in rolls:
                    if c.alive:
                        self.reject(row, c, why)
                continue
            kept += 1
            policy, tools = setups[0].parsed["policy"], setups[0].parsed["tools"]
            for c in rolls:
                if not c.parsed.get("success"):
                    if c.alive:
                        self.reject(row, c, c.parsed.get("failure") or "failed")
                    continue
                meta = {"domain": row.fields["domain"], "subdomain": row.fields.get("subdomain"), "policy": policy,
                        "tool_protocol": c.parsed.get("tool_protocol"), "scenario": scen[idx].parsed["scenario"], "scenario_idx": idx,
                        "rollout_idx": c.parsed["rollout_idx"], "k": k, "successes": s, "pass_rate": s / k,
                        "outcome_judgement": c.parsed["outcome"], "process_judgement": c.parsed["process"],
                        "schema_violations": len(c.parsed["schema_violations"])}
                msgs = [{"role": "system", "content": policy}] + c.parsed["messages"]
                verification = Verification(method="outcome+process judges+expected calls", verdict=True, score=s / k,
                                            rule=f"0 < successes ({s}) < k ({k})")
                row.records.append(build_record(self, row, ("rollout", idx, c.parsed["rollout_idx"]), msgs, teacher=c.teacher,
                                                verification=verification, meta=meta, category="tool_calling", tools=tools))
        self.count(row, len(by_sc), kept)


for _kind, _cls in (("tool_query", ToolQuery), ("tool_query_gate", ToolQueryGate), ("tool_simulate", ToolSimulate),
                    ("tool_rules", ToolRules), ("tool_trajectory_judge", ToolTrajectoryJudge),
                    ("format_tool_use", FormatToolUse), ("cs_subdomain", CsSubdomain), ("cs_policy_tools", CsPolicyTools),
                    ("cs_scenarios", CsScenarios), ("cs_rollouts", CsRollouts), ("cs_verify", CsVerify),
                    ("cs_select", CsSelect)):
    register_step(_kind)(_cls)
