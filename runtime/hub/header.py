"""Reading a GGUF model's header over HTTP with range requests: the metadata and tensor list of a
21 GB file cost a few MB, so `inspect` and the memory-fit check before `pull` work without the data."""

from __future__ import annotations

from pathlib import PurePosixPath

from ..errors import HubError, ModelFileError
from ..gguf_file import HeaderView
from ..gguf_header import GGUFHeader, HeaderTruncated, TensorInfo, parse_header
from . import remote
from .endpoint import endpoint

FIRST_READ = 1 << 20
MAX_HEADER = 1 << 30


class RemoteModel(HeaderView):
    """The headers of a model's shards as read from the Hub; shaped like an opened GGUFModelFile for
    everything that needs no tensor data (`metadata`, `value_types`, `tensors`, `paths`, `file_size`)."""

    def __init__(self, repo: str, metas: list[remote.FileMeta], headers: list[GGUFHeader], bytes_read: int) -> None:
        self.repo = repo
        self.headers = headers
        self.paths = [PurePosixPath(m.path) for m in metas]
        self.file_size = sum(m.size for m in metas)
        self.bytes_read = bytes_read
        self.tensors: dict[str, TensorInfo] = {}
        for shard, header in enumerate(headers):
            for t in header.tensors:
                if t.name in self.tensors:
                    raise ModelFileError(f"{metas[shard].path}: tensor '{t.name}' appears twice")
                self.tensors[t.name] = TensorInfo(t.name, t.ggml_type, t.shape, t.offset, t.n_bytes, shard)

    @property
    def name(self) -> str:
        return self.paths[0].name

    @property
    def tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors.values())

    def close(self) -> None:
        """Nothing is mapped; present so callers treat it like an opened file."""


def read_range(meta: remote.FileMeta, start: int, end: int, repo: str, token: str | None) -> bytes:
    """Bytes [start, end] of the file. A server that ignores `Range` (200) is read only up to `end`."""
    from huggingface_hub.utils import get_session

    headers = {**remote.data_headers(meta.url, token), "Range": f"bytes={start}-{end}"}
    want = end - start + 1
    try:
        with get_session().stream("GET", meta.url, headers=headers, timeout=30.0) as resp:
            remote.raise_for_status(resp, repo, meta.path)
            skip = start if resp.status_code == 200 else 0
            if resp.status_code == 206 and not resp.headers.get("Content-Range", "").startswith(f"bytes {start}-"):
                raise HubError(f"the Hub answered a range request for {meta.path} with the wrong bytes "
                               f"({resp.headers.get('Content-Range')})")
            out = bytearray()
            for chunk in resp.iter_bytes(1 << 16):
                out += chunk
                if len(out) >= skip + want:
                    break
    except HubError:
        raise
    except Exception as exc:  # noqa: BLE001 - network failures become one line
        err = remote.translate(exc, repo, meta.path)
        if isinstance(err, remote.Unreachable):
            raise HubError(f"cannot read the header of {meta.path} from {endpoint()} ({err.reason})") from None
        raise err from None
    return bytes(out[skip:skip + want])


def read_header(meta: remote.FileMeta, repo: str, token: str | None = None,
                first: int = FIRST_READ) -> tuple[GGUFHeader, int]:
    """(header, bytes fetched): read a window, and while the header runs past it, a bigger one."""
    buf = b""
    want = min(first, meta.size)
    while True:
        if want > len(buf):
            buf += read_range(meta, len(buf), want - 1, repo, token)
        try:
            return parse_header(buf, file_size=meta.size, name=PurePosixPath(meta.path).name), len(buf)
        except HeaderTruncated as more:
            if len(buf) >= meta.size or more.needed > meta.size:
                raise ModelFileError(f"{meta.path}: truncated file (ends inside the GGUF header)") from None
            if len(buf) >= MAX_HEADER:
                raise ModelFileError(f"{meta.path}: GGUF header larger than {MAX_HEADER >> 20} MiB") from None
            want = min(meta.size, max(more.needed + (1 << 16), 2 * len(buf)))


def read_model(repo: str, metas: list[remote.FileMeta], token: str | None = None) -> RemoteModel:
    """Every shard's header, merged into one model view."""
    headers, total = [], 0
    for meta in metas:
        header, n = read_header(meta, repo, token)
        headers.append(header)
        total += n
    return RemoteModel(repo, metas, headers, total)
