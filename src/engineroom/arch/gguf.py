"""The one GGUF header reader of engineroom: key/values and the tensor table, never weights.

A local file is mmapped (only the header pages are touched); a URL is read with growing
HTTP range requests (2 MiB, 4 MiB, ...), so a multi-gigabyte file costs a few megabytes.
Every defect (bad magic, absurd counts, unknown tensor types, truncation) is one
``BadInput`` sentence naming the file.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

# httpx and gguf (which loads numpy) are imported where used: `plan` on a catalog model needs neither
if TYPE_CHECKING:
    import httpx

from ..errors import BadInput, EngineroomError, NotFound, first_line

_MAX_TENSORS = 1 << 20
_MAX_KV = 1 << 20
_MAX_STRING = 1 << 26       # 64 MiB: no sane key or value string is longer
_MAX_ARRAY = 1 << 28
_KEEP_ARRAY = 4096          # arrays longer than this keep only their length (token lists)
_FIRST_PREFIX = 2 << 20     # 2 MiB: enough for most headers without a 256k-token vocab
_MAX_PREFIX = 1 << 30       # give up on a header larger than 1 GiB

@lru_cache(maxsize=1)
def _value_types() -> tuple[dict[int, str], int, int]:
    """(struct format of each scalar GGUF value type, the STRING type, the ARRAY type)."""
    from gguf import GGUFValueType

    formats = {
        int(GGUFValueType.UINT8): "<B", int(GGUFValueType.INT8): "<b",
        int(GGUFValueType.UINT16): "<H", int(GGUFValueType.INT16): "<h",
        int(GGUFValueType.UINT32): "<I", int(GGUFValueType.INT32): "<i",
        int(GGUFValueType.FLOAT32): "<f", int(GGUFValueType.BOOL): "<?",
        int(GGUFValueType.UINT64): "<Q", int(GGUFValueType.INT64): "<q",
        int(GGUFValueType.FLOAT64): "<d",
    }
    return formats, int(GGUFValueType.STRING), int(GGUFValueType.ARRAY)


class _NeedMore(Exception):
    """The buffer ended inside the header: read a longer prefix and parse again."""


@dataclass
class GGUFArray:
    """A GGUF array value: its element count always, its values when short."""

    count: int
    values: list[Any] | None


@dataclass
class GGUFHeader:
    """What a GGUF says about itself before its first weight byte."""

    version: int
    kv: dict[str, Any]
    tensors: dict[str, tuple[tuple[int, ...], int]]   # name -> (ne dims, ggml type id)
    header_bytes: int                                  # bytes up to the end of the tensor table

    def tensor_nbytes(self, name: str) -> int:
        dims, ggml_type = self.tensors[name]
        return ggml_tensor_nbytes(name, dims, ggml_type)


def ggml_tensor_nbytes(name: str, dims: tuple[int, ...], ggml_type: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise BadInput(f"Tensor {name!r} has ggml type {ggml_type}, which this gguf package does not know.") from None
    n = math.prod(dims)
    if dims and dims[0] % block:
        raise BadInput(f"Tensor {name!r} has a first dimension {dims[0]} that is not a multiple of its "
                       f"block size {block}.")
    return n // block * type_size


class _Cursor:
    def __init__(self, buf: bytes | memoryview | mmap.mmap, complete: bool):
        self.buf = buf
        self.pos = 0
        self.complete = complete   # True: running out of bytes means a truncated file

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            if self.complete:
                raise BadInput("truncated")
            raise _NeedMore
        chunk = bytes(self.buf[self.pos:end])
        self.pos = end
        return chunk

    def skip(self, n: int) -> None:
        end = self.pos + n
        if end > len(self.buf):
            if self.complete:
                raise BadInput("truncated")
            raise _NeedMore
        self.pos = end

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        if n > _MAX_STRING:
            raise BadInput(f"a string length of {n} bytes")
        return self.take(n).decode("utf-8", errors="replace")


def _read_value(cur: _Cursor, vtype: int, depth: int = 0, keep_arrays: bool = False) -> Any:
    scalar_formats, string_type, array_type = _value_types()
    if vtype in scalar_formats:
        return cur.scalar(scalar_formats[vtype])
    if vtype == string_type:
        return cur.string()
    if vtype == array_type:
        if depth > 2:
            raise BadInput("arrays nested too deep")
        etype = cur.scalar("<I")
        count = cur.scalar("<Q")
        if count > _MAX_ARRAY:
            raise BadInput(f"an array of {count} elements")
        keep = keep_arrays or count <= _KEEP_ARRAY
        if etype in scalar_formats:
            size = struct.calcsize(scalar_formats[etype])
            if not keep:
                cur.skip(size * count)
                return GGUFArray(count, None)
            raw = cur.take(size * count)
            return GGUFArray(count, list(struct.unpack(f"<{count}{scalar_formats[etype][1]}", raw)))
        values = [_read_value(cur, etype, depth + 1, keep_arrays) for _ in range(count)] if keep else None
        if not keep:
            for _ in range(count):
                _read_value(cur, etype, depth + 1)
        return GGUFArray(count, values)
    raise BadInput(f"a value of unknown type {vtype}")


def parse_gguf_header(buf: bytes | memoryview | mmap.mmap, complete: bool = True,
                      keep_arrays: bool = False) -> GGUFHeader:
    """Parse the GGUF header and tensor table from ``buf`` (a whole file or a prefix).

    With ``complete=False`` a buffer that ends inside the header raises ``_NeedMore`` so the
    caller can fetch a longer prefix; otherwise every defect (bad magic, absurd counts,
    unknown types, truncation) is a ``BadInput`` whose message says what was wrong.
    ``keep_arrays``: keep long arrays' values too (a tokenizer's tokens and merges, which
    synth.py copies); by default they keep only their length.
    """
    cur = _Cursor(buf, complete)
    magic = cur.take(4)
    if magic != b"GGUF":
        raise BadInput("not a GGUF file")
    version = cur.scalar("<I")
    if version not in (2, 3):
        raise BadInput(f"GGUF version {version} (only 2 and 3 are read)")
    n_tensors = cur.scalar("<Q")
    n_kv = cur.scalar("<Q")
    if n_tensors > _MAX_TENSORS or n_kv > _MAX_KV:
        raise BadInput(f"{n_tensors} tensors and {n_kv} keys")
    kv: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.scalar("<I")
        kv[key] = _read_value(cur, vtype, keep_arrays=keep_arrays)
    tensors: dict[str, tuple[tuple[int, ...], int]] = {}
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.scalar("<I")
        if not 1 <= n_dims <= 8:
            raise BadInput(f"tensor {name!r} with {n_dims} dimensions")
        dims = tuple(cur.scalar("<Q") for _ in range(n_dims))
        ggml_type = cur.scalar("<I")
        cur.scalar("<Q")   # data offset: not needed, the weights are never read
        if any(d == 0 or d > 1 << 40 for d in dims):
            raise BadInput(f"tensor {name!r} with dimensions {dims}")
        ggml_tensor_nbytes(name, dims, ggml_type)   # validates the type now
        tensors[name] = (dims, ggml_type)
    return GGUFHeader(version=version, kv=kv, tensors=tensors, header_bytes=cur.pos)


def _wrap_header_error(where: str, exc: BadInput) -> BadInput:
    msg = str(exc)
    if msg == "not a GGUF file":
        return BadInput(f"{where} is not a GGUF file (it does not start with the GGUF magic).")
    if msg == "truncated":
        return BadInput(f"{where} is a truncated GGUF file: it ends inside the header.")
    if msg.endswith("."):   # already a full sentence (unknown tensor type...)
        return BadInput(f"{where}: {msg[0].lower()}{msg[1:]}")
    return BadInput(f"{where} has a corrupt GGUF header ({msg}).")


def read_gguf_header_local(path: str | Path, keep_arrays: bool = False) -> GGUFHeader:
    """Header of a local GGUF via mmap: only the header pages are ever touched."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                raise BadInput(f"{p} is not a GGUF file (it is empty).")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                try:
                    return parse_gguf_header(mm, complete=True, keep_arrays=keep_arrays)
                except BadInput as exc:
                    raise _wrap_header_error(str(p), exc) from None
    except FileNotFoundError:
        raise BadInput(f"{p} does not exist.") from None
    except IsADirectoryError:
        raise BadInput(f"{p} is a directory, not a GGUF file.") from None
    except PermissionError:
        raise BadInput(f"{p} cannot be read (permission denied).") from None


def _auth_headers(url: str) -> dict[str, str]:
    """Send the user's Hugging Face token to the hub only, so gated repos work."""
    import httpx

    host = httpx.URL(url).host
    if host == "huggingface.co" or host.endswith(".huggingface.co"):
        try:
            from huggingface_hub import get_token
            token = get_token()
        except Exception:  # noqa: BLE001 - a missing token is not an error
            token = None
        if token:
            return {"Authorization": f"Bearer {token}"}
    return {}


def _fetch_prefix(client: httpx.Client, url: str, n: int) -> tuple[bytes, int | None]:
    """First ``n`` bytes of ``url`` and the total size when the server says it. A server
    that ignores Range gets its stream cut after ``n`` bytes, so weights are never pulled."""
    headers = {"Range": f"bytes=0-{n - 1}", **_auth_headers(url)}
    with client.stream("GET", url, headers=headers) as resp:
        if resp.status_code == 404:
            raise NotFound(f"{url} does not exist (HTTP 404).")
        if resp.status_code in (401, 403):
            raise BadInput(f"{url} refused access (HTTP {resp.status_code}); a gated repo needs a Hugging Face token.")
        if resp.status_code not in (200, 206):
            raise EngineroomError(f"{url} answered HTTP {resp.status_code} to a range request.")
        total: int | None = None
        content_range = resp.headers.get("content-range", "")
        if "/" in content_range and content_range.rsplit("/", 1)[1].isdigit():
            total = int(content_range.rsplit("/", 1)[1])
        elif resp.status_code == 200 and resp.headers.get("content-length", "").isdigit():
            total = int(resp.headers["content-length"])
        chunks: list[bytes] = []
        got = 0
        for chunk in resp.iter_bytes():
            chunks.append(chunk)
            got += len(chunk)
            if got >= n:
                break
    return b"".join(chunks)[:n], total


def read_gguf_header_remote(url: str, client: httpx.Client | None = None) -> GGUFHeader:
    """Header of a GGUF over HTTP(S) with growing range reads (2 MiB, 4 MiB, ...), so a
    multi-gigabyte file costs a few megabytes of traffic."""
    import httpx

    own = client is None
    client = client or httpx.Client(follow_redirects=True, timeout=httpx.Timeout(30.0))
    try:
        n = _FIRST_PREFIX
        while True:
            try:
                buf, total = _fetch_prefix(client, url, n)
            except httpx.HTTPError as exc:
                raise EngineroomError(f"Could not read {url} ({exc.__class__.__name__}: {first_line(exc)}).") from None
            complete = len(buf) < n or (total is not None and len(buf) >= total)
            try:
                return parse_gguf_header(buf, complete=complete)
            except _NeedMore:
                if n >= _MAX_PREFIX:
                    raise BadInput(f"{url} has a GGUF header larger than {_MAX_PREFIX >> 20} MiB.") from None
                n *= 2
            except BadInput as exc:
                raise _wrap_header_error(url, exc) from None
    finally:
        if own:
            client.close()
