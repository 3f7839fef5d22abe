"""Which store a coordinator URL names (its own module: the stores import `store`)."""

from __future__ import annotations

from atomix.coordinator.store import CoordinatorError, Store, safe_url


def open_store(url: str) -> Store:
    """The store a coordinator URL names: ``sqlite:///path`` or ``postgresql://...``."""
    if not isinstance(url, str) or not url:
        raise CoordinatorError(f"coordinator: expected a URL string, got {url!r}")
    if url.startswith("sqlite:///"):
        from atomix.coordinator.sqlite_store import SQLiteStore

        return SQLiteStore(url)
    if url.startswith(("postgresql://", "postgres://")):
        from atomix.coordinator.postgres import PostgresStore

        return PostgresStore(url)
    raise CoordinatorError(
        f"coordinator URL {safe_url(url)!r}: allowed are 'sqlite:///PATH' (one host, no server) and "
        "'postgresql://USER@HOST/DB' (many hosts)"
    )
