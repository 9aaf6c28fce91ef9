"""Opening a Lance table for memwal, with errors that name what the user gave.

Lance's errors carry the Rust source lines they were raised at
(``.../rust/lance-table/src/io/commit.rs:653:26``) and name local paths without their
leading ``/``; a missing table is a generic ``ValueError``. Readers, writers and the
merger open tables through :func:`open_lance`: a missing table is a
:class:`TableNotFoundError` naming the URI as the user wrote it; any other failure a
:class:`ManifestError` with Lance's message cleaned by :func:`lance_message`.

Example:
    >>> lance_message(ValueError("Not found: t/_versions, /src/lance/rust/io/commit.rs:653:26"))
    'Not found: t/_versions'
"""

from __future__ import annotations

import re

import lance
import lance.fragment

from memwal_query.errors import (
    ManifestError,
    MemWalCorruptionError,
    MemWalError,
    TableNotFoundError,
    is_panic,
    says_missing,
)
from memwal_query.format.storage import Storage

__all__ = [
    "REFRESH_AND_RETRY",
    "base_read_error",
    "fragment_file_names",
    "lance_dataset",
    "lance_message",
    "no_longer_readable",
    "open_lance",
    "require_table",
    "vanished_error",
]

# ", /any/path/file.rs:12:34" (a Rust source location Lance appends to its errors)
_RUST_LOCATION = re.compile(r",?\s*[^\s,]*\.rs:\d+:\d+")


def lance_message(err: BaseException) -> str:
    """Lance's error text on one line, without the Rust source locations it carries."""
    text = _RUST_LOCATION.sub("", str(err))
    return " ".join(text.split()) or type(err).__name__


def _named(given: str, storage: Storage) -> str:
    return given if given.rstrip("/") == storage.uri.rstrip("/") else f"{given} ({storage.uri})"


def require_table(storage: Storage, given: str, purpose: str = "") -> None:
    """Raise :class:`TableNotFoundError` unless a Lance table is at ``storage``.

    Args:
        storage: The table root.
        given: The URI as the caller wrote it (named in the error).
        purpose: What the table was opened for, e.g. ``" for writing"``.
    """
    if not storage.exists("_versions"):
        msg = f"no Lance table at {_named(given, storage)}{purpose} (no _versions directory)"
        raise TableNotFoundError(msg)


def open_lance(storage: Storage, given: str, purpose: str = "", version: int | None = None) -> lance.LanceDataset:
    """The Lance dataset at ``storage`` (its latest version, or ``version``).

    Args:
        storage: The table root.
        given: The URI as the caller wrote it (named in errors).
        purpose: What the table is opened for, e.g. ``" for writing"``.
        version: A version to open (default: the latest).

    Raises:
        TableNotFoundError: No Lance table there (or no such version).
        ManifestError: Lance cannot open it.
    """
    require_table(storage, given, purpose)
    return lance_dataset(storage, given, purpose, version)


def lance_dataset(storage: Storage, given: str, purpose: str = "", version: int | None = None) -> lance.LanceDataset:
    """:func:`open_lance` without the existence probe (for callers that made it already).

    Raises:
        TableNotFoundError: Lance finds no table there (or no such version).
        ManifestError: Lance cannot open it.
    """
    try:
        return lance.dataset(storage.uri, version=version, storage_options=dict(storage.storage_options) or None)
    except BaseException as err:  # a damaged manifest can panic in Lance's decoder (a BaseException)
        if not isinstance(err, (ValueError, OSError, RuntimeError)) and not is_panic(err):
            raise
        text = lance_message(err)
        at = f"{_named(given, storage)}" + (f" (version {version})" if version is not None else "")
        if any(s in text.lower() for s in ("not found", "does not exist", "no such")):
            msg = f"no Lance table at {at}{purpose}: {text}"
            if version is not None and storage.exists("_versions"):
                latest = _latest_version(storage)
                msg = f"table {_named(given, storage)} has no version {version}{purpose} (latest: {latest})"
            raise TableNotFoundError(msg) from err
        msg = f"cannot open Lance table at {at}{purpose}: {text}"
        raise ManifestError(msg) from err


def _latest_version(storage: Storage) -> str:
    """The table's latest version, for an error message ("unknown" when it cannot be read)."""
    try:
        return str(lance.dataset(storage.uri, storage_options=dict(storage.storage_options) or None).version)
    except (ValueError, OSError, RuntimeError):
        return "unknown"


def fragment_file_names(frag: lance.fragment.LanceFragment) -> list[str]:
    """The files of a Lance fragment under its dataset's root: its data files and its deletion
    file (not those kept under another base path, a ``base_id``: a shallow clone's, or data
    written to ``target_bases``), relative to the root."""
    meta = frag.metadata
    names = [f"data/{f.path}" for f in meta.files if getattr(f, "base_id", None) is None]
    d = meta.deletion_file
    if d is not None and getattr(d, "base_id", None) is None:
        names.append(d.path(meta.id))
    return names


def base_read_error(
    base: lance.LanceDataset, what: str, err: BaseException, frag: lance.fragment.LanceFragment | None = None
) -> MemWalError:
    """The error for a failed read of ``what`` (a base fragment) of a snapshot's base ``base``.

    A file missing while the snapshot's version is still the table's latest was not removed
    by a merge, compaction or clean-up since: the table is damaged
    (:class:`MemWalCorruptionError`); after a newer version, it was most likely cleaned up
    (refresh the table). Any other failure names the file as Lance reports it.
    """
    text, version = lance_message(err), base.version
    files = f"; files {', '.join(fragment_file_names(frag))}" if frag is not None else ""
    where = f"{what} of {base.uri} (base version {version}{files})"
    if not says_missing(err):
        return MemWalError(f"{where} cannot be read: {text}")
    try:
        latest = base.latest_version
    except (OSError, ValueError, RuntimeError):
        latest = None
    if latest is None:
        return _vanished(where, base.uri, text)
    if latest == version:
        msg = f"{where} cannot be read ({text}): that version is still the latest, so a file it needs is missing"
        return MemWalCorruptionError(msg + ": the table is damaged")
    how = "merged, compacted or garbage-collected"
    return no_longer_readable(f"{where} is no longer readable (the latest version is {latest})", how, text)


def vanished_error(ds: lance.LanceDataset, what: str, err: BaseException) -> MemWalError | None:
    """The error for a failed read of ``what`` in ``ds`` (the base or a generation) when
    Lance says a file is missing and ``ds`` itself no longer opens, or has a newer version
    (the file was compacted and cleaned up since); None otherwise."""
    if not says_missing(err):
        return None
    try:
        latest = ds.latest_version
    except (OSError, ValueError, RuntimeError):
        return _vanished(what, ds.uri, lance_message(err))
    if latest != ds.version:
        named = what if ds.uri in what else f"{what} of {ds.uri}"
        where = f"{named} (version {ds.version}) is no longer readable (the latest version is {latest})"
        return no_longer_readable(where, "merged, compacted or garbage-collected", lance_message(err))
    return None


def _vanished(what: str, uri: str, text: str) -> MemWalError:
    msg = (
        f"{what} cannot be read ({text}), nor can {uri}: it was removed after this snapshot was opened (a "
        f"generation merged and garbage-collected, or the table deleted or moved); {REFRESH_AND_RETRY}"
    )
    return MemWalError(msg)


#: What a snapshot's reader does when the table removed a file since it opened.
REFRESH_AND_RETRY = "refresh() the table and retry"


def no_longer_readable(where: str, how: str, text: str) -> MemWalError:
    """The error for a file of a snapshot that the table removed since it was opened
    (``how``: merged, compacted, garbage-collected): refresh and retry; ``text``: the cause."""
    return MemWalError(f"{where}: it was {how} after this snapshot was opened; {REFRESH_AND_RETRY} ({text})")
