"""Sources chosen by `[source] type`: the factory hands out each type's configuration and
`Source` without connecting to anything."""

from __future__ import annotations

import pytest

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.sources.base import SourceError
from airflow_provider_dblog.sources.factory import parse_source_config, source_for

SECTION = {
    "name": "shop",
    "dsn": "host=db.example port=5433 dbname=shop user=dblog",
    "tables": ["accounts", "sales.orders"],
    "slot": "shop_slot",
}


def test_postgres_is_the_default_type_and_names_its_tables_in_public() -> None:
    config = parse_source_config(SECTION)
    assert config.type == "postgres"
    assert config.tables == (TableRef("public", "accounts"), TableRef("sales", "orders"))
    assert parse_source_config({**SECTION, "type": "postgres"}) == config


def test_the_source_of_a_config_carries_its_name_and_tables() -> None:
    source = source_for(parse_source_config(SECTION))
    assert source.name == "shop"
    assert source.tables == (TableRef("public", "accounts"), TableRef("sales", "orders"))


def test_lineage_names_follow_openlineage_postgres_naming() -> None:
    source = source_for(parse_source_config(SECTION))
    assert source.lineage_name(TableRef("sales", "orders")) == (
        "postgres://db.example:5433",
        "shop.sales.orders",
    )


MYSQL_SECTION = {
    "type": "mysql",
    "name": "shop",
    "dsn": "mysql://dblog@db.example:3307/shop",
    "tables": ["orders", "billing.invoices"],
}


def test_mysql_tables_without_a_database_are_in_the_dsn_database() -> None:
    source = source_for(parse_source_config(MYSQL_SECTION))
    assert source.name == "shop"
    assert source.tables == (TableRef("shop", "orders"), TableRef("billing", "invoices"))


def test_mysql_lineage_names_follow_openlineage_mysql_naming() -> None:
    source = source_for(parse_source_config(MYSQL_SECTION))
    assert source.lineage_name(TableRef("billing", "invoices")) == (
        "mysql://db.example:3307",
        "billing.invoices",
    )


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({**MYSQL_SECTION, "dsn": SECTION["dsn"]}, "MySQL dsn must look like mysql://"),
        ({**MYSQL_SECTION, "slot": "x"}, "unknown option.*slot; known for mysql"),
        ({**SECTION, "type": "oracle"}, "'oracle' is unknown; known types: postgres, mysql"),
        ({**SECTION, "type": 5}, "5 is unknown"),
        ({k: v for k, v in SECTION.items() if k != "dsn"}, "needs 'dsn'"),
        ({**SECTION, "publications": "x"}, "unknown option.*publications"),
        ({**SECTION, "tables": ["a.b.c"]}, "schema.table"),
    ],
)
def test_what_the_factory_refuses_is_named(section: dict[str, object], message: str) -> None:
    with pytest.raises(SourceError, match=message):
        parse_source_config(section)
