"""File names of the MemWAL format: bit-reversed region manifest / WAL names and
Lance manifest names (pure functions, no I/O).

Example:
    >>> bitrev64_name(1)[:4]
    '1000'
    >>> parse_bitrev64_name(bitrev64_name(6) + ".binpb")
    6
    >>> lance_manifest_file_name(1)
    '18446744073709551614.manifest'
    >>> parse_lance_manifest_file_name("18446744073709551614.manifest")
    1
"""

from __future__ import annotations

from typing import Final

__all__ = ["bitrev64_name", "parse_bitrev64_name", "lance_manifest_file_name", "parse_lance_manifest_file_name"]

_U64_MAX: Final = (1 << 64) - 1


def bitrev64_name(n: int) -> str:
    """Return the bit-reversed 64-character binary name of ``n``.

    Used for region manifest versions and WAL positions: ``1 -> "1000…0"``.

    Args:
        n: A value in ``[0, 2**64)``.

    Returns:
        The 64-character name, without extension.

    Raises:
        ValueError: ``n`` is out of range.
    """
    if not 0 <= n <= _U64_MAX:
        raise ValueError(f"bitrev64 value out of range: {n}")
    return format(n, "064b")[::-1]


def parse_bitrev64_name(name: str) -> int | None:
    """Inverse of :func:`bitrev64_name`.

    Args:
        name: A file name; an extension (``.binpb``, ``.arrow``) is ignored.

    Returns:
        The value, or None when the name is not a bitrev64 name.
    """
    stem = name.split(".", 1)[0]
    if len(stem) != 64 or stem.strip("01"):
        return None
    return int(stem[::-1], 2)


def lance_manifest_file_name(version: int) -> str:
    """Return the V2-scheme Lance manifest file name of ``version``.

    Args:
        version: Dataset version in ``[0, 2**64)``.

    Returns:
        ``"{u64::MAX - version:020d}.manifest"``.

    Raises:
        ValueError: ``version`` is out of range.
    """
    if not 0 <= version <= _U64_MAX:
        raise ValueError(f"Lance version out of range: {version}")
    return f"{_U64_MAX - version:020d}.manifest"


def parse_lance_manifest_file_name(name: str) -> int | None:
    """Inverse of :func:`lance_manifest_file_name`.

    A 20-digit stem is read with the V2 scheme; a shorter all-digit stem is
    read as a V1 name (``{version}.manifest``).

    Args:
        name: A file name in ``_versions/``.

    Returns:
        The dataset version, or None when the name is not a manifest name.
    """
    if not name.endswith(".manifest"):
        return None
    stem = name[: -len(".manifest")]
    if not stem.isascii() or not stem.isdigit():
        return None
    value = int(stem)
    if len(stem) == 20:
        return _U64_MAX - value if value <= _U64_MAX else None
    return value
