"""memwal_write: feed MemWAL tables (from Spark or Arrow) through pylance's writer.

Not implemented yet: see the project's issues (region routing and the Spark writer).
"""

from __future__ import annotations

__all__: list[str] = []
