"""The client against llama.cpp's server (llama-cpp-python from .venv-llamacpp, the GGUF teacher
itself). Slow, and optional: `make llamacpp-env` builds it (~4 min source build); skipped without."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from synth.client import ChatClient, ChatRequest, TeacherConfig
from synth.servers import default_spec, start_server

pytestmark = pytest.mark.slow


def test_client_against_llamacpp_server(tmp_path):
    spec = default_spec("llamacpp", served_name="teacher")
    if not Path(spec.python).exists():
        pytest.skip("llama.cpp's server is not built: `make llamacpp-env`")
    with start_server(spec, log_dir=tmp_path) as srv:
        assert srv.ready_s is not None and srv.ready_s < 60
        cfg = TeacherConfig(model="teacher", endpoints=[srv.base_url], engine="llama.cpp",
                            constrained_output="json_object", initial_concurrency=2)
        q = [{"role": "user", "content": "Name a colour. Reply as JSON."}]
        schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}

        async def go():
            async with ChatClient(cfg) as c:
                await c.wait_ready(timeout_s=10)
                plain = await asyncio.gather(*(c.complete(ChatRequest(q, {"temperature": 0.8, "max_tokens": 24}, seed=s))
                                               for s in (1, 1, 2)))
                js = await c.complete(ChatRequest(q, {"temperature": 0.0, "max_tokens": 48}, seed=0, json_schema=schema))
                return plain, js
        plain, js = asyncio.run(go())
        assert plain[0].content == plain[1].content and plain[0].completion_tokens > 0
        import json
        assert "colour" in json.loads(js.content)
