"""Conversational tool use, customer service (Nemotron 3 Super §3.1.1; spec §2.12), the
`tool_use_conversational.yaml` pipeline.

The specialized conversational pipeline (`tool_use_conversational.yaml`), per seed domain:
  cs_subdomain -> cs_policy_tools (generation, self-refinement on failed checks, a few-shot
  LLM judge) -> cs_scenarios -> cs_rollouts (k simulated customer-service conversations per
  scenario) -> cs_verify (outcome- and process-level judges plus the expected tool calls) ->
  cs_select (keep scenarios solved neither always nor never; emit their successful rollouts).

The simulation itself (agent, customer, environment; native or prompted tool calls) is
`synth.domains.tool_use`'s.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, Iterator

from jsonschema import Draft202012Validator
from pydantic import Field

from purokit.config import StrictModel
from purokit.records import Verification
from synth.domains import tool_sim
from synth.domains.seeds import load_domains
from synth.domains.tool_use import SimCfg, resolve_tool_protocol, sim_callables, system_prompt, tool_list
from synth.domains.tool_validate import MAX_TOOLS_PER_TASK, tool_definition_problems
from synth.pipeline import Row, Step, register_source, register_step, render, sampling_config
from synth.steps import JudgeParams, judge_candidate, judge_pass_fail


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

@register_step("cs_subdomain")
class CsSubdomain(Step):
    """Progressive sub-domain sampling: the teacher specializes the seed domain."""

    Config = sampling_config("designer", SUBDOMAIN_PROMPT, temperature=1.0, max_tokens=30)

    async def apply(self, row: Row) -> None:
        res = await self.ask_template(row, row.fields, "subdomain")
        name = res.content.strip().splitlines()[0].strip(" .\"'*#-") if res.content.strip() else ""
        ok = 1 <= len(name.split()) <= 8
        row.fields["subdomain"] = name if ok else row.fields["subdomain_examples"].split(",")[0].strip()
        self.count(row, 1, 1 if ok else 0)
        if not ok:
            row.rejects.append({"prompt_id": row.id, "step": self.name, "reason": f"unusable sub-domain {res.content[:80]!r}; "
                                "fell back to the first seed sub-domain", "level": "note"})


@register_step("cs_policy_tools")
class CsPolicyTools(Step):
    """Policy and tools: generated, refined on failed checks, then judged (few-shot) for quality."""

    class Config(sampling_config("designer", POLICY_TOOLS_PROMPT, temperature=0.7, max_tokens=1500)):
        refine_template: str = REFINE_PROMPT
        judge_template: str = SETUP_JUDGE_PROMPT
        judge: JudgeParams = Field(default_factory=JudgeParams)
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
            res = await self.ask_template(row, fields, "setup", 0)
            text = res.content
            policy, tools, problems = parse_setup(text, self.cfg.min_tools, self.cfg.max_tools)
            rounds = 0
            while problems and rounds < self.cfg.refine_rounds:
                rounds += 1
                prompt = render(self.cfg.refine_template, dict(fields, draft=text, problems="; ".join(problems[:6])))
                res = await self.ask(row, self.cfg.teacher, [{"role": "user", "content": prompt}], "setup", rounds,
                                params=self.cfg.params)
                text = res.content
                policy, tools, problems = parse_setup(text, self.cfg.min_tools, self.cfg.max_tools)
        c = self.add_candidate(row, "setup", text, self.cfg.teacher, self.cfg.params, None, self.request_seed(row, "setup", rounds),
                          policy=policy, tools=tools, refine_rounds=rounds)
        if problems:
            self.reject(row, c, "; ".join(problems[:4]))
            self.count(row, 1, 0)
            return
        example = next((d for d in load_domains() if d.id == self.cfg.example_domain and d.policy), None)
        prompt = render(self.cfg.judge_template, dict(fields, policy=policy, tool_names=", ".join(t["function"]["name"] for t in tools),
                                                      example_policy=example.policy if example else "(none)",
                                                      example_tools=", ".join(t["function"]["name"] for t in (example.tools or [])) if example else ""))
        await self.keep(row, [c], lambda c: judge_candidate(self, row, self.cfg.judge, prompt, c, "setup_judgement", "setup judge",
                                                            "setup_judge"))


@register_step("cs_scenarios")
class CsScenarios(Step):
    class Config(sampling_config("designer", SCENARIO_PROMPT, temperature=0.9, max_tokens=1500)):
        n_scenarios: int = 3

    async def apply(self, row: Row) -> None:
        s = self.first_alive(row, "setup")
        if s is None:
            return
        fields = dict(row.fields, policy=s.parsed["policy"], tool_list=tool_list(s.parsed["tools"]), n_scenarios=self.cfg.n_scenarios)
        res = await self.ask_template(row, fields, "scenarios")
        try:
            start, end = res.content.find("["), res.content.rfind("]")
            items = json.loads(res.content[start:end + 1]) if 0 <= start < end else None
            if not isinstance(items, list):
                raise ValueError("no JSON array")
        except (json.JSONDecodeError, ValueError) as e:
            c = self.add_candidate(row, "scenario", res.content, self.cfg.teacher, self.cfg.params, res,
                              self.request_seed(row, "scenarios"))
            self.reject(row, c, f"scenarios are not a JSON array ({e})")
            self.count(row, 1, 0)
            return
        cands = [self.add_candidate(row, "scenario", json.dumps(sc, ensure_ascii=False, sort_keys=True), self.cfg.teacher,
                                    self.cfg.params, res, self.request_seed(row, "scenarios"), scenario=sc)
                 for sc in items[: self.cfg.n_scenarios]]
        await self.keep(row, cands, lambda c: "; ".join(scenario_problems(c.parsed["scenario"], s.parsed["tools"])[:3]) or None)


@register_step("cs_rollouts")
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
                text = (await self.ask(row, self.cfg.user, [{"role": "user", "content": prompt}], "customer", sc_c.index, r, *k,
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
                self.count(row, a, b, stage=stage)
            self.add_candidate(row, "rollout", json.dumps(sim.messages, ensure_ascii=False), self.cfg.assistant,
                              self.cfg.assistant_params, None, self.request_seed(row, "assistant", sc_c.index, r),
                              scenario_idx=sc_c.index, rollout_idx=r, messages=sim.messages, sim_ok=sim.ok,
                              sim_reason=sim.reason, schema_violations=sim.schema_violations, success=False,
                              tool_protocol=protocol)
            completed += int(sim.ok)
        # a failed simulation is a failed attempt, not a removed one: every rollout stays for the count
        self.count(row, len(results), completed)


@register_step("cs_verify")
class CsVerify(Step):
    """Outcome- and process-level judges plus the expected tool calls decide each rollout's success."""

    class Config(StrictModel):
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
        n_judged = sum(c.parsed["sim_ok"] for c in rollouts)
        for stage in ("outcome", "process"):
            self.count(row, n_judged, sum(1 for c in rollouts if c.parsed[stage]["pass"]), stage=stage)
        self.count(row, len(rollouts), n_ok)


@register_step("cs_select")
class CsSelect(Step):
    """Keep scenarios solved by some but not all k rollouts; emit their successful rollouts."""

    class Config(StrictModel):
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
                self.record(row, ("rollout", idx, c.parsed["rollout_idx"]), msgs, teacher=c.teacher,
                                                verification=verification, meta=meta, category="tool_calling", tools=tools)
        self.count(row, len(by_sc), kept)
