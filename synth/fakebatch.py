"""The OpenAI Batch API on the scripted fake server: `/v1/files` and `/v1/batches`, as the real
service speaks them, so the `batch` backend is tested over the protocol with the official client.

- `POST /v1/files` (multipart: `purpose=batch`, `file`) stores a file; `GET /v1/files/{id}` and
  `/v1/files/{id}/content` read it back.
- `POST /v1/batches` (`input_file_id`, `endpoint`, `completion_window`, `metadata`) validates the
  input file (JSON lines, unique `custom_id`, `method: POST`, `url` = the batch's endpoint, one
  model): a bad file gives status `failed` with `errors.data[]` naming the line.
- `GET /v1/batches/{id}` moves a batch one status on per poll: validating -> in_progress ->
  finalizing -> completed (`hold` keeps batches in_progress until released). On finalizing every
  line is answered by the server's chat path (faults, model and tool checks included): a 200 goes
  to the output file, anything else to the error file as `{"response": {"status_code", "body"}}`.
  With `expire_after` lines, the batch ends `expired` instead: lines past that count get the
  `batch_expired` error, as the real service reports requests the window did not reach.
- `GET /v1/batches` lists them (newest first), `POST /v1/batches/{id}/cancel` cancels.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from typing import Any, Callable

LineAnswer = Callable[[dict[str, Any], bytes], "tuple[int, dict[str, Any]]"]

STEPS = {"validating": "in_progress", "in_progress": "finalizing", "finalizing": "completed"}


def parse_multipart(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """name -> (filename, bytes) of a multipart/form-data body."""
    boundary = next((p.split("=", 1)[1].strip('"') for p in content_type.split(";") if p.strip().startswith("boundary=")),
                    None)
    if boundary is None:
        raise ValueError("multipart body without a boundary")
    parts: dict[str, tuple[str | None, bytes]] = {}
    for chunk in body.split(b"--" + boundary.encode())[1:]:
        if chunk.startswith(b"--"):
            break
        head, _, data = chunk.lstrip(b"\r\n").partition(b"\r\n\r\n")
        disp = next((ln for ln in head.decode("latin-1").split("\r\n") if ln.lower().startswith("content-disposition")), "")
        fields = dict(p.strip().split("=", 1) for p in disp.split(";")[1:] if "=" in p)
        name = fields.get("name", "").strip('"')
        filename = fields["filename"].strip('"') if "filename" in fields else None
        parts[name] = (filename, data[:-2] if data.endswith(b"\r\n") else data)
    return parts


def _id(prefix: str, *parts: Any) -> str:
    return prefix + hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:24]


def validate_batch_input(data: bytes, endpoint: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(request lines, errors) of a batch input file, with the real service's checks."""
    lines, errors, seen, models = [], [], set(), set()
    for n, raw in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except json.JSONDecodeError as e:
            errors.append({"code": "invalid_json_line", "message": f"line is not JSON: {e}", "line": n, "param": None})
            continue
        cid = line.get("custom_id") if isinstance(line, dict) else None
        if not isinstance(cid, str) or not cid:
            errors.append({"code": "missing_required_parameter", "message": "custom_id is required", "line": n,
                           "param": "custom_id"})
        elif cid in seen:
            errors.append({"code": "duplicate_custom_id", "message": f"custom_id {cid!r} is not unique", "line": n,
                           "param": "custom_id"})
        elif line.get("method") != "POST" or line.get("url") != endpoint or not isinstance(line.get("body"), dict):
            errors.append({"code": "invalid_request", "message": f"expected method POST, url {endpoint} and a body",
                           "line": n, "param": "url"})
        else:
            seen.add(cid)
            models.add(line["body"].get("model"))
            lines.append(line)
    if len(models) > 1:
        errors.append({"code": "mismatched_model", "message": f"one model per batch (got {sorted(map(str, models))})",
                       "line": None, "param": "body.model"})
    return lines, errors


class BatchService:
    """Files and batches of one fake server; `answer(body, raw) -> (status, response body)` is the
    server's chat path."""

    def __init__(self, answer: LineAnswer):
        self.answer = answer
        self.files: dict[str, dict[str, Any]] = {}
        self.contents: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.hold = False                    # keep batches in_progress (a test kills the client meanwhile)
        self.expire_after: int | None = None  # lines answered before a batch's window runs out
        self._lock = threading.Lock()

    # ---- files ------------------------------------------------------------------------------
    def add_file(self, data: bytes, filename: str, purpose: str) -> dict[str, Any]:
        with self._lock:
            fid = _id("file-", filename, len(self.files), time.time())
            meta = {"id": fid, "object": "file", "bytes": len(data), "created_at": int(time.time()),
                    "filename": filename, "purpose": purpose, "status": "processed"}
            self.files[fid], self.contents[fid] = meta, data
        return meta

    def upload(self, content_type: str, body: bytes) -> tuple[int, dict[str, Any]]:
        try:
            parts = parse_multipart(content_type, body)
        except ValueError as e:
            return 400, {"error": {"message": str(e), "type": "invalid_request_error"}}
        if "file" not in parts or "purpose" not in parts:
            return 400, {"error": {"message": "file and purpose are required", "type": "invalid_request_error"}}
        filename, data = parts["file"]
        return 200, self.add_file(data, filename or "upload.jsonl", parts["purpose"][1].decode())

    # ---- batches ----------------------------------------------------------------------------
    def create(self, req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        fid = req.get("input_file_id")
        if fid not in self.files:
            return 404, {"error": {"message": f"No such File object: {fid}", "type": "invalid_request_error"}}
        if req.get("completion_window") != "24h":
            return 400, {"error": {"message": "completion_window must be '24h'", "type": "invalid_request_error"}}
        now = int(time.time())
        with self._lock:
            bid = _id("batch_", fid, len(self.batches), time.time())
            self.batches[bid] = {
                "id": bid, "object": "batch", "endpoint": req.get("endpoint"), "errors": None, "input_file_id": fid,
                "completion_window": "24h", "status": "validating", "output_file_id": None, "error_file_id": None,
                "created_at": now, "in_progress_at": None, "expires_at": now + 86400, "finalizing_at": None,
                "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
                "cancelled_at": None, "request_counts": {"total": 0, "completed": 0, "failed": 0},
                "metadata": req.get("metadata")}
        return 200, dict(self.batches[bid])

    def retrieve(self, bid: str) -> tuple[int, dict[str, Any]]:
        b = self.batches.get(bid)
        if b is None:
            return 404, {"error": {"message": f"No such Batch object: {bid}", "type": "invalid_request_error"}}
        self._advance(b)
        return 200, dict(b)

    def cancel(self, bid: str) -> tuple[int, dict[str, Any]]:
        b = self.batches.get(bid)
        if b is None:
            return 404, {"error": {"message": f"No such Batch object: {bid}", "type": "invalid_request_error"}}
        if b["status"] in ("validating", "in_progress", "finalizing"):
            b.update(status="cancelled", cancelling_at=int(time.time()), cancelled_at=int(time.time()))
        return 200, dict(b)

    def listing(self) -> dict[str, Any]:
        data = sorted(self.batches.values(), key=lambda b: b["created_at"], reverse=True)
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": False}

    def _advance(self, b: dict[str, Any]) -> None:
        now = int(time.time())
        st = b["status"]
        if st == "validating":
            lines, errors = validate_batch_input(self.contents[b["input_file_id"]], b["endpoint"])
            if errors or not lines:
                errors = errors or [{"code": "empty_file", "message": "the input file has no requests", "line": None,
                                     "param": None}]
                b.update(status="failed", failed_at=now, errors={"object": "list", "data": errors})
                return
            b.update(status="in_progress", in_progress_at=now)
            b["request_counts"]["total"] = len(lines)
        elif st == "in_progress" and not self.hold:
            b.update(status="finalizing", finalizing_at=now)
        elif st == "finalizing":
            self._run(b)

    def _run(self, b: dict[str, Any]) -> None:
        lines, _ = validate_batch_input(self.contents[b["input_file_id"]], b["endpoint"])
        out, err = [], []
        expired = self.expire_after is not None and len(lines) > self.expire_after
        for i, line in enumerate(lines):
            rid = _id("batch_req_", b["id"], i)
            if expired and i >= (self.expire_after or 0):
                err.append({"id": rid, "custom_id": line["custom_id"], "response": None, "error": {
                    "code": "batch_expired",
                    "message": "This request could not be executed before the completion window expired."}})
                continue
            status, body = self.answer(line["body"], json.dumps(line["body"]).encode())
            entry = {"id": rid, "custom_id": line["custom_id"],
                     "response": {"status_code": status, "request_id": _id("req_", rid), "body": body}, "error": None}
            (out if status == 200 else err).append(entry)
        now = int(time.time())
        counts = {"total": len(lines), "completed": len(out), "failed": len(err)}
        upd: dict[str, Any] = {"request_counts": counts}
        if out:
            upd["output_file_id"] = self.add_file("".join(json.dumps(x) + "\n" for x in out).encode(),
                                                  f"{b['id']}_output.jsonl", "batch_output")["id"]
        if err:
            upd["error_file_id"] = self.add_file("".join(json.dumps(x) + "\n" for x in err).encode(),
                                                 f"{b['id']}_error.jsonl", "batch_output")["id"]
        upd.update(status="expired", expired_at=now) if expired else upd.update(status="completed", completed_at=now)
        b.update(upd)
