"""A small Hugging Face Hub-compatible server on 127.0.0.1 for tests (no test reaches the internet).

It answers what the installed `huggingface_hub` client and clover call:

- `GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=true`: the file listing, with `size`, the git
  `oid` and `lfs: {oid (sha256), size, pointerSize}`, paginated with a `Link: <…>; rel="next"` header;
- `GET /api/models/{repo}` and `/api/models/{repo}/revision/{rev}`: model info (`sha`, `siblings`);
- `GET /api/models/{repo}/refs`: the branches;
- `HEAD`/`GET /{repo}/resolve/{rev}/{path}`: like the real Hub, an LFS file answers `302` with the
  `X-Linked-Size`, `X-Linked-Etag` (the sha256), `X-Repo-Commit` and `ETag` headers and a `Location` on a
  second listener standing in for the CDN, which serves the bytes with `Content-Length`,
  `Accept-Ranges: bytes` and `206` + `Content-Range` answers to `Range` requests.

Tests can make it cut a transfer after N bytes (`cut_after`), stall after N bytes until released
(`stall_after`, to kill a client mid-file), send slowly (`rate`), serve a file with one byte flipped (`corrupt`),
answer an error for a repository (`deny`), require a token (`gated`), or stop answering (`stop()`). It counts the
body bytes it sends, in total and per request (`transfers`). As a hostile mirror it can lie about a file (`lies`:
the path its listing shows, the ETag it sends) or send any commit id (`commits`).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

CHUNK = 1 << 16


@dataclass
class HostedFile:
    """One file of a repository: real bytes on disk, optionally declared larger (zeros after them)."""

    path: str
    data_path: Path
    declared_size: int | None = None  # virtual size for header-only files: never downloaded in full
    _sha: str | None = None

    @property
    def size(self) -> int:
        return self.declared_size if self.declared_size is not None else self.data_path.stat().st_size

    @property
    def sha256(self) -> str:
        if self._sha is None:
            if self.declared_size is not None:
                self._sha = hashlib.sha256(f"virtual:{self.path}:{self.declared_size}".encode()).hexdigest()
            else:
                h = hashlib.sha256()
                with self.data_path.open("rb") as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        h.update(block)
                self._sha = h.hexdigest()
        return self._sha

    @property
    def git_oid(self) -> str:
        return hashlib.sha1(f"pointer:{self.sha256}".encode()).hexdigest()

    def read(self, start: int, n: int) -> bytes:
        """Bytes [start, start+n) of the (possibly virtual) file: zeros past the real data."""
        with self.data_path.open("rb") as fh:
            fh.seek(start)
            data = fh.read(n)
        return data + bytes(n - len(data))


@dataclass
class Transfer:
    """One answered request, for assertions: what was asked and how many body bytes went out."""

    method: str
    path: str
    range: str | None
    status: int
    auth: bool = False  # an Authorization header came with the request
    sent: int = 0


@dataclass
class Lie:
    """What a hostile mirror says about the repository's file `real`: the path its listing shows and the ETag
    (also sent as X-Linked-Etag) its resolve answers carry; None keeps the truth."""

    real: str
    path: str | None = None
    etag: str | None = None


@dataclass
class HubState:
    repos: dict[str, dict[str, HostedFile]] = field(default_factory=dict)
    commits: dict[str, str] = field(default_factory=dict)
    deny: dict[str, tuple[int, str]] = field(default_factory=dict)  # repo -> (status, X-Error-Code)
    gated: dict[str, str] = field(default_factory=dict)  # repo -> the token that opens it
    cut_after: int | None = None  # drop the connection after this many body bytes of one transfer (once)
    stall_after: int | None = None  # stop sending after this many body bytes until `release` is set (once)
    release: threading.Event = field(default_factory=threading.Event)
    stalled: threading.Event = field(default_factory=threading.Event)
    corrupt: set[str] = field(default_factory=set)  # paths served with one byte flipped
    lies: dict[str, Lie] = field(default_factory=dict)  # repo -> what the mirror says instead of the truth
    page_size: int = 1000
    rate: float | None = None  # bytes per second per transfer (to watch a progress bar move)
    transfers: list[Transfer] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, repo: str, path: str, data_path: Path, declared_size: int | None = None) -> HostedFile:
        hosted = HostedFile(path, Path(data_path), declared_size)
        self.repos.setdefault(repo, {})[path] = hosted
        self.commits.setdefault(repo, hashlib.sha1(repo.encode()).hexdigest())
        return hosted

    @property
    def bytes_sent(self) -> int:
        with self.lock:
            return sum(t.sent for t in self.transfers)

    def file_transfers(self, sha256: str) -> list[Transfer]:
        """The CDN requests that carried bytes of the blob `sha256`."""
        with self.lock:
            return [t for t in self.transfers if t.path.startswith(f"/cdn/{sha256}") and t.method == "GET"]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: HubState
    hub: HubServer

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        self._dispatch(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch(head=True)

    def _record(self, status: int) -> Transfer:
        t = Transfer(self.command, self.path, self.headers.get("Range"), status,
                     self.headers.get("Authorization") is not None)
        with self.state.lock:
            self.state.transfers.append(t)
        return t

    def _headers(self, status: int, headers: dict[str, str]) -> Transfer:
        t = self._record(status)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        return t

    def _json(self, obj: object, extra: dict[str, str] | None = None) -> None:
        body = json.dumps(obj).encode()
        t = self._headers(200, {"Content-Type": "application/json", "Content-Length": str(len(body)), **(extra or {})})
        if self.command != "HEAD":
            self.wfile.write(body)
            t.sent = len(body)

    def _error(self, status: int, code: str | None, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        headers = {"Content-Type": "application/json", "Content-Length": str(len(body)), "X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._headers(status, headers)
        if self.command != "HEAD":
            self.wfile.write(body)

    def _repo(self, repo: str) -> dict[str, HostedFile] | None:
        st = self.state
        if repo in st.deny:
            status, code = st.deny[repo]
            self._error(status, code, "Repository not found" if code == "RepoNotFound" else "Access denied")
            return None
        if repo in st.gated and self.headers.get("Authorization") != f"Bearer {st.gated[repo]}":
            self._error(401 if not self.headers.get("Authorization") else 403, "GatedRepo",
                        "Access to this repo is restricted")
            return None
        files = st.repos.get(repo)
        if files is None:
            self._error(404, "RepoNotFound", "Repository not found")
        return files

    def _dispatch(self, head: bool) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        query = parse_qs(url.query)
        if self.server is self.hub.cdn:
            m = re.match(r"^/cdn/([0-9a-f]{64})/(.+)$", path)
            if m:
                self._serve_bytes(m.group(1), m.group(2), head)
            else:
                self._error(404, None, "not found")
            return
        m = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$", path)
        if m:
            self._tree(m.group(1), m.group(3) or "", query)
            return
        m = re.match(r"^/api/models/([^/]+/[^/]+)/refs$", path)
        if m:
            files = self._repo(m.group(1))
            if files is not None:
                commit = self.state.commits[m.group(1)]
                self._json({"branches": [{"name": "main", "ref": "refs/heads/main", "targetCommit": commit}],
                            "tags": [], "converts": []})
            return
        m = re.match(r"^/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?$", path)
        if m:
            files = self._repo(m.group(1))
            if files is not None:
                blobs = query.get("blobs", ["false"])[0] == "true"
                siblings = [{"rfilename": f.path, **({"size": f.size, "blobId": f.git_oid,
                                                      "lfs": {"sha256": f.sha256, "size": f.size,
                                                              "pointerSize": 134}} if blobs else {})}
                            for f in files.values()]
                self._json({"id": m.group(1), "modelId": m.group(1), "sha": self.state.commits[m.group(1)],
                            "private": False, "gated": m.group(1) in self.state.gated and "manual",
                            "siblings": siblings})
            return
        m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if m:
            self._resolve(m.group(1), m.group(3))
            return
        for repo in self.state.lies:  # a lied path the client normalised (`a/../..` away): answer for the lie
            self._resolve(repo, self.state.lies[repo].real)
            return
        self._error(404, None, "not found")

    def _tree(self, repo: str, under: str, query: dict[str, list[str]]) -> None:
        files = self._repo(repo)
        if files is None:
            return
        recursive = query.get("recursive", ["false"])[0] == "true"
        prefix = f"{under.rstrip('/')}/" if under else ""
        entries: list[dict] = []
        folders: set[str] = set()
        for f in sorted(files.values(), key=lambda f: f.path):
            if not f.path.startswith(prefix):
                continue
            rest = f.path[len(prefix):]
            if "/" in rest and not recursive:
                folder = prefix + rest.split("/", 1)[0]
                if folder not in folders:
                    folders.add(folder)
                    entries.append({"type": "directory", "oid": hashlib.sha1(folder.encode()).hexdigest(),
                                    "size": 0, "path": folder})
                continue
            if recursive:
                for i in range(1, rest.count("/") + 1):
                    folder = prefix + "/".join(rest.split("/")[:i])
                    if folder not in folders:
                        folders.add(folder)
                        entries.append({"type": "directory", "oid": hashlib.sha1(folder.encode()).hexdigest(),
                                        "size": 0, "path": folder})
            lie = self.state.lies.get(repo)
            shown = lie.path if lie is not None and lie.real == f.path and lie.path is not None else f.path
            entries.append({"type": "file", "oid": f.git_oid, "size": f.size, "path": shown,
                            "lfs": {"oid": f.sha256, "size": f.size, "pointerSize": 134}})
        start = int(query.get("cursor", ["0"])[0])
        page = entries[start:start + self.state.page_size]
        extra = {}
        if start + self.state.page_size < len(entries):
            nxt = f"{self.hub.endpoint}{quote(urlsplit(self.path).path)}?recursive={str(recursive).lower()}" \
                  f"&cursor={start + self.state.page_size}"
            extra["Link"] = f'<{nxt}>; rel="next"'
        self._json(page, extra)

    def _resolve(self, repo: str, file_path: str) -> None:
        files = self._repo(repo)
        if files is None:
            return
        lie = self.state.lies.get(repo)
        f = files.get(lie.real if lie is not None else file_path)
        if f is None:
            self._error(404, "EntryNotFound", "Entry not found")
            return
        location = f"{self.hub.cdn_endpoint}/cdn/{f.sha256}/{quote(file_path.rsplit('/', 1)[-1])}"
        etag, linked = (f.git_oid, f.sha256) if lie is None or lie.etag is None else (lie.etag, lie.etag)
        self._headers(302, {"Location": location, "ETag": f'"{etag}"', "X-Linked-Etag": f'"{linked}"',
                            "X-Linked-Size": str(f.size), "X-Repo-Commit": self.state.commits[repo],
                            "Content-Length": "0"})

    def _serve_bytes(self, sha: str, name: str, head: bool) -> None:
        hosted = next((f for files in self.state.repos.values() for f in files.values() if f.sha256 == sha), None)
        if hosted is None:
            self._error(404, None, "no such blob")
            return
        size = hosted.size
        start, end, status = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng:
            mm = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if mm:
                start = int(mm.group(1))
                end = min(int(mm.group(2)) if mm.group(2) else size - 1, size - 1)
                if start >= size:
                    self._headers(416, {"Content-Range": f"bytes */{size}", "Content-Length": "0"})
                    return
                status = 206
        length = end - start + 1
        headers = {"ETag": f'"{sha}"', "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream",
                   "Content-Length": str(length),
                   "Content-Disposition": f'attachment; filename="{name}"'}
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        t = self._headers(status, headers)
        if head:
            return
        self._send_body(hosted, t, start, length)

    def _send_body(self, hosted: HostedFile, t: Transfer, start: int, length: int) -> None:
        st = self.state
        flip = hosted.size // 2 if hosted.path in st.corrupt else -1
        pos, end = start, start + length
        while pos < end:
            chunk = bytearray(hosted.read(pos, min(CHUNK, end - pos)))
            if pos <= flip < pos + len(chunk):
                chunk[flip - pos] ^= 0xFF
            with st.lock:
                cut, stall = st.cut_after, st.stall_after
                if cut is not None and t.sent + len(chunk) >= cut:
                    st.cut_after = None
                if stall is not None and t.sent + len(chunk) >= stall:
                    st.stall_after = None
            limit = cut if cut is not None else stall
            if limit is not None and t.sent + len(chunk) >= limit:
                keep = max(0, limit - t.sent)
                self._write(t, bytes(chunk[:keep]))
                self.wfile.flush()
                if stall is not None and cut is None:
                    st.stalled.set()
                    st.release.wait(60)
                self.close_connection = True
                return
            if not self._write(t, bytes(chunk)):
                return
            pos += len(chunk)
            if st.rate:
                time.sleep(len(chunk) / st.rate)

    def _write(self, t: Transfer, data: bytes) -> bool:
        try:
            self.wfile.write(data)
        except OSError:
            self.close_connection = True
            return False
        with self.state.lock:
            t.sent += len(data)
        return True


class HubServer:
    """`with HubServer() as hub:` then point HF_ENDPOINT at `hub.endpoint`; `hub.state` configures it."""

    def __init__(self) -> None:
        self.state = HubState()
        handler = type("Handler", (_Handler,), {"state": self.state, "hub": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.cdn = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._threads: list[threading.Thread] = []
        self.running = False

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @property
    def cdn_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.cdn.server_address[1]}"

    def __enter__(self) -> HubServer:
        for srv in (self.httpd, self.cdn):
            srv.daemon_threads = True
            th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
            th.start()
            self._threads.append(th)
        self.running = True
        return self

    def stop(self) -> None:
        """Stop answering: connections are refused from now on (the Hub is 'down')."""
        if not self.running:
            return
        self.running = False
        self.state.release.set()
        for srv in (self.httpd, self.cdn):
            srv.shutdown()
            srv.server_close()

    def __exit__(self, *exc: object) -> None:
        self.stop()
