"""Version checks at the engine boundary.

memwal hands DataFusion a duck-typed ``pyarrow.dataset.Dataset`` (works with
DataFusion 54 and 55). pylance's native ``lance.FFILanceTableProvider`` is compiled
against one DataFusion major; handing it to another major fails deep inside
DataFusion, so any code path that uses it must call :func:`require_ffi_compatible`
first and get one clear error instead.

Example:
    >>> datafusion_major() >= 54
    True
"""

from __future__ import annotations

import functools
import sys
from importlib.metadata import PackageNotFoundError, version

from memwal_query.errors import UnsupportedVersionError

__all__ = ["datafusion_major", "LANCE_FFI_DATAFUSION_MAJOR", "require_ffi_compatible", "SUPPORTED_DATAFUSION"]

# pylance 14.0.2's FFI table provider is built for DataFusion 54 (measured:
# DataFusion 55 raises "Incompatible DataFusion table provider major version 54").
LANCE_FFI_DATAFUSION_MAJOR = {"14": 54}
SUPPORTED_DATAFUSION = (54, 55)


_MODULES = {"datafusion": "datafusion", "pylance": "lance"}


@functools.cache  # read once: parsing a package's metadata costs ~1 ms, on every SQL call before
def _version(pkg: str) -> str:
    loaded = getattr(sys.modules.get(_MODULES.get(pkg, pkg)), "__version__", None)
    if isinstance(loaded, str):  # the module in use says (no metadata to parse)
        return loaded
    try:
        return version(pkg)
    except PackageNotFoundError as err:
        msg = f"{pkg} is not installed"
        raise UnsupportedVersionError(msg) from err


def datafusion_major() -> int:
    """The installed DataFusion major version."""
    return int(_version("datafusion").split(".")[0])


def require_ffi_compatible() -> None:
    """Raise unless pylance's FFI table provider matches the installed DataFusion.

    Raises:
        UnsupportedVersionError: The majors differ (naming both versions).
    """
    lance_v = _version("pylance")
    df_v = _version("datafusion")
    want = LANCE_FFI_DATAFUSION_MAJOR.get(lance_v.split(".")[0])
    have = int(df_v.split(".")[0])
    if want is None or want != have:
        msg = (
            f"pylance {lance_v}'s FFI table provider is built for DataFusion "
            f"{want if want is not None else 'an unknown major'}, but DataFusion {df_v} is installed; "
            "memwal's default (duck-typed) provider works with DataFusion "
            f"{', '.join(map(str, SUPPORTED_DATAFUSION))}"
        )
        raise UnsupportedVersionError(msg)


def check_datafusion_supported() -> None:
    """Raise when the installed DataFusion major is outside the tested range."""
    have = datafusion_major()
    if have not in SUPPORTED_DATAFUSION:
        msg = (
            f"DataFusion {_version('datafusion')} is installed; memwal is tested with majors "
            f"{', '.join(map(str, SUPPORTED_DATAFUSION))} (pin datafusion>=54,<56)"
        )
        raise UnsupportedVersionError(msg)
