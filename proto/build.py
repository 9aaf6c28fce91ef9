#!/usr/bin/env python3
"""Regenerate the ``memwal_proto`` package from the ``.proto`` files in this folder.

Usage::

    python proto/build.py            # writes into <repo>/memwal_proto/
    python proto/build.py --out DIR  # writes into DIR (used by the tests)

Requires ``grpcio-tools`` (it bundles ``protoc`` and the well-known types). The
output depends on the bundled protoc version, so regenerate with the pinned
``grpcio-tools`` to keep the committed files byte-identical.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROTO_DIR.parent
DEFAULT_OUT = REPO_ROOT / "memwal_proto"
PROTOS = ("lance_manifest.proto", "mem_wal.proto")

INIT_TEXT = '''"""Generated protobuf modules for the Lance / MemWAL on-storage format.

GENERATED CODE -- DO NOT EDIT. Sources: ``proto/*.proto``.
Rebuild with ``python proto/build.py`` (needs ``grpcio-tools``); the test
``tests/test_proto_generated.py`` checks these files are up to date.
"""
'''

# Generated modules import each other by bare module name
# (``import foo_pb2 as foo__pb2``); rewrite to package-relative imports.
_LOCAL_IMPORT = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)


def _fix_imports(text: str, local_modules: set[str]) -> str:
    def repl(match: re.Match[str]) -> str:
        module, alias = match.group(1), match.group(2)
        if module in local_modules:
            return f"from . import {module} as {alias}"
        return match.group(0)

    return _LOCAL_IMPORT.sub(repl, text)


def build(out_dir: Path) -> list[Path]:
    """Run protoc and write the package into ``out_dir``.

    Args:
        out_dir: Destination folder; created if missing. Existing generated
            files are overwritten.

    Returns:
        The files written, sorted by name.
    """
    from grpc_tools import protoc

    include = str(resources.files("grpc_tools") / "_proto")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"--proto_path={PROTO_DIR}",
            f"--proto_path={include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            *PROTOS,
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit code {rc}")
        generated = sorted(Path(tmp).iterdir())
        local = {p.stem for p in generated if p.suffix == ".py"}
        written: list[Path] = []
        for src in generated:
            text = _fix_imports(src.read_text(encoding="utf-8"), local)
            dst = out_dir / src.name
            dst.write_text(text, encoding="utf-8", newline="\n")
            written.append(dst)
    init = out_dir / "__init__.py"
    init.write_text(INIT_TEXT, encoding="utf-8", newline="\n")
    written.append(init)
    return sorted(written)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    args = parser.parse_args(argv)
    out: Path = args.out
    for path in build(out):
        print(path)
    # Drop stale bytecode so a fresh import sees the new modules.
    shutil.rmtree(out / "__pycache__", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
