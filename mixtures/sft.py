"""SFT shards: chat records (contract 6) rendered through a chat template into tokens plus a loss
mask on assistant tokens only, packed into windows, written as a shard set (kind "sft").

    python -m mixtures sft --config sft.yaml --out shards/sft

Rendering. The built-in template is Qwen3-style ChatML: `<|im_start|>{role}\\n{content}<|im_end|>\\n`,
assistant tool calls as `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, tool
results as `<tool_response>` blocks inside a user turn, system prompts such as
`detailed thinking on|off` kept verbatim. A record's tool definitions (contract 6 `tools`; older
records carried them in `meta.tools`) are rendered as Qwen3/Hermes templates do: a system turn
(the record's system prompt, a blank line, then `# Tools` with one JSON definition per line
inside `<tools></tools>` and the calling convention). The targets are every assistant turn's
content, its tool calls and its closing `<|im_end|>` (the model learns to call and to stop);
headers, system (with the tools), user and tool-result text are context.
Any Hugging Face Jinja chat template can be used instead (it gets `messages`, `tools` and
`add_generation_prompt`; tool-call arguments are passed decoded, as transformers expects): each
assistant turn's span is what rendering the conversation up to that turn adds after the
generation prompt, so the template must render prefixes consistently (an error names the record
when it does not).

Packing. Conversations (each followed by EOS, mask 0) are taken in a seeded order and packed
next-fit into windows of `seq_len` tokens starting at multiples of `seq_len`; the rest of a
window is one padding document (pad id, mask 0), and one pad token ends the set. The reader's windows (seq_len + 1 tokens,
advancing by seq_len) then see every conversation whole. Conversations longer than `seq_len`
are quarantined with a reason and counted.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
from pydantic import ConfigDict, Field

from purokit import atomic
from purokit.config import StrictModel
from purokit.errors import ContractError
from purokit.log import get_logger
from purokit.manifest import find_complete, fingerprints
from purokit.records import read_conversations, record_files, record_tools
from mixtures import curriculum as cm
from mixtures.shards import ShardFile, ShardFileWriter, ShardManifest, build_manifest, token_dtype
from mixtures.tokenizers import Tokenizer, TokenizerSpec, load_tokenizer

# record_tools is purokit.records' (contract 6 is read there); named here for callers of this module
__all__ = ["JinjaTemplate", "SftConfig", "encode_segments", "materialize_sft", "record_tools", "render_chatml"]

log = get_logger("mixtures.sft")

SFT_SCHEMA = "sft/1"
PAD_DOC = "<pad>"


class SftConfig(StrictModel):
    """`python -m mixtures sft` config."""

    model_config = ConfigDict(populate_by_name=True)
    schema_: Literal["sft/1"] = Field(default=SFT_SCHEMA, alias="schema")
    name: str = "sft"
    tokenizer: TokenizerSpec
    seq_len: int = Field(gt=1)
    inputs: list[str] = Field(min_length=1)      # jsonl / parquet files, or directories of them
    chat_template: str = "chatml"                 # "chatml", or a Jinja template / tokenizer_config.json path
    seed: int = 0
    shard_tokens: int = Field(default=1 << 30, gt=0)


# ---- rendering ------------------------------------------------------------------------------------

Segment = tuple[str, bool]          # (text, is_target)


TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_FOOTER = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def tools_system_text(system: str | None, tools: list[dict[str, Any]]) -> str:
    """The system turn's text when tools are exposed, as Qwen3/Hermes chat templates write it: the
    system prompt (if any) and a blank line, then the tool definitions, one JSON object per line."""
    head = f"{system}\n\n" if system else ""
    return head + TOOLS_HEADER + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools) + TOOLS_FOOTER


def _tool_call_text(tc: dict[str, Any]) -> str:
    """One call as Qwen3's template writes it: arguments given as JSON text verbatim, decoded
    ones dumped."""
    fn = tc.get("function") or tc
    args = fn.get("arguments")
    args_text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return f'<tool_call>\n{{"name": {json.dumps(fn.get("name"), ensure_ascii=False)}, "arguments": {args_text}}}\n</tool_call>'


def render_chatml(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[Segment]:
    """Qwen3-style ChatML segments with the assistant targets marked; `tools` (OpenAI tool
    definitions) go into the system turn."""
    segs: list[Segment] = []
    i = 0
    if tools:
        system = messages[0].get("content") if messages and messages[0].get("role") == "system" else None
        segs.append((f"<|im_start|>system\n{tools_system_text(system, tools)}<|im_end|>\n", False))
        i = 1 if system is not None else 0
    while i < len(messages):
        m = messages[i]
        role = m.get("role")
        content = m.get("content") or ""
        if role in ("system", "user"):
            segs.append((f"<|im_start|>{role}\n{content}<|im_end|>\n", False))
        elif role == "assistant":
            body = content
            if m.get("reasoning_content"):
                body = f"<think>\n{m['reasoning_content']}\n</think>\n\n" + body
            for tc in m.get("tool_calls") or []:
                body += ("\n" if body else "") + _tool_call_text(tc)
            segs.append(("<|im_start|>assistant\n", False))
            segs.append((body + "<|im_end|>", True))
            segs.append(("\n", False))
        elif role == "tool":
            parts = []
            while i < len(messages) and messages[i].get("role") == "tool":
                parts.append(f"<tool_response>\n{messages[i].get('content') or ''}\n</tool_response>")
                i += 1
            segs.append(("<|im_start|>user\n" + "\n".join(parts) + "<|im_end|>\n", False))
            continue
        else:
            raise ValueError(f"unknown role {role!r}")
        i += 1
    return segs


class JinjaTemplate:
    """A Hugging Face chat template; targets found by rendering prefixes."""

    def __init__(self, source: str):
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        text = source
        path = Path(source) if len(source) < 4096 and "\n" not in source and "{" not in source else None
        if path is not None and path.is_file():
            text = path.read_text(encoding="utf-8")
            if path.suffix == ".json":
                text = json.loads(text).get("chat_template") or ""
                if not text:
                    raise ContractError(path, "has no chat_template", field="chat_template")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(msg: str) -> None:
            raise jinja2.exceptions.TemplateError(msg)

        env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
        env.globals["raise_exception"] = raise_exception
        self.template = env.from_string(text)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False,
               tools: list[dict[str, Any]] | None = None) -> str:
        return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt, tools=tools or None)

    def segments(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[Segment]:
        messages = template_messages(messages)
        full = self.render(messages, tools=tools)
        segs: list[Segment] = []
        pos = 0
        for i, m in enumerate(messages):
            if m.get("role") != "assistant":
                continue
            prompt = self.render(messages[:i], add_generation_prompt=True, tools=tools)
            upto = self.render(messages[:i + 1], tools=tools)
            if not upto.startswith(prompt) or not full.startswith(upto) or len(prompt) < pos:
                raise ValueError("the chat template does not render conversation prefixes consistently "
                                 f"(assistant turn {i}); use chat_template: chatml")
            segs.append((full[pos:len(prompt)], False))
            # the turn's trailing newlines are layout, not something to learn: they stay context
            target = full[len(prompt):len(upto)].rstrip("\n")
            segs.append((target, True))
            pos = len(prompt) + len(target)
        segs.append((full[pos:], False))
        return [s for s in segs if s[0]]


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as Hugging Face chat templates expect them: tool-call arguments decoded (records
    carry them as JSON text, the OpenAI wire format); arguments that are not a JSON object stay text."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = []
            for tc in m["tool_calls"]:
                fn = dict(tc.get("function") or {})
                if isinstance(fn.get("arguments"), str):
                    try:
                        args = json.loads(fn["arguments"])
                    except json.JSONDecodeError:
                        args = None
                    if isinstance(args, dict):
                        fn["arguments"] = args
                calls.append(dict(tc, function=fn))
            m = dict(m, tool_calls=calls)
        out.append(m)
    return out


def encode_segments(tokenizer: Tokenizer, segments: list[Segment]) -> tuple[np.ndarray, np.ndarray]:
    """Tokens (special tokens recognised) and the loss mask of a rendered conversation."""
    ids = tokenizer.encode_batch([s for s, _ in segments], allow_special=True)
    tokens = np.fromiter((t for part in ids for t in part), dtype=np.int64)
    mask = np.concatenate([np.full(len(part), int(target), dtype=np.uint8) for part, (_, target) in zip(ids, segments)]) \
        if ids else np.zeros(0, np.uint8)
    return tokens, mask


# ---- the command ----------------------------------------------------------------------------------

def pack_next_fit(lengths: np.ndarray, seq_len: int) -> np.ndarray:
    """Window index of each conversation, next-fit in the given order (all lengths <= seq_len)."""
    window = np.zeros(lengths.size, dtype=np.int64)
    w, used = 0, 0
    for i, n in enumerate(lengths.tolist()):
        if used + n > seq_len:
            w, used = w + 1, 0
        window[i] = w
        used += n
    return window


def materialize_sft(cfg: SftConfig, out_dir: str | os.PathLike, progress: Callable[[str], None] | None = None,
                    force: bool = False) -> ShardManifest:
    """Render, tokenize, pack and write the SFT shard set; reused when complete for the same config."""
    progress = progress or (lambda m: log.info(m))
    out = Path(out_dir)
    tokenizer = load_tokenizer(cfg.tokenizer)
    files = record_files(cfg.inputs)
    inputs = fingerprints(files)
    config = {"sft": cfg.model_dump(mode="json", by_alias=True)}
    found = None if force else find_complete(out, ShardManifest, config, inputs)
    if found is not None:
        progress(f"{out}: complete from an earlier run (same config and inputs), reused")
        return found
    t0 = time.perf_counter()
    template = None if cfg.chat_template == "chatml" else JinjaTemplate(cfg.chat_template)
    convs: list[tuple[str, np.ndarray, np.ndarray]] = []
    quarantine: dict[str, int] = {}
    for f, i, conv, why in read_conversations(files):
        if conv is not None:
            try:
                segs = template.segments(conv.messages, conv.tools) if template else render_chatml(conv.messages, conv.tools)
                toks, mask = encode_segments(tokenizer, segs)
                toks = np.append(toks, tokenizer.eos_id)
                mask = np.append(mask, 0).astype(np.uint8)
                if toks.size > cfg.seq_len:
                    why = f"longer than seq_len ({toks.size} > {cfg.seq_len} tokens)"
                elif mask.sum() == 0:
                    why = "no assistant tokens after rendering"
            except ValueError as e:
                why = str(e)
        if why is not None:
            key = why.split(" (")[0]
            quarantine[key] = quarantine.get(key, 0) + 1
            continue
        convs.append((conv.id, toks, mask))
    if not convs:
        raise ContractError(files[0] if files else "inputs", f"no trainable SFT records (quarantined: {quarantine})")
    ids = [c[0] for c in convs]
    if len(set(ids)) != len(ids):
        ids = [f"{r}#{j}" for j, r in enumerate(ids)]
    order = cm.seeded_order(cm.doc_keys(ids, cfg.seed, salt="sft"), ids)
    lengths = np.array([convs[j][1].size for j in order], dtype=np.int64)
    window = pack_next_fit(lengths, cfg.seq_len)
    dtype = token_dtype(tokenizer.vocab_size)
    pad_id = tokenizer.identity.pad_id if tokenizer.identity.pad_id is not None else tokenizer.eos_id
    shards: list[ShardFile] = []
    n_pad = 0
    with atomic.atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        part_of_window = (window * cfg.seq_len) // cfg.shard_tokens
        for part in np.unique(part_of_window):
            w = ShardFileWriter(tmp, cm.shard_name("f0000", int(part)), dtype, segment="f0000", with_mask=True,
                                vocab_size=tokenizer.vocab_size)
            sel = np.flatnonzero(part_of_window == part)
            used = 0
            for j, k in enumerate(sel):
                rid, toks, mask = convs[order[k]]
                w.add(toks, ids[order[k]], component="sft", loss_mask=mask)
                used += toks.size
                if j + 1 == len(sel) or window[sel[j + 1]] != window[k]:
                    if used < cfg.seq_len:      # pad the window so the next one starts at a multiple of seq_len
                        w.add(np.full(cfg.seq_len - used, pad_id), PAD_DOC, component="pad",
                              loss_mask=np.zeros(cfg.seq_len - used, np.uint8))
                        n_pad += cfg.seq_len - used
                    used = 0
            if part == part_of_window.max():
                # one more token, so the reader's last window (seq_len + 1 tokens) is complete
                w.add(np.full(1, pad_id), PAD_DOC, component="pad", loss_mask=np.zeros(1, np.uint8))
                n_pad += 1
            shards.append(w.close())
        manifest = build_manifest(shards=shards, tokenizer=tokenizer.identity, seq_len=cfg.seq_len, stream="sft",
                                  job="mixtures.sft", kind="sft", config=config, inputs=inputs,
                                  seeds={"sft.seed": cfg.seed},
                                  counts={"n_conversations": len(convs), "n_pad_tokens": n_pad,
                                          "n_loss_tokens": int(sum(s.n_loss_tokens or 0 for s in shards)),
                                          "quarantined": dict(sorted(quarantine.items()))})
        manifest.write(tmp)
    progress(f"sft: {len(convs):,} conversations, {manifest.n_tokens:,} tokens ({n_pad:,} padding) in "
             f"{len(shards)} shards, {sum(quarantine.values())} quarantined, {time.perf_counter() - t0:.1f}s")
    return manifest
