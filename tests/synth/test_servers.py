"""Server helpers without starting vLLM: the command line carries the CPU workarounds; a live
server is reused; a missing environment says which make target builds it."""

from __future__ import annotations

import pytest

from synth.servers import ServerError, ServerSpec, default_spec, ensure_server, server_command, start_server


def test_vllm_command_carries_the_cpu_workarounds():
    spec = default_spec("vllm", model="/m", served_name="mine", python="/venv/bin/python")
    cmd, env = server_command(spec, 8123)
    assert cmd[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]      # not the broken script
    for flag in ("--enforce-eager", "--no-enable-chunked-prefill", "--structured-outputs-config"):
        assert flag in cmd
    assert cmd[cmd.index("--served-model-name") + 1] == "mine" and cmd[cmd.index("--port") + 1] == "8123"
    assert env["VLLM_HOST_IP"] == "127.0.0.1" and env["VLLM_NO_USAGE_STATS"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert "VIRTUAL_ENV" not in env and env["PATH"].startswith("/venv/bin")
    cmd, _ = server_command(ServerSpec(kind="llamacpp", python="/p", model="/m.gguf"), 9)
    assert "llama_cpp.server" in cmd and cmd[cmd.index("--model_alias") + 1] == "teacher"


def test_ensure_server_reuses_a_live_one_and_restarts_from_the_spec(fake_server, tmp_path):
    srv = fake_server(model="teacher")
    spec = ServerSpec(kind="vllm", python=str(tmp_path / "no-venv" / "python"), model=str(tmp_path))
    described = {"base_url": srv.base_url, "model": "teacher", "spec": spec.to_json()}
    assert ensure_server(described) == (srv.base_url, None)
    gone = dict(described, base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ServerError, match="make vllm-env"):
        ensure_server(gone)
    with pytest.raises(ServerError, match="make llamacpp-env"):
        start_server(ServerSpec(kind="llamacpp", python=str(tmp_path / "x"), model=str(tmp_path)))


def test_tool_parser_flags_and_the_tool_aware_teacher_template(tmp_path):
    spec = default_spec("vllm", served_name="t", python="/venv/bin/python", tool_parser="hermes")
    cmd, _ = server_command(spec, 8000)
    assert "--enable-auto-tool-choice" in cmd and cmd[cmd.index("--tool-call-parser") + 1] == "hermes"
    assert cmd[cmd.index("--chat-template") + 1].endswith("synth/templates/smollm2_tools.jinja")
    assert "--tool-call-parser" not in server_command(default_spec("vllm", python="/p"), 1)[0]
    own = default_spec("vllm", model="/qwen3", python="/p", tool_parser="hermes")     # a model with its own template
    assert own.chat_template is None and "--chat-template" not in server_command(own, 1)[0]
    assert ServerSpec.from_json({k: v for k, v in own.to_json().items() if k not in ("tool_parser", "chat_template")}).tool_parser is None
    with pytest.raises(ServerError, match="vLLM options"):
        start_server(ServerSpec(kind="llamacpp", python="/p", model="/m", tool_parser="hermes"))


SMOLLM2_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
                    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
                    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
                    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _render(template: str, **kw) -> str:
    """As transformers renders chat templates (sandboxed, trim_blocks, lstrip_blocks, tojson)."""
    import json

    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **k: json.dumps(x, ensure_ascii=False, **k)
    return env.from_string(template).render(**kw)


def test_smollm2_tools_template_renders_as_smollm2_without_tools_and_hermes_with_them():
    from synth.servers import SMOLLM2_TOOLS_TEMPLATE
    tmpl = SMOLLM2_TOOLS_TEMPLATE.read_text()
    for msgs in ([{"role": "user", "content": "hi"}],
                 [{"role": "system", "content": "detailed thinking on"}, {"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}]):
        for gen in (False, True):
            assert _render(tmpl, messages=msgs, add_generation_prompt=gen) == _render(SMOLLM2_TEMPLATE, messages=msgs,
                                                                                       add_generation_prompt=gen)
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    msgs = [{"role": "user", "content": "Oslo?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"t": 3}'}]
    out = _render(tmpl, messages=msgs, tools=[tool], add_generation_prompt=True)
    assert out.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\n\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}\n</tools>' in out
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n'
            '<|im_start|>user\n<tool_response>\n{"t": 3}\n</tool_response><|im_end|>\n<|im_start|>assistant\n') in out


def test_a_server_interrupted_while_starting_is_stopped(tmp_path, monkeypatch):
    import os
    import time

    from synth import servers
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\nexec sleep 120\n")
    fake_python.chmod(0o755)
    started = []

    def interrupted(self, timeout_s=None, poll_s=0.5):
        started.append(self.proc.pid)
        raise KeyboardInterrupt

    monkeypatch.setattr(servers.RunningServer, "wait_ready", interrupted)
    with pytest.raises(KeyboardInterrupt):
        start_server(ServerSpec(kind="llamacpp", python=str(fake_python), model=str(tmp_path)), log_dir=tmp_path)
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(started[0], 0)
