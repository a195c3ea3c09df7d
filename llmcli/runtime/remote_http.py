"""HTTP to an OpenAI-compatible server (vLLM, llama-server, `llmcli serve`) with the standard library:
JSON requests and server-sent events, an API key, and every failure as one RemoteError line.

    api = Endpoint.of("http://127.0.0.1:8000/v1", key="sk-...")
    api.get("/models")                        -> the JSON answer (a dict)
    api.post("/chat/completions", body)       -> the JSON answer
    for event in api.stream("/chat/completions", body): ...   each `data:` event as a dict, until [DONE]

http.client, not httpx or openai: those are dev-only dependencies, and a stream's connection must
close when its generator does (Ctrl-C in the REPL stops the server's generation too).
"""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from typing import Iterator
from urllib.parse import urlsplit

from ..errors import InvalidParameterError, LlmcliError

TIMEOUT_S = 600.0  # seconds to connect, and the longest silence between two reads (a long prefill)


class RemoteError(LlmcliError):
    """The server could not be reached, refused the key, or answered with an error."""


@dataclass(frozen=True)
class Endpoint:
    url: str  # as the user gave it, for messages
    https: bool
    host: str
    port: int
    prefix: str  # the path before /models, /chat/completions: "/v1" (vLLM's and llmcli's)
    key: str | None = None
    timeout: float = TIMEOUT_S

    @classmethod
    def of(cls, url: str, key: str | None = None, timeout: float = TIMEOUT_S) -> "Endpoint":
        """--api URL: http(s)://host[:port][/path]; without a path, /v1."""
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidParameterError(f"--api takes a server's URL, e.g. http://127.0.0.1:8000/v1, got {url!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise InvalidParameterError(f"--api {url}: the port is not a number from 1 to 65535") from None
        prefix = parts.path.rstrip("/") or "/v1"
        return cls(url.strip(), parts.scheme == "https", parts.hostname, port, prefix, key or None, timeout)

    # ------------------------------------------------------------------ requests

    def get(self, path: str) -> dict:
        conn, response = self._open("GET", path, None)
        try:
            return self._json(response, path)
        finally:
            conn.close()

    def post(self, path: str, body: dict) -> dict:
        conn, response = self._open("POST", path, body)
        try:
            return self._json(response, path)
        finally:
            conn.close()

    def stream(self, path: str, body: dict) -> Iterator[dict]:
        """The server-sent events of a streamed answer, each `data:` payload parsed; closing the
        generator closes the connection, which a server takes as the client gone (it stops)."""
        conn, response = self._open("POST", path, body)
        try:
            data: list[str] = []
            while True:
                line = self._read_line(response)
                if line is None:  # the connection ended (a server that sends no [DONE])
                    return
                line = line.rstrip("\r\n")
                if line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
                    continue
                if line or not data:  # comments, event names, ids; or a blank line with nothing pending
                    continue
                payload, data = "\n".join(data), []
                if payload.strip() == "[DONE]":
                    return
                event = self._parse(payload, path)
                if isinstance(event, dict) and "error" in event:  # an error after the stream began (llama.cpp)
                    raise RemoteError(f"the server at {self.url} stopped the answer: {_message(event)}")
                yield event
        finally:
            conn.close()  # (the socket too: a response's close() leaves it open)

    # ------------------------------------------------------------------ plumbing

    def _open(self, method: str, path: str, body: dict | None):
        """Send one request: (the connection, its response) for a 2xx status, else RemoteError with
        the server's words."""
        kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = kind(self.host, self.port, timeout=self.timeout)
        headers = {"Accept": "application/json, text/event-stream"}
        data = None
        if body is not None:
            data = json.dumps(body, ensure_ascii=False).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        try:
            conn.request(method, self.prefix + path, body=data, headers=headers)
            response = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise RemoteError(self._unreachable(e)) from None
        if response.status >= 300:
            try:
                text = response.read(1 << 16).decode("utf-8", errors="replace")
            except (OSError, http.client.HTTPException):
                text = ""
            finally:
                conn.close()
            raise RemoteError(self._refused(response.status, text))
        return conn, response

    def _json(self, response, path: str):
        try:
            text = response.read().decode("utf-8", errors="replace")
        except (OSError, http.client.HTTPException) as e:
            raise RemoteError(self._unreachable(e)) from None
        return self._parse(text, path)

    def _read_line(self, response) -> str | None:
        try:
            line = response.readline()
        except (OSError, http.client.HTTPException) as e:
            raise RemoteError(self._unreachable(e)) from None
        return line.decode("utf-8", errors="replace") if line else None

    def _parse(self, text: str, path: str):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise RemoteError(f"the server at {self.url} did not answer {path} with JSON (is it an "
                              f"OpenAI-compatible API? --api takes its base URL, e.g. http://HOST:8000/v1)") from None

    def _unreachable(self, e: Exception) -> str:
        if isinstance(e, (socket.timeout, TimeoutError)):
            why = f"no answer within {self.timeout:.0f} s"
        elif isinstance(e, ConnectionRefusedError):
            why = "connection refused"
        elif isinstance(e, socket.gaierror):
            why = f"unknown host {self.host}"
        else:
            why = getattr(e, "strerror", None) or str(e) or type(e).__name__
        return (f"cannot reach the server at {self.url} ({why}); start it (`llmcli serve MODEL`, "
                f"`vllm serve MODEL`) or check --api")

    def _refused(self, status: int, text: str) -> str:
        try:
            said = _message(json.loads(text))
        except (json.JSONDecodeError, TypeError):
            said = " ".join(text.split())[:200]
        if status in (401, 403):  # (the server's own words name its flags, not ours)
            if self.key:
                return (f"the server at {self.url} refused the API key ({status}); pass the right one with "
                        "--api-key KEY or LLMCLI_API_KEY")
            return f"the server at {self.url} wants an API key ({status}); pass --api-key KEY or set LLMCLI_API_KEY"
        if status == 404 and not said:
            said = "not found; --api takes the base URL, e.g. http://HOST:8000/v1"
        return f"the server at {self.url} answered {status}: {said or http.client.responses.get(status, '')}"


def _message(body) -> str:
    """The words of an error answer: OpenAI's {"error": {"message"}}, vLLM's {"message"}, FastAPI's {"detail"}."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        for key in ("message", "detail"):
            if body.get(key):
                return str(body[key])
    return ""
