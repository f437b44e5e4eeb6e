"""The `[source]` section of a MySQL/MariaDB source: what it accepts and what it refuses."""

from __future__ import annotations

from pathlib import Path

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
        ({"ssl_verify_identity": True}, "ssl_verify_identity needs ssl_ca"),
        ({"ssl_cert": "client.crt"}, "ssl_cert needs ssl_ca"),
        ({"ssl_ca": "ca.crt", "ssl_key": "client.key"}, "ssl_key needs ssl_cert"),
        ({"ssl_ca": ""}, "ssl_ca is empty"),
        ({"ssl_ca": "ca.crt", "ssl_verify_identity": "yes"}, "ssl_verify_identity must be true"),
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


def test_tls_verifies_the_server_and_its_host_name_unless_told_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOP_PASSWORD", "s3cret")
    ca, cert, key = (tmp_path / name for name in ("ca.crt", "client.crt", "client.key"))
    for path in (ca, cert, key):
        path.write_text("PEM")
    tls = {"ssl_ca": str(ca), "ssl_cert": str(cert), "ssl_key": str(key)}
    kwargs = MysqlSourceConfig.from_section({**SECTION, **tls}).connect_kwargs()
    assert {k: v for k, v in kwargs.items() if k.startswith("ssl_")} == {
        **tls,
        "ssl_verify_cert": True,
        "ssl_verify_identity": True,
    }
    chain_only = {**SECTION, "ssl_ca": str(ca), "ssl_verify_identity": False}
    kwargs = MysqlSourceConfig.from_section(chain_only).connect_kwargs()
    assert (kwargs["ssl_verify_cert"], kwargs["ssl_verify_identity"]) == (True, False)
    assert "ssl_ca" not in MysqlSourceConfig.from_section(SECTION).connect_kwargs()


def test_a_missing_tls_file_is_named_when_connecting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOP_PASSWORD", "s3cret")
    missing = str(tmp_path / "nowhere" / "ca.crt")
    config = MysqlSourceConfig.from_section({**SECTION, "ssl_ca": missing})
    with pytest.raises(SourceError, match=r"\[source\] ssl_ca: no such file .*nowhere/ca.crt"):
        config.connect_kwargs()
