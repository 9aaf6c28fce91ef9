"""One filesystem abstraction for every metadata read memwal makes.

Lance opens data files itself (it gets the same URI and ``storage_options``); all
other reads (Lance manifests, region manifests, version hints, WAL entries, bloom
filters) go through :class:`Storage`, which wraps a :mod:`pyarrow.fs` filesystem
and serves local paths and object stores (``s3://``, ``gs://``, ``az://``) alike.
It also counts requests, so the storage cost of an operation can be measured.

Example:
    >>> import tempfile, pathlib
    >>> d = tempfile.mkdtemp()
    >>> _ = (pathlib.Path(d) / "a.txt").write_bytes(b"hi")
    >>> s = Storage.open(d)
    >>> s.read_bytes("a.txt"), s.read_bytes("missing.txt")
    (b'hi', None)
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import quote, unquote, urlparse

import pyarrow.fs as pafs

from memwal_query.errors import InvalidArgumentError, StorageError, says_missing

#: Listings of a folder that fail on something not found meanwhile, before it is an error.
_LIST_ATTEMPTS = 4

__all__ = ["Storage", "IoStats"]

_TRUE = {"1", "true", "yes", "on"}

# pylance (object_store) storage option keys -> pyarrow S3FileSystem keyword.
_S3_KEYS: dict[str, str] = {
    "aws_access_key_id": "access_key",
    "access_key_id": "access_key",
    "aws_secret_access_key": "secret_key",
    "secret_access_key": "secret_key",
    "aws_session_token": "session_token",
    "session_token": "session_token",
    "aws_region": "region",
    "aws_default_region": "region",
    "region": "region",
    "aws_endpoint": "endpoint_override",
    "aws_endpoint_url": "endpoint_override",
    "endpoint": "endpoint_override",
    "endpoint_url": "endpoint_override",
}
# Keys pylance accepts that only tune its own client; harmless for us.
_S3_IGNORED = {
    "aws_virtual_hosted_style_request",
    "virtual_hosted_style_request",
    "aws_s3_express",
    "timeout",
    "connect_timeout",
    "client_max_retries",
    "client_retry_timeout",
    "aws_server_side_encryption",
    "aws_sse_kms_key_id",
    "aws_sse_bucket_key_enabled",
    "download_retry_count",
    "user_agent",  # pylance adds its own to the options a dataset keeps
    "request_timeout",
    "pool_idle_timeout",
    "aws_conditional_put",
    "aws_unsigned_payload",
    "aws_checksum_algorithm",
    "aws_imdsv1_fallback",
    # pyarrow has no way to skip certificate checks: memwal's own reads still check them
    "allow_invalid_certificates",
}


@dataclass
class IoStats:
    """Storage requests made through one :class:`Storage` (thread-safe counters)."""

    reads: int = 0
    lists: int = 0
    probes: int = 0
    bytes_read: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, *, reads: int = 0, lists: int = 0, probes: int = 0, nbytes: int = 0) -> None:
        """Add to the counters."""
        with self._lock:
            self.reads += reads
            self.lists += lists
            self.probes += probes
            self.bytes_read += nbytes

    @property
    def requests(self) -> int:
        """All requests: reads + lists + existence probes."""
        return self.reads + self.lists + self.probes


def _object_key(uri: str, bucket: str, path: str) -> str:
    """The object key an ``s3://`` URI's path names, as Lance reads it: percent-decoded, ``.``
    and ``..`` segments resolved, no empty segment (``//``, which Lance refuses)."""
    if not bucket:
        msg = f"table uri {uri!r} names no bucket"
        raise InvalidArgumentError(msg)
    key = unquote(path).strip("/")
    if not key:
        return ""
    if "" in key.split("/"):
        msg = f"table uri {uri!r} has an empty path segment ('//')"
        raise InvalidArgumentError(msg)
    return posixpath.normpath("/" + key).lstrip("/")  # ".." at the top stays at the bucket, as in Lance


GCS_RETRY_SECONDS = 20.0
"""How long memwal's own reads of a ``gs://`` table retry a failing request (pyarrow's
default, 15 minutes, made a table without credentials look like a hang)."""


def _s3_filesystem(parsed_netloc: str, options: Mapping[str, str]) -> pafs.FileSystem:
    kwargs: dict[str, object] = {}
    scheme = "https"
    for key, value in options.items():
        k = key.lower()
        if k in _S3_KEYS:
            kwargs[_S3_KEYS[k]] = value
        elif k in ("allow_http", "aws_allow_http"):
            if str(value).lower() in _TRUE:
                scheme = "http"
        elif k == "aws_skip_signature":  # a public bucket: unsigned requests
            kwargs["anonymous"] = str(value).lower() in _TRUE
        elif k == "proxy_url":
            kwargs["proxy_options"] = value
        elif k in _S3_IGNORED:
            continue
        else:
            msg = f"unknown storage option {key!r} for s3://{parsed_netloc}"
            raise InvalidArgumentError(msg)
    if kwargs.get("anonymous"):  # unsigned: keys given beside it are not used (as in pylance)
        for k in ("access_key", "secret_key", "session_token"):
            kwargs.pop(k, None)
    endpoint = kwargs.get("endpoint_override")
    if isinstance(endpoint, str):
        if endpoint.startswith("http://"):
            scheme = "http"
            kwargs["endpoint_override"] = endpoint[len("http://") :]
        elif endpoint.startswith("https://"):
            kwargs["endpoint_override"] = endpoint[len("https://") :]
    kwargs["scheme"] = scheme
    try:
        return pafs.S3FileSystem(**kwargs)
    except Exception as err:  # pyarrow raises ArrowInvalid / OSError
        msg = f"cannot configure S3 access for s3://{parsed_netloc}: {err}"
        raise StorageError(msg) from err


class Storage:
    """A table root on some filesystem, with relative-path reads and request counts.

    Use :meth:`open`; paths given to the methods are relative to the table root and
    use ``/``.
    """

    __slots__ = ("uri", "storage_options", "_fs", "_root", "_url", "stats")

    def __init__(
        self, uri: str, fs: pafs.FileSystem, root: str, storage_options: Mapping[str, str], *, url: bool = False
    ) -> None:
        self.uri = uri
        self.storage_options: dict[str, str] = dict(storage_options)
        self._fs = fs
        self._root = root.rstrip("/")
        self._url = url  # ``uri`` is a URL whose path Lance percent-decodes
        self.stats = IoStats()

    @classmethod
    def open(cls, uri: str, storage_options: Mapping[str, str] | None = None) -> Storage:
        """Open a table root.

        Args:
            uri: A local path, ``file://`` URI, or object store URI (``s3://bucket/t``).
            storage_options: The same keys pylance accepts (``aws_access_key_id``,
                ``aws_endpoint``, ``allow_http``, ``aws_region`` ...).

        Returns:
            A :class:`Storage` rooted at ``uri``.

        Raises:
            InvalidArgumentError: The URI or an option is not understood.
            StorageError: The filesystem cannot be configured.
        """
        if not isinstance(uri, (str, os.PathLike)):
            msg = f"table uri must be a string or path, got {type(uri).__name__}"
            raise InvalidArgumentError(msg)
        uri = os.fspath(uri)
        options = {str(k): str(v) for k, v in (storage_options or {}).items()}
        parsed = urlparse(uri)
        if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and os.name == "nt"):
            # a file:// URI's path is percent-encoded (RFC 8089), as pylance reads it
            path = unquote(parsed.path) if parsed.scheme == "file" else uri
            path = os.path.abspath(os.path.expanduser(path))
            return cls(path, pafs.LocalFileSystem(), path, options)
        if parsed.scheme in ("s3", "s3a"):
            key = _object_key(uri, parsed.netloc, parsed.path)
            fs = _s3_filesystem(parsed.netloc, options)
            root = f"{parsed.netloc}/{key}" if key else parsed.netloc
            # the URI Lance gets names the same key: Lance percent-decodes it
            return cls(f"s3://{parsed.netloc}/{quote(key)}".rstrip("/"), fs, root, options, url=True)
        try:
            fs, root = pafs.FileSystem.from_uri(uri)
        except Exception as err:
            msg = f"unsupported table uri {uri!r}: {err}"
            raise InvalidArgumentError(msg) from err
        if isinstance(fs, pafs.GcsFileSystem):
            # pyarrow's default retries a failed request (no credentials, no network) for 15 min
            fs = pafs.GcsFileSystem(retry_time_limit=timedelta(seconds=GCS_RETRY_SECONDS))
        return cls(uri.rstrip("/"), fs, root, options)

    def child_uri(self, rel: str) -> str:
        """The URI of ``rel`` (for handing to Lance)."""
        return f"{self.uri}/{quote(rel) if self._url else rel}".rstrip("/")

    def local_path(self, rel: str) -> str | None:
        """The operating-system path of ``rel`` on local disk; None on an object store."""
        if not isinstance(self._fs, pafs.LocalFileSystem):
            return None
        return os.path.normpath(self._path(rel))

    def _path(self, rel: str) -> str:
        return f"{self._root}/{rel}" if rel else self._root

    def read_bytes(self, rel: str, limit: int | None = None) -> bytes | None:
        """Read a whole file, or its first ``limit`` bytes; ``None`` when it does not exist.

        A ``limit`` bounds the memory a damaged or hostile file can take: a decoder
        that accepts at most ``n`` bytes reads ``n + 1`` and rejects a longer result.
        """
        got = self._read(rel, lambda f: (0, f.read() if limit is None else f.read(limit)), stream=True)
        return None if got is None else got[1]

    def read_tail(self, rel: str, n: int) -> tuple[int, bytes] | None:
        """The size of file ``rel`` and its last ``n`` bytes (fewer in a shorter file); ``None``
        when it does not exist."""

        def tail(f: Any) -> tuple[int, bytes]:
            size = f.size()
            f.seek(max(size - n, 0))
            return size, f.read()

        return self._read(rel, tail, stream=False)

    def _read(self, rel: str, read: Callable[[Any], tuple[int, bytes]], *, stream: bool) -> tuple[int, bytes] | None:
        try:
            opener = self._fs.open_input_stream if stream else self._fs.open_input_file
            with opener(self._path(rel)) as f:
                size, data = read(f)
        except (FileNotFoundError, NotADirectoryError):  # the latter: a file where a directory is
            self.stats.add(reads=1)
            return None
        except (OSError, ValueError) as err:  # ValueError: pyarrow's ArrowInvalid (a NUL in a path ...)
            if says_missing(err):
                self.stats.add(reads=1)
                return None
            msg = f"cannot read {self.child_uri(rel)}: {err}"
            raise StorageError(msg) from err
        self.stats.add(reads=1, nbytes=len(data))
        return size, bytes(data)

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` exists (file or directory)."""
        return bool(self._info(rel).type != pafs.FileType.NotFound)

    def size(self, rel: str) -> int | None:
        """The size of file ``rel`` in bytes (None: it does not exist or is no file)."""
        info = self._info(rel)
        return int(info.size) if info.type == pafs.FileType.File and info.size is not None else None

    def _info(self, rel: str) -> pafs.FileInfo:
        self.stats.add(probes=1)
        try:
            return self._fs.get_file_info(self._path(rel))
        except (OSError, ValueError) as err:
            msg = f"cannot stat {self.child_uri(rel)}: {err}"
            raise StorageError(msg) from err

    def write_bytes_if_absent(self, rel: str, data: bytes) -> bool:
        """Create ``rel`` with ``data`` unless it exists; True if this call created it.

        Only the writer modules use this (readers never write). A local file appears
        whole or not at all: written beside it under a hidden temporary name, then
        hard-linked into place (which refuses an existing file). Creating it in place
        left an empty file when the writer was killed between create and write (an empty
        region manifest made the whole table unreadable). Object stores get
        check-then-put, which is safe for the callers (identical, deterministic content).
        """
        path = self._path(rel)
        if isinstance(self._fs, pafs.LocalFileSystem):
            folder, name = os.path.split(path)
            os.makedirs(folder, exist_ok=True)
            if os.path.exists(path):
                return False
            tmp = os.path.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")
            try:
                with open(tmp, "xb") as f:
                    f.write(data)
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise
                except OSError:  # a filesystem without hard links: created in place
                    with open(path, "xb") as f:
                        f.write(data)
            except FileExistsError:
                return False
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            return True
        if self.exists(rel):
            return False
        try:
            with self._fs.open_output_stream(path) as f:
                f.write(data)
        except OSError as err:
            msg = f"cannot write {self.child_uri(rel)}: {err}"
            raise StorageError(msg) from err
        return True

    def list_dir(self, rel: str) -> list[tuple[str, bool]]:
        """Entries directly under ``rel`` as ``(name, is_dir)``; empty if it is missing.

        A folder created while it is listed (a writer's first write makes ``_mem_wal/``, a
        region's folder, its ``manifest/`` and ``wal/``), or an entry removed meanwhile,
        fails pyarrow's local listing with the "not found" it met first: it is listed again.
        """
        selector = pafs.FileSelector(self._path(rel), allow_not_found=True, recursive=False)
        attempts = _LIST_ATTEMPTS
        while True:
            self.stats.add(lists=1)
            try:
                infos = self._fs.get_file_info(selector)
            except (OSError, ValueError) as err:
                attempts -= 1
                if attempts and says_missing(err):
                    continue
                msg = f"cannot list {self.child_uri(rel)}: {err}"
                raise StorageError(msg) from err
            return [(i.base_name, i.type == pafs.FileType.Directory) for i in infos]

    def delete(self, rel: str, *, directory: bool) -> None:
        """Remove the file (or, with ``directory``, the directory and all under it) at ``rel``;
        already gone is fine (another collector got there first)."""
        path = self._path(rel)
        try:
            if directory:
                self._fs.delete_dir(path)
            else:
                self._fs.delete_file(path)
        except FileNotFoundError:
            return
        except OSError as err:
            if says_missing(err):
                return
            msg = f"cannot delete {self.child_uri(rel)}: {err}"
            raise StorageError(msg) from err
