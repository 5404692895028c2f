"""A small OpenAI-compatible HTTP server for the LLM-loop tests (127.0.0.1, a thread).

``ScriptedServer(script)``: each POST to /v1/chat/completions takes the next entry of
``script``: ("answer", text), ("status", code), or ("slow", seconds, text). Requests are
kept (``requests``) so a test can read the prompts the tuner sent.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def completion(text: str) -> dict:
    return {"id": "chatcmpl-test", "object": "chat.completion", "created": 0,
            "model": "scripted", "choices": [{"index": 0, "finish_reason": "stop",
                                             "message": {"role": "assistant",
                                                         "content": text}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class ScriptedServer:
    def __init__(self, script: list[tuple]):
        self.script = list(script)
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with outer._lock:
                    outer.requests.append({"path": self.path, "body": body})
                    step = outer.script.pop(0) if outer.script else ("status", 503)
                if self.path.rstrip("/") != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": "no such route"}})
                kind = step[0]
                if kind == "status":
                    return self._send(step[1], {"error": {"message": "scripted failure",
                                                          "type": "server_error"}})
                if kind == "slow":
                    time.sleep(step[1])
                    text = step[2]
                else:
                    text = step[1]
                try:
                    self._send(200, completion(text))
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout): fine

            def _send(self, code: int, payload: dict):
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> "ScriptedServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def unused_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
