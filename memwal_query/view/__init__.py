"""The frozen merged view every access path reads (:class:`TableView`) and how one is opened."""

from __future__ import annotations

from memwal_query.view.open import open_view
from memwal_query.view.table_view import HasView, OpenTimings, ReadSettings, TableView, view_of

__all__ = ["HasView", "OpenTimings", "ReadSettings", "TableView", "open_view", "view_of"]
