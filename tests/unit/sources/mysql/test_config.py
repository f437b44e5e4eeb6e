"""The `[source]` section of a MySQL/MariaDB source: what it accepts and what it refuses."""

from __future__ import annotations

import pytest

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.sources.base import SourceError
from airflow_provider_dblog.sources.factory import parse_source_config
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig

SECTION = {
    "name": "shop",
    "dsn": "mysql://dblog@db.example:3307/shop",
    "tables": ["orders", "billing.invoices"],
    "password_env": "SHOP_PASSWORD",
}


def test_tables_without_a_database_are_in_the_dsn_database() -> None:
    config = MysqlSourceConfig.from_section(SECTION)
    assert config.tables == (TableRef("shop", "orders"), TableRef("billing", "invoices"))
    assert (config.host, config.port, config.database) == ("db.example", 3307, "shop")
    assert config.watermark == TableRef("dblog", "watermark")


def test_the_password_comes_from_the_environment_only(monkeypatch: pytest.MonkeyPatch) -> None:
    config = MysqlSourceConfig.from_section(SECTION)
    monkeypatch.setenv("SHOP_PASSWORD", "s3cret")
    kwargs = config.connect_kwargs()
    assert (kwargs["user"], kwargs["password"], kwargs["database"]) == ("dblog", "s3cret", "shop")
    monkeypatch.delenv("SHOP_PASSWORD")
    with pytest.raises(SourceError, match=r"SHOP_PASSWORD.*not set"):
        config.connect_kwargs()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dsn": "mysql://dblog:pw@db/shop"}, "must not hold the password"),
        ({"dsn": "postgres://dblog@db/shop"}, "must look like mysql://"),
        ({"dsn": "mysql://db/shop"}, "must look like mysql://"),
        ({"dsn": "mysql://dblog@db:notaport/shop"}, "malformed"),
        ({"tables": []}, "captures no table"),
        ({"tables": "orders"}, "must be a list"),
        ({"tables": ["orders", "shop.orders"]}, "listed twice"),
        ({"tables": ["dblog.watermark"]}, "cannot also be captured"),
        ({"watermark_table": "wm-1"}, "watermark_table"),
        ({"password_env": "not a name"}, "password_env"),
        ({"server_id": 0}, "server_id"),
        ({"server_id": "7"}, "server_id must be an integer, got '7'"),
        ({"server_id_span": True}, "server_id_span must be an integer"),
        ({"watermark_database": 5}, "watermark_database must be text"),
        ({"tables": ["orders", 5]}, "must be a list"),
        ({"slot": "x"}, "unknown option.*slot"),
    ],
)
def test_what_is_refused_is_named(change: dict[str, object], message: str) -> None:
    with pytest.raises(SourceError, match=message):
        MysqlSourceConfig.from_section({**SECTION, **change})


def test_a_password_in_the_dsn_is_not_echoed_back() -> None:
    with pytest.raises(SourceError) as error:
        MysqlSourceConfig.from_section({**SECTION, "dsn": "postgres://dblog:s3cret@db/shop"})
    assert "s3cret" not in str(error.value)


def test_unique_keys_are_read_from_the_toml() -> None:
    section = {
        "type": "mysql",
        "name": "m",
        "dsn": "mysql://u@h/app",
        "tables": ["app.twice", "readings"],
        "unique_keys": {"twice": "twice_b"},
    }
    config = parse_source_config(section)
    assert config.unique_keys == {TableRef("app", "twice"): "twice_b"}  # type: ignore[attr-defined]
    with pytest.raises(SourceError, match=r"unique_keys names app\.other, which is not captured"):
        parse_source_config({**section, "unique_keys": {"other": "i"}})
