"""Containment of paths read from a table's own metadata.

A region manifest names each flushed generation by a path relative to its region
folder (``_mem_wal/{region_id}/``). Readers often run over tables they do not
control, so such a path is untrusted: it must stay inside the region folder under
every reading a storage layer may give it. :func:`generation_rel` is the one rule,
called wherever a path is built from metadata; it rejects, as
:class:`~memwal_query.errors.MemWalCorruptionError`:

* ``..`` segments that climb out of the region folder (``a/../b`` is fine);
* absolute paths, URLs and drive letters (``/x``, ``s3://b/x``, ``file:x``, ``C:x``);
* backslashes, NUL and other control characters;
* any of the above hidden behind percent-encoding (``%2e%2e``, also encoded twice);
* on local disk, a symlink (of the region folder or below) that resolves elsewhere, or one
  inside a generation folder that resolves outside it; region manifests and WAL files are not
  read through any symlink (:func:`check_unlinked`).

Region ids are directory names too: :func:`region_dir` accepts only canonical UUIDs.

Example:
    >>> normalise_relative("0a1b2c3d_gen_1/")
    '0a1b2c3d_gen_1'
    >>> normalise_relative("%2e%2e/secret")
    Traceback (most recent call last):
    ...
    ValueError: climbs out of the region folder after percent-decoding
"""

from __future__ import annotations

import os
import re
import uuid
from typing import Final
from urllib.parse import unquote

from memwal_query.errors import MemWalCorruptionError
from memwal_query.format.storage import Storage

__all__ = ["check_unlinked", "normalise_relative", "region_dir", "generation_rel", "linked", "removable", "shown"]

_MAX_CHARS: Final = 1024
_MAX_DECODE_ROUNDS: Final = 4
_SHOWN_CHARS: Final = 200
_SCHEME: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")


def shown(value: object) -> str:
    """``repr(value)`` cut to a readable length (one line: ``repr`` escapes newlines)."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS]}…({len(text)} chars)"


def _decodings(path: str) -> list[str]:
    """``path`` and each successive percent-decoding of it, until it stops changing."""
    forms = [path]
    for _ in range(_MAX_DECODE_ROUNDS):
        decoded = unquote(forms[-1])
        if decoded == forms[-1]:
            return forms
        forms.append(decoded)
    msg = f"is percent-encoded more than {_MAX_DECODE_ROUNDS} times"
    raise ValueError(msg)


def _segments(form: str, how: str) -> list[str]:
    if _CONTROL.search(form):
        raise ValueError(f"contains a NUL or control character{how}")
    if "\\" in form:
        raise ValueError(f"contains a backslash{how}")
    if _SCHEME.match(form):
        raise ValueError(f"is a URL or drive path{how}")
    if form.startswith(("/", "~")):
        raise ValueError(f"is absolute{how}")
    stack: list[str] = []
    for part in form.split("/"):
        if part in ("", "."):
            continue
        if part != "..":
            stack.append(part)
        elif stack:
            stack.pop()
        else:
            raise ValueError(f"climbs out of the region folder{how}")
    if not stack:
        raise ValueError(f"names the region folder itself{how}")
    return stack


def normalise_relative(path: str) -> str:
    """Normalise a path relative to a region folder, or say why it may leave it.

    Args:
        path: The path as stored in the table's metadata.

    Returns:
        The path with ``.``, empty and resolved ``..`` segments removed.

    Raises:
        ValueError: The path (or a percent-decoding of it) is not a relative path
            that stays inside the folder; the message says why.
    """
    if not isinstance(path, str) or not path:
        raise ValueError("is empty")
    if len(path) > _MAX_CHARS:
        raise ValueError(f"is longer than {_MAX_CHARS} characters")
    forms = _decodings(path)
    normalised = "/".join(_segments(path, ""))
    for form in forms[1:]:
        _segments(form, " after percent-decoding")
    return normalised


def region_dir(region_id: str, *, table: str) -> str:
    """The folder of a region relative to the table root, ``_mem_wal/{region_id}``.

    Args:
        region_id: The region id, as found in storage or metadata.
        table: The table URI (for the error message).

    Returns:
        ``_mem_wal/{region_id}``.

    Raises:
        MemWalCorruptionError: The id is not a canonical (lowercase, dashed) UUID.
    """
    try:
        canonical = str(uuid.UUID(region_id))
    except (ValueError, TypeError, AttributeError):
        canonical = None
    if canonical != region_id:
        msg = f"{table}: region id {shown(region_id)} is not a lowercase UUID (it names a folder under _mem_wal/)"
        raise MemWalCorruptionError(msg)
    return f"_mem_wal/{region_id}"


def _inside(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def _symlink_escape(storage: Storage, region: str, rel: str) -> str | None:
    """Why ``rel`` resolves outside the region folder on local disk, or a symlink below it
    resolves outside ``rel`` itself (Lance would read or write there), or None."""
    root = storage.local_path("")
    if root is None:
        return None
    real_root = os.path.realpath(root)
    real_region = os.path.realpath(storage.local_path(region) or root)
    if not _inside(real_region, real_root):
        return f"the region folder is a symlink to {real_region}, outside the table"
    real = os.path.realpath(storage.local_path(rel) or root)
    if not _inside(real, real_region) or real == real_region:
        return f"a symlink resolves it to {real}, outside the region folder"
    return _link_out_of(real)


#: Generation folders found without a symlink leaving them (a flushed generation does not
#: change; its dataset is kept open across snapshots too): checked once per process.
_NO_LINK_OUT: set[str] = set()
_NO_LINK_OUT_MAX = 100_000


def _link_out_of(folder: str) -> str | None:
    """Why a symlink below ``folder`` (a real path; none when it is a file or missing)
    resolves outside it, or None (~0.2 ms a generation folder on local disk, then remembered)."""
    if folder in _NO_LINK_OUT:
        return None
    why = _walk_links(folder)
    if why is None and os.path.isdir(folder):
        if len(_NO_LINK_OUT) >= _NO_LINK_OUT_MAX:
            _NO_LINK_OUT.clear()
        _NO_LINK_OUT.add(folder)
    return why


def _walk_links(folder: str) -> str | None:
    stack = [folder]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:  # not a folder, or gone: whoever opens it says so
            continue
        for e in entries:
            if e.is_symlink():
                real = os.path.realpath(e.path)
                if not _inside(real, folder):
                    return f"a symlink in it ({e.path}) resolves to {real}, outside it"
            elif e.is_dir(follow_symlinks=False):
                stack.append(e.path)
    return None


def linked(storage: Storage, rel: str) -> str | None:
    """On local disk, why ``rel`` may not be what the table holds: it, or a folder above it up
    to the table root, is a symlink (pylance writes none); None elsewhere, or when none is."""
    path = storage.local_path("")
    if path is None:
        return None
    for part in (p for p in rel.split("/") if p):
        path = os.path.join(path, part)
        if os.path.islink(path):
            return f"{path} is a symlink (to {os.path.realpath(path)})"
    return None


def check_unlinked(storage: Storage, region_id: str, rel: str, what: str) -> None:
    """Raise :class:`MemWalCorruptionError` when ``rel`` (a region's manifest or WAL file)
    lies under a symlink (:func:`linked`): a reader never reads another table's files."""
    link = linked(storage, rel)
    if link is not None:
        msg = f"{storage.uri}: region {region_id}: {what} {storage.child_uri(rel)} is not read: {link}"
        raise MemWalCorruptionError(msg)


def removable(storage: Storage, region_id: str, rel: str) -> str | None:
    """Why deleting ``rel`` (a region's generation folder or WAL file) could delete anything
    but what lies in the region folder on local disk (it, or a folder above it up to the
    table, is a symlink; a symlink under it leaves it), or None."""
    region = region_dir(region_id, table=storage.uri)
    try:
        return linked(storage, rel) or _symlink_escape(storage, region, rel)
    except ValueError as err:
        return str(err)


def generation_rel(storage: Storage, region_id: str, path: str, *, what: str, links: bool = True) -> str:
    """Where a path read from a region's metadata points, relative to the table root.

    Args:
        storage: The table's storage.
        region_id: The region whose metadata holds ``path``.
        path: The untrusted path, relative to the region folder.
        what: What the path names, e.g. ``"flushed generation 3"`` (for messages).
        links: Whether to check symlinks on local disk too (three ``realpath`` calls and a
            walk: a caller holding the folder's dataset open since it was checked skips them).

    Returns:
        ``_mem_wal/{region_id}/{normalised path}``.

    Raises:
        MemWalCorruptionError: The path leaves the region folder (one line naming
            the table, region and the offending value).
    """
    region = region_dir(region_id, table=storage.uri)
    try:
        rel = f"{region}/{normalise_relative(path)}"
        reason = _symlink_escape(storage, region, rel) if links else None
    except ValueError as err:
        reason = str(err)
    if reason is not None:
        msg = f"{storage.uri}: region {region_id}: {what} path {shown(path)} leaves the region folder: {reason}"
        raise MemWalCorruptionError(msg)
    return rel
