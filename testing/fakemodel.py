"""A scripted model server on loopback, for driving real coding-agent clients without a real model.

The client under test (Claude Code, Codex CLI, Gemini CLI) is pointed at it with its base-URL setting; every
request that offers the script's next tool gets that tool call as the answer, and the next request carries
the tool's result: what the model would see. That text is recorded (``FakeModel.seen``), so a test reads
exactly what a model would have been told (a refusal, a post-shell report, a command's output).

Protocols: Anthropic Messages (``/v1/messages``, streaming SSE or not), OpenAI Responses (``/v1/responses``,
streaming) and Gemini (``:generateContent`` / ``:streamGenerateContent``). A request that offers none of the
script's tools (a title, a summary, a quota probe) is answered with a short text. Standard library only.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Step:
    """One tool call the model makes: ``tool`` (the client's name for it), its ``args``; ``names``: other
    names the same tool may be offered under (a client's aliases)."""

    def __init__(self, tool: str, args: dict[str, Any], *names: str) -> None:
        self.tool, self.args, self.names = tool, args, (tool, *names)


class FakeModel:
    def __init__(self, steps: list[Step], final: str = "done") -> None:
        self.steps = list(steps)
        self.final = final
        self.seen: list[str] = []  # each tool result the client sent back, in order
        self.requests: list[dict[str, Any]] = []
        self.calls = 0
        self.gaps: list[float] = []  # seconds from a tool call sent to the request carrying its result
        self._sent: float | None = None
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeModel:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------------------ the script

    def next_step(self, offered: set[str], body: dict[str, Any] | None = None) -> Step | None | bool:
        """The step to answer with; None when the script is done; False when this request offers none of the
        script's tools (a side request). A tool the client loads on demand (Claude Code's deferred MCP tools,
        fetched with ToolSearch) counts as offered once the request names it anywhere."""
        with self.lock:
            if not self.steps:
                return None if offered else False
            step = self.steps[0]
            hit = next((n for n in step.names if n in offered), None)
            if hit is None and offered and body is not None and step.tool.startswith("mcp__"):
                hit = step.tool if step.tool in json.dumps(body) else None
            if hit is None:
                return False
            self.steps.pop(0)
            self.calls += 1
            return Step(hit, step.args)

    def record(self, texts: list[str]) -> None:
        with self.lock:
            self.seen.extend(texts)
            if texts and self._sent is not None:
                self.gaps.append(time.monotonic() - self._sent)
                self._sent = None

    def sent(self, was_call: bool) -> None:
        if was_call:
            self._sent = time.monotonic()

    def _handler(self):
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # model listings and the like
                self._json({"data": [], "models": []})

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {}
                model.requests.append({"path": self.path, "body": body})
                path = self.path.split("?")[0]
                if path.endswith("/messages/count_tokens"):
                    return self._json({"input_tokens": 10})
                if path.endswith("/messages"):
                    return anthropic(self, model, body)
                if path.endswith("/responses"):
                    return responses(self, model, body)
                if ":generateContent" in path or ":streamGenerateContent" in path:
                    return gemini(self, model, body, stream=":streamGenerateContent" in path)
                if path.endswith(":countTokens"):
                    return self._json({"totalTokens": 10})
                self._json({})

            def _json(self, doc: Any, status: int = 200) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def sse(self, events: list[tuple[str | None, Any]]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                for name, data in events:
                    chunk = (f"event: {name}\n" if name else "") + f"data: {json.dumps(data)}\n\n"
                    self.wfile.write(chunk.encode())
                    self.wfile.flush()
                self.close_connection = True

        return Handler


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text_of(c.get("text", c.get("content", ""))) for c in content if isinstance(c, dict))
    return ""


# ---------------------------------------------------------------------------------- Anthropic


def anthropic(h, model: FakeModel, body: dict[str, Any]) -> None:
    offered = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    if last.get("role") == "user" and isinstance(last.get("content"), list):
        model.record([_text_of(b.get("content")) for b in last["content"] if b.get("type") == "tool_result"])
    step = model.next_step(offered, body)
    mid = f"msg_{int(time.time() * 1000)}_{model.calls}"
    if isinstance(step, Step):
        block = {"type": "tool_use", "id": f"toolu_{model.calls:04d}", "name": step.tool, "input": step.args}
        stop = "tool_use"
    else:
        block = {"type": "text", "text": model.final if step is None else "ok"}
        stop = "end_turn"
    usage = {"input_tokens": 10, "output_tokens": 5}
    message = {"id": mid, "type": "message", "role": "assistant", "model": body.get("model", "fake"), "usage": usage}
    if not body.get("stream"):
        h._json(dict(message, content=[block], stop_reason=stop, stop_sequence=None))
        return model.sent(isinstance(step, Step))
    if block["type"] == "tool_use":
        start = dict(block, input={})
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    else:
        start = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": block["text"]}
    h.sse(
        [
            ("message_start", {"type": "message_start", "message": dict(message, content=[], stop_reason=None)}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 5}}),
            ("message_stop", {"type": "message_stop"}),
        ]
    )
    model.sent(isinstance(step, Step))


# ---------------------------------------------------------------------------------- OpenAI Responses


def responses(h, model: FakeModel, body: dict[str, Any]) -> None:
    offered = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
    items = body.get("input") or []
    tail: list[str] = []
    context: list[str] = []  # Codex hands a hook's additional context as a developer message next to the output
    for item in reversed(items if isinstance(items, list) else []):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "message" and item.get("role") == "developer":
            context.append(_text_of(item.get("content")))
            continue
        if kind not in ("function_call_output", "custom_tool_call_output"):
            break
        out = item.get("output")
        tail.append(out if isinstance(out, str) else _text_of(out.get("content") if isinstance(out, dict) else out))
    if tail and context:
        tail[0] += "\n" + "\n".join(reversed(context))
    model.record(list(reversed(tail)))
    step = model.next_step(offered)
    rid = f"resp_{int(time.time() * 1000)}_{model.calls}"
    if isinstance(step, Step):
        kind = next((t.get("type") for t in body.get("tools") or [] if t.get("name") == step.tool), "function")
        if kind == "custom":
            item = {"type": "custom_tool_call", "id": f"ctc_{model.calls}", "call_id": f"call_{model.calls}",
                    "name": step.tool, "input": step.args["input"], "status": "completed"}  # fmt: skip
        else:
            item = {"type": "function_call", "id": f"fc_{model.calls}", "call_id": f"call_{model.calls}",
                    "name": step.tool, "arguments": json.dumps(step.args), "status": "completed"}  # fmt: skip
    else:
        text = model.final if step is None else "ok"
        item = {"type": "message", "id": f"msg_{model.calls}", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip
    usage = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
    usage.update(input_tokens_details={"cached_tokens": 0}, output_tokens_details={"reasoning_tokens": 0})
    resp = {"id": rid, "object": "response", "status": "completed", "model": body.get("model"), "output": [item]}
    h.sse(
        [
            (None, {"type": "response.created", "response": dict(resp, status="in_progress", output=[])}),
            (None, {"type": "response.output_item.added", "output_index": 0, "item": item}),
            (None, {"type": "response.output_item.done", "output_index": 0, "item": item}),
            (None, {"type": "response.completed", "response": dict(resp, usage=usage)}),
        ]
    )
    model.sent(isinstance(step, Step))


# ---------------------------------------------------------------------------------- Gemini


def gemini(h, model: FakeModel, body: dict[str, Any], *, stream: bool) -> None:
    offered = set()
    for tool in body.get("tools") or []:
        for decl in tool.get("functionDeclarations") or tool.get("function_declarations") or []:
            offered.add(decl.get("name"))
    contents = body.get("contents") or []
    last = contents[-1] if contents else {}
    texts = []
    for part in last.get("parts") or []:
        resp = part.get("functionResponse") if isinstance(part, dict) else None
        if resp:
            texts.append(json.dumps(resp.get("response")))
    model.record(texts)
    step = model.next_step(offered)
    if isinstance(step, Step):
        part = {"functionCall": {"name": step.tool, "args": step.args}}
    else:
        part = {"text": model.final if step is None else "ok"}
    doc = {
        "candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        "modelVersion": "fake",
    }
    if stream:
        h.sse([(None, doc)])
    else:
        h._json(doc)
    model.sent(isinstance(step, Step))


__all__ = ["FakeModel", "Step"]
