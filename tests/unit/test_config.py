"""The TOML configuration: what it accepts, and clear errors for what it does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_dblog.config import ConfigError, load_config
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.tailer import TailerSettings

GOOD = """
[source]
name = "shop"
dsn = "host=127.0.0.1 port=5432 dbname=shop user=dblog"
password_env = "SHOP_PASSWORD"
tables = ["public.accounts", "orders"]

[redis]
url = "redis://127.0.0.1:6379/0"

[output]
type = "ndjson"
directory = "out"

[tailer]
window_ttl_s = 30
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "dblog.toml"
    path.write_text(text)
    return path


def test_a_good_config_loads(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD))
    assert config.source.tables == (TableRef("public", "accounts"), TableRef("public", "orders"))
    assert config.source.password_env == "SHOP_PASSWORD"
    assert config.output == {"type": "ndjson", "directory": "out"}
    assert config.tailer == TailerSettings(window_ttl_s=30.0)
    assert isinstance(config.tailer.window_ttl_s, float), "a whole number in TOML, typed"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD.replace("[redis]", "[cache]"), r"no \[redis\] section"),
        (GOOD.replace("window_ttl_s", "window_ttl"), "unknown option.*window_ttl"),
        (GOOD.replace('name = "shop"', 'name = "shop"\npassword = "x"'), "holds a password"),
        (GOOD.replace('tables = ["public.accounts", "orders"]', ""), "needs 'tables'"),
        (GOOD.replace('"orders"', '"a.b.c"'), "schema.table"),
        (GOOD.replace("[source]", "[source"), "not valid TOML"),
        (GOOD.replace('user=dblog"', 'user=dblog password=x"'), "must not hold the password"),
        (GOOD.replace("[source]", '[source]\ntype = "mysql"'), "MySQL dsn must look like"),
        (GOOD.replace("[source]", '[source]\ntype = "oracle"'), "'oracle' is unknown.*postgres"),
        (GOOD.replace("[source]", "[source]\nslots = 2"), "unknown option.*slots"),
        (GOOD.replace('["public.accounts", "orders"]', '"orders"'), "must be a list"),
        (GOOD + "metrics_port = 0\n", r"metrics_port .*TCP port \(1-65535\), got 0"),
        (GOOD + 'metrics_port = "9187"\n', r"metrics_port .*TCP port"),
        (GOOD + "metrics_port = 70000\n", r"metrics_port .*TCP port"),
        (GOOD + 'metrics_address = ""\n', "metrics_address .*an address to bind"),
    ],
)
def test_bad_configs_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        load_config(write(tmp_path, text))
    assert "password=x" not in str(raised.value)


def test_the_metrics_endpoint_is_configured_in_tailer(tmp_path: Path) -> None:
    text = GOOD + 'metrics_port = 9187\nmetrics_address = "0.0.0.0"\n'
    settings = load_config(write(tmp_path, text)).tailer
    assert (settings.metrics_port, settings.metrics_address) == (9187, "0.0.0.0")
    assert TailerSettings().metrics_port is None, "no endpoint unless a port is given"
    without = GOOD.replace("[tailer]\nwindow_ttl_s = 30\n", "")
    assert load_config(write(tmp_path, without)).tailer == TailerSettings(), "the defaults"


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")


def test_the_lake_root_is_configured_in_lake(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, GOOD)).lake_root is None
    lake = GOOD + '\n[lake]\nroot = "/var/lib/dblog/lake"\n'
    assert load_config(write(tmp_path, lake)).lake_root == "/var/lib/dblog/lake"
    with pytest.raises(ConfigError, match=r"\[lake\] .* unknown option\(s\) rot; known: root"):
        load_config(write(tmp_path, GOOD + '\n[lake]\nrot = "/x"\n'))
    with pytest.raises(ConfigError, match=r"\[lake\] root .* non-empty path"):
        load_config(write(tmp_path, GOOD + "\n[lake]\nroot = 3\n"))


REDIS = 'url = "redis://127.0.0.1:6379/0"\n'
SENTINELS = 'sentinels = ["s1:26379", "[::1]:26380"]\nservice_name = "mymaster"\n'


def test_the_redis_section_takes_sentinels_tls_files_and_a_user(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("-")
    text = GOOD.replace(REDIS, f'{SENTINELS}username = "tailer"\ndb = 2\ntls = true\n')
    settings = load_config(
        write(tmp_path, text.replace("tls = true", f'tls = true\nca_file = "{ca}"'))
    ).redis
    assert settings.sentinels == (("s1", 26379), ("::1", 26380))
    assert (settings.service_name, settings.username, settings.db) == ("mymaster", "tailer", 2)
    assert settings.uses_tls and settings.ca_file == str(ca)
    assert settings.where == "service mymaster db 2 (sentinels s1:26379, ::1:26380)"
    plain = load_config(write(tmp_path, GOOD.replace("redis://", "rediss://dblog@"))).redis
    assert plain.uses_tls and plain.where == "127.0.0.1:6379/0"


@pytest.mark.parametrize(
    ("redis", "message"),
    [
        ('url = "redis://:pw@h:1/0"\n', r"\[redis\] url in .*dblog.toml.*holds a password"),
        ('url = "redis://h:1/x"\n', r"\[redis\] url in .*database after the port"),
        (REDIS + "sentinel = 1\n", r"\[redis\] sentinel in .* unknown; known: ca_file"),
        (REDIS + 'service_name = "m"\n', r"\[redis\] service_name .* for sentinels only"),
        (REDIS + 'ca_file = "/etc/hostname"\n', r"\[redis\] ca_file .* rediss:// url turns it"),
        (SENTINELS + REDIS, r"\[redis\] url .* not used with sentinels"),
        ('sentinels = ["s1"]\nservice_name = "m"\n', r"sentinels .* 's1' is not host:port"),
        ('sentinels = "s1:1"\nservice_name = "m"\n', r"sentinels .* must be a list of host:port"),
        ('sentinels = ["s1:99999"]\nservice_name = "m"\n', r"'s1:99999' is not host:port"),
        ('sentinels = ["s1:1"]\n', r"\[redis\] service_name .* must name the primary"),
        (SENTINELS + "db = -1\n", r"\[redis\] db .* database number"),
        (SENTINELS + 'tls = "yes"\n', r"\[redis\] tls .* true or false"),
        (SENTINELS + 'ca_file = "/etc/hostname"\n', r"\[redis\] ca_file .* set tls = true"),
        (SENTINELS + 'tls = true\nca_file = "/nope.crt"\n', r"ca_file .* not a readable file"),
        (
            SENTINELS + 'tls = true\ncert_file = "/etc/hostname"\n',
            r"cert_file .* and key_file go together",
        ),
        (SENTINELS + 'sentinel_password_env = "a-b"\n', r"sentinel_password_env .* variable"),
    ],
)
def test_bad_redis_options_name_the_file_section_and_key(
    tmp_path: Path, redis: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        load_config(write(tmp_path, GOOD.replace(REDIS, redis)))
    assert ":pw@" not in str(raised.value)
