"""The PostgreSQL database a benchmark runs against: created when it does not exist yet,
so a bench runs on a fresh machine; when the server cannot be reached, one line says how
to point the bench at one, and the bench stops there."""

from __future__ import annotations

import sys
from urllib.parse import urlsplit


def ensure_database(url: str) -> None:
    """Create the database named by `url` (postgres://user@host:port/name) if missing."""
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    try:
        # Any database of the server will do for CREATE DATABASE: `postgres` always exists.
        with psycopg.connect(url.replace(parts.path, "/postgres", 1), autocommit=True) as db:
            exists = db.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            if not exists:
                db.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                print(f"created the database {name} on {parts.hostname}:{parts.port or 5432}")
    except psycopg.OperationalError as error:
        first_line = str(error).strip().splitlines()[0]
        sys.exit(
            f"This bench needs PostgreSQL at {parts.hostname}:{parts.port or 5432} "
            f"({first_line}); start it or set DATABASE_URL=postgres://user@host:port/name."
        )
