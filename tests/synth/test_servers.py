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
