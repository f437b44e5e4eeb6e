"""The PostgreSQL source's rules for a read-only source: what it refuses and what its
messages tell an administrator to run."""

from __future__ import annotations

import pytest

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.sources.base import SourceError
from airflow_provider_dblog.sources.factory import parse_source_config
from airflow_provider_dblog.sources.postgres.setup import check_publication, check_readable

SECTION = {
    "type": "postgres",
    "name": "shop",
    "dsn": "host=db dbname=shop user=reader",
    "tables": ["public.accounts"],
    "read_only": True,
}


def test_read_only_is_read_from_the_section_and_refuses_altering_tables() -> None:
    assert parse_source_config(SECTION).read_only
    with pytest.raises(SourceError, match="replica_identity_full alters the captured tables"):
        parse_source_config({**SECTION, "replica_identity_full": True})
    with pytest.raises(SourceError, match="read_only"):
        parse_source_config({**SECTION, "read_only": "yes"})


def test_a_role_that_may_not_read_a_table_is_told_the_grant() -> None:
    check_readable([])
    with pytest.raises(SourceError, match=r"GRANT SELECT ON public\.orders TO it"):
        check_readable([TableRef("public", "orders")])


def test_a_missing_publication_names_the_statement_its_owner_runs() -> None:
    tables = [TableRef("public", "accounts"), TableRef("public", "orders")]
    with pytest.raises(
        SourceError,
        match=r"CREATE PUBLICATION dblog FOR TABLE public\.accounts, public\.orders WITH",
    ):
        check_publication("dblog", None, tables)
