"""A small Hugging Face Hub-compatible server on 127.0.0.1 for tests.

It answers what the real `huggingface_hub` client calls: the repository tree listing
(`/api/models/{repo}/tree/{rev}`), model info (`/api/models/{repo}`), and `HEAD`/`GET` on
`/{repo}/resolve/{rev}/{path}` with the headers the client relies on (ETag / X-Linked-Etag,
X-Repo-Commit, X-Linked-Size, Content-Length, Accept-Ranges, 206 range answers). Tests can make
it cut a download after N bytes, answer 401/404, or be down, and it counts the bytes it sent.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class HostedFile:
    path: str
    data_path: Path | None = None  # real bytes on disk
    declared_size: int | None = None  # listing-only files (e.g. a huge file that is never fetched)

    @property
    def size(self) -> int:
        return self.declared_size if self.data_path is None else self.data_path.stat().st_size

    def sha256(self) -> str:
        if self.data_path is None:
            return hashlib.sha256(self.path.encode()).hexdigest()
        h = hashlib.sha256()
        with self.data_path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()


@dataclass
class HubState:
    repos: dict[str, dict[str, HostedFile]] = field(default_factory=dict)
    status_override: dict[str, int] = field(default_factory=dict)  # repo -> 401/404...
    cut_after: int | None = None  # cut a whole-file download after this many body bytes (once)
    corrupt: set[str] = field(default_factory=set)  # paths served with their last byte flipped
    bytes_sent: int = 0
    requests: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, repo: str, path: str, data_path: Path | None = None, declared_size: int | None = None) -> None:
        self.repos.setdefault(repo, {})[path] = HostedFile(path, data_path, declared_size)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: HubState

    def log_message(self, *args: object) -> None:
        pass

    def _send_json(self, obj: object, status: int = 200) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Repo-Commit", COMMIT)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if status == 401:
            self.send_header("X-Error-Code", "GatedRepo")
            self.send_header("X-Error-Message", "Access to this repo is restricted")
        elif status == 404:
            self.send_header("X-Error-Code", "RepoNotFound")
            self.send_header("X-Error-Message", "Repository not found")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _repo_files(self, repo: str) -> dict[str, HostedFile] | None:
        st = self.state
        if repo in st.status_override:
            self._error(st.status_override[repo], "denied" if st.status_override[repo] == 401 else "not found")
            return None
        files = st.repos.get(repo)
        if files is None:
            self._error(404, "Repository not found")
        return files

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        self._serve(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve(head=True)

    def _serve(self, head: bool) -> None:
        path = self.path.split("?", 1)[0]
        with self.state.lock:
            self.state.requests.append(f"{self.command} {self.path}")
        m = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/.*)?$", path)
        if m:
            files = self._repo_files(m.group(1))
            if files is None:
                return
            self._send_json([
                {"type": "file", "path": f.path, "size": f.size, "oid": hashlib.sha1(f.path.encode()).hexdigest(),
                 "lfs": {"oid": f.sha256(), "size": f.size, "pointerSize": 134}} for f in files.values()
            ])
            return
        m = re.match(r"^/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?$", path)
        if m:
            files = self._repo_files(m.group(1))
            if files is None:
                return
            self._send_json({"id": m.group(1), "sha": COMMIT, "siblings": [{"rfilename": p} for p in files]})
            return
        m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if m:
            self._resolve(m.group(1), m.group(3), head)
            return
        self._error(404, "not found")

    def _resolve(self, repo: str, file_path: str, head: bool) -> None:
        files = self._repo_files(repo)
        if files is None:
            return
        f = files.get(file_path)
        if f is None or f.data_path is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        size = f.size
        sha = f.sha256()
        start, end = 0, size - 1
        rng = self.headers.get("Range")
        status = 200
        if rng and not head:
            mm = re.match(r"bytes=(\d+)-(\d*)", rng)
            if mm:
                start = int(mm.group(1))
                end = int(mm.group(2)) if mm.group(2) else size - 1
                end = min(end, size - 1)
                status = 206
        length = max(0, end - start + 1)
        self.send_response(status)
        self.send_header("ETag", f'"{sha}"')
        self.send_header("X-Linked-Etag", f'"{sha}"')
        self.send_header("X-Linked-Size", str(size))
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size if head else length))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if head:
            return
        st = self.state
        cut = st.cut_after if rng is None else None
        with f.data_path.open("rb") as fh:
            fh.seek(start)
            remaining = length
            sent = 0
            while remaining > 0:
                chunk = fh.read(min(1 << 16, remaining))
                if not chunk:
                    break
                pos = fh.tell()
                if file_path in st.corrupt and pos == size:  # flip the file's last byte
                    chunk = chunk[:-1] + bytes([chunk[-1] ^ 0xFF])
                with st.lock:
                    if cut is not None and sent + len(chunk) > cut:
                        keep = max(0, cut - sent)
                        st.bytes_sent += keep
                        st.cut_after = None
                        self.wfile.write(chunk[:keep])
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    st.bytes_sent += len(chunk)
                sent += len(chunk)
                self.wfile.write(chunk)
                remaining -= len(chunk)


class HubServer:
    """Run with `with HubServer() as hub:`; `hub.endpoint` goes into HF_ENDPOINT."""

    def __init__(self) -> None:
        self.state = HubState()
        handler = type("Handler", (_Handler,), {"state": self.state})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> HubServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __exit__(self, *exc: object) -> None:
        self.stop()
