"""The benches on PostgreSQL create their database on a fresh machine, and say in one
line where to point them when no server answers (bench/pg_database.py)."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from bench.pg_database import ensure_database

SERVER = "postgres://postgres@127.0.0.1:5432"


def _server_answers() -> bool:
    try:
        psycopg.connect(f"{SERVER}/postgres", connect_timeout=2).close()
    except psycopg.OperationalError:
        return False
    return True


@pytest.mark.skipif(not _server_answers(), reason="needs the machine's PostgreSQL")
def test_a_missing_database_is_created_and_an_existing_one_kept():
    name = f"bench_db_{uuid.uuid4().hex[:8]}"
    try:
        ensure_database(f"{SERVER}/{name}")
        with psycopg.connect(f"{SERVER}/{name}") as db:
            db.execute("CREATE TABLE kept (x int)")
            db.commit()
        ensure_database(f"{SERVER}/{name}")
        with psycopg.connect(f"{SERVER}/{name}") as db:
            assert db.execute("SELECT count(*) FROM kept").fetchone() == (0,)
    finally:
        with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{name}"')


def test_no_server_is_one_line_naming_the_address_and_the_setting():
    # Port 1 on the loopback: nothing listens there, so the connection is refused at once.
    with pytest.raises(SystemExit) as stopped:
        ensure_database("postgres://postgres@127.0.0.1:1/armature_bench")
    message = str(stopped.value.code)
    assert "\n" not in message
    assert "127.0.0.1:1" in message and "DATABASE_URL=" in message
