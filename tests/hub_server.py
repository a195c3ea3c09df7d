"""A stand-in for the Hugging Face Hub on 127.0.0.1, speaking the protocol huggingface_hub uses to download.

    GET  /api/models/{repo}/revision/{rev}        repo info: {"id", "sha", "siblings", ...}
    GET  /api/models/{repo}/tree/{rev}?recursive  file listing, paginated with a `Link: <...>; rel="next"` header
    HEAD /{repo}/resolve/{rev}/{path}             X-Repo-Commit + ETag (git blob id) + Content-Length; large
                                                  (LFS) files answer 302 to a CDN on another host ("localhost")
                                                  with X-Linked-Etag (the sha256) and X-Linked-Size
    GET  the same, and the CDN URL                the bytes, honouring `Range: bytes=N-` with 206

Errors carry the Hub's `X-Error-Code` header (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo),
which huggingface_hub turns into its typed exceptions. A gated repo answers 401 to file requests
without a token it knows. `cut_once` makes the first download of a file break off half-way.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # sha -> {path: bytes}
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> sha
    gated: bool = False


class StandInHub:
    def __init__(self, page_size: int = 1000):
        self.repos: dict[str, Repo] = {}
        self.blobs: dict[str, bytes] = {}  # sha256 -> bytes (the CDN)
        self.tokens = {"hf_valid_token"}
        self.cut_once: set[str] = set()  # file paths whose first full GET breaks off half-way
        self.requests: list[tuple[str, str, dict]] = []  # (method, path, headers with lower-case names)
        self.page_size = page_size
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.cdn = f"http://localhost:{self.port}/cdn"  # another host, as the Hub's LFS CDN is

    # ---------------------------------------------------------------------------- content

    def commit(self, repo_id: str, files: dict[str, bytes], *, branch: str = "main", gated: bool = False) -> str:
        """Add a commit on `branch` holding exactly `files`; returns its 40-hex id."""
        repo = self.repos.setdefault(repo_id, Repo())
        repo.gated = repo.gated or gated
        sha = hashlib.sha1(f"{repo_id}:{len(repo.commits)}:{sorted(files)}".encode()).hexdigest()
        repo.commits[sha] = dict(files)
        repo.refs[branch] = sha
        for data in files.values():
            self.blobs[hashlib.sha256(data).hexdigest()] = data
        return sha

    def tag(self, repo_id: str, name: str, sha: str) -> None:
        self.repos[repo_id].refs[name] = sha

    def resolve(self, repo_id: str, revision: str) -> str | None:
        repo = self.repos[repo_id]
        return revision if revision in repo.commits else repo.refs.get(revision)

    def downloads(self, path_suffix: str = "") -> list[dict]:
        """Headers of every GET of file bytes (resolve or CDN), optionally only for one file."""
        return [h for m, p, h in self.requests
                if m == "GET" and ("/resolve/" in p or p.startswith("/cdn/")) and p.endswith(path_suffix)]

    # --------------------------------------------------------------------------- lifecycle

    def __enter__(self) -> "StandInHub":
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # a client that hung up is normal
            super().handle_error(request, client_address)


def _handler(hub: StandInHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def do_HEAD(self):
            self._route(head=True)

        def do_GET(self):
            self._route(head=False)

        # ------------------------------------------------------------------------ routing

        def _route(self, head: bool):
            hub.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
            url = urlsplit(self.path)
            path = unquote(url.path)
            if path.startswith("/api/models/"):
                rest = path[len("/api/models/"):]
                for kind in ("/revision/", "/tree/"):
                    if kind in rest:
                        repo_id, _, revision = rest.partition(kind)
                        return self._api(kind.strip("/"), repo_id, revision, parse_qs(url.query))
                return self._error(404, "RepoNotFound", "Repository not found")
            if path.startswith("/cdn/"):
                sha = path[len("/cdn/"):].split("/")[0]
                if sha not in hub.blobs:
                    return self._error(404, None, "no such blob")
                return self._bytes(hub.blobs[sha], head, name=path.split("/")[-1])
            parts = path.lstrip("/").split("/", 4)
            if len(parts) == 5 and parts[2] == "resolve":
                repo_id, revision, file = f"{parts[0]}/{parts[1]}", parts[3], parts[4]
                return self._resolve(repo_id, revision, file, head)
            return self._error(404, None, "not found")

        def _api(self, kind: str, repo_id: str, revision: str, query: dict):
            if repo_id not in hub.repos:
                return self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
            sha = hub.resolve(repo_id, revision)
            if sha is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            files = hub.repos[repo_id].commits[sha]
            if kind == "revision":
                body = {"_id": sha[:24], "id": repo_id, "modelId": repo_id, "sha": sha, "private": False,
                        "gated": "manual" if hub.repos[repo_id].gated else False, "disabled": False,
                        "lastModified": "2024-11-01T00:00:00.000Z", "tags": [], "downloads": 0, "likes": 0,
                        "siblings": [{"rfilename": p} for p in sorted(files)]}
                return self._json(body)
            entries = [_tree_entry(p, data) for p, data in sorted(files.items())]
            start = int(query.get("cursor", ["0"])[0])
            page = entries[start:start + hub.page_size]
            headers = {}
            if start + hub.page_size < len(entries):
                headers["Link"] = (f'<{hub.url}/api/models/{repo_id}/tree/{revision}?recursive=True'
                                   f'&cursor={start + hub.page_size}>; rel="next"')
            return self._json(page, headers)

        def _resolve(self, repo_id: str, revision: str, file: str, head: bool):
            if repo_id not in hub.repos:
                return self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
            repo = hub.repos[repo_id]
            sha = hub.resolve(repo_id, revision)
            if sha is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            token = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            if repo.gated and token not in hub.tokens:
                return self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access "
                                   "to it and be authenticated to access it. Please log in.")
            if file not in repo.commits[sha]:
                return self._error(404, "EntryNotFound", f"{file} does not exist on {revision}", {"X-Repo-Commit": sha})
            data = repo.commits[sha][file]
            common = {"X-Repo-Commit": sha, "ETag": f'"{git_blob_id(data)}"', "Accept-Ranges": "bytes"}
            if file.endswith(LFS_SUFFIXES):  # LFS: the Hub redirects to its CDN and names the blob by sha256
                digest = hashlib.sha256(data).hexdigest()
                headers = {**common, "X-Linked-Etag": f'"{digest}"', "X-Linked-Size": str(len(data)),
                           "Location": f"{hub.cdn}/{digest}/{file.split('/')[-1]}", "Content-Length": "0"}
                self.send_response(302)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                return
            return self._bytes(data, head, common, name=file)

        # ----------------------------------------------------------------------- answers

        def _bytes(self, data: bytes, head: bool, headers: dict | None = None, name: str = ""):
            headers = dict(headers or {})
            start = 0
            ranged = self.headers.get("Range", "")
            if ranged.startswith("bytes="):
                start = int(ranged[len("bytes="):].split("-")[0] or 0)
                if start >= len(data):
                    return self._error(416, None, "range not satisfiable")
                self.send_response(206)
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            else:
                self.send_response(200)
            body = data[start:]
            headers.setdefault("ETag", f'"{git_blob_id(data)}"')
            headers["Content-Length"] = str(len(body))
            headers["Content-Type"] = "application/octet-stream"
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if head:
                return
            if name in hub.cut_once and start == 0:  # break off half-way, as a dropped connection does
                hub.cut_once.discard(name)
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.wfile.write(body)

        def _json(self, body, headers: dict | None = None, status: int = 200):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _error(self, status: int, code: str | None, message: str, headers: dict | None = None):
            said = {**({"X-Error-Code": code} if code else {}), "X-Error-Message": message}
            self._json({"error": message}, {**said, **(headers or {})}, status)

    return Handler


def _tree_entry(path: str, data: bytes) -> dict:
    entry = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": path}
    if path.endswith(LFS_SUFFIXES):
        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
    return entry


class SilentHost:
    """A host that accepts connections and never answers (a stuck proxy, a firewall that eats packets)."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed
                return
            self.held.append(conn)  # kept open, never read or written

    def __enter__(self) -> "SilentHost":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()
