"""docker/prometheus/ and docker/grafana/: the scrape configuration, the alert rules and the
dashboard, checked by Debian's `promtool` (installed by scripts/install-system-deps.sh: a
missing one fails these tests, it does not skip them) and against what the tailer serves and
what compose.yaml runs.

`promtool test rules` runs alerts.test.yml, where each alert has a case that fires it and one
that keeps it quiet; here we check that every alert has both, that every metric a rule, a rule
test or a panel names is one the tailer or the compaction follower serves (a test on a misspelt
series proves nothing), that every tailer and follower of compose.yaml is scraped, and that
docs/alerts.md explains each alert. tests/integration/tailer/test_prometheus_server.py runs
the real server on a real tailer.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from airflow_provider_dblog.cli import build_parser
from airflow_provider_dblog.compaction.follow_metrics import FollowMetrics, FollowStats
from airflow_provider_dblog.config import load_config
from airflow_provider_dblog.core.event import Op
from airflow_provider_dblog.core.reconciler import FailureReason
from airflow_provider_dblog.sources.base import LogBacklog
from airflow_provider_dblog.tailer.metrics import TailerMetrics, TailerStats

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
PROMETHEUS = DOCKER / "prometheus"
GRAFANA = DOCKER / "grafana"
ALERTS_DOC = REPO / "docs" / "alerts.md"
JOB = "dblog-tailer"
COMPACT_JOB = "dblog-compact"
METRIC = re.compile(r"\bdblog_\w+")
OTHER_METRICS = {"up", "ALERTS"}
"""What Prometheus itself makes, which rules and panels may name beside the tailer's."""


def promtool(*args: str) -> str:
    """`promtool ARGS` in docker/prometheus/ (where the files name each other); its output."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool is not installed: it comes with Debian's prometheus package, which "
            "scripts/install-system-deps.sh installs (run it as root)"
        )
    done = subprocess.run(
        [path, *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=120, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{output}"
    return output


def served_metric_names() -> set[str]:
    """Every sample name a tailer's endpoint serves, each family present (leading, with a
    backlog, something counted under every label)."""
    stats = TailerStats(state="leading", lease_token=1, open_windows=1, windows_opened=1)
    stats.events_by_table[("public", "t", Op.UPDATE)] = 1
    stats.chunk_rows_emitted[("public", "t")] = 1
    stats.chunk_rows_dropped[("public", "t")] = 1
    stats.windows_failed_by_reason[FailureReason.EXPIRED] = 1
    stats.output_batch_seconds.observe(0.01)
    text = generate_latest(TailerMetrics(stats, lambda: LogBacklog(1, 2)).registry).decode()
    return {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }


def served_compact_metric_names() -> set[str]:
    """Every sample name a compaction follower's endpoint serves, each family present."""
    stats = FollowStats(state="leading", lease_token=1, freshness_s=1.5)
    text = generate_latest(FollowMetrics(stats).registry).decode()
    return {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def rules() -> list[dict[str, Any]]:
    return [rule for group in _yaml(PROMETHEUS / "alerts.yml")["groups"] for rule in group["rules"]]


def rule_tests() -> list[dict[str, Any]]:
    tests: list[dict[str, Any]] = _yaml(PROMETHEUS / "alerts.test.yml")["tests"]
    return tests


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((GRAFANA / "dblog.json").read_text())
    return loaded


def panel_exprs(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, expr) of every query of every panel, rows' nested panels too."""
    for panel in board["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                yield inner["title"], target["expr"]


def names_in(expr: str) -> set[str]:
    return set(METRIC.findall(expr))


# -- promtool -----------------------------------------------------------------------------------


def test_promtool_accepts_the_configuration_and_the_rule_files_it_loads() -> None:
    output = promtool("check", "config", "prometheus.yml")
    assert "SUCCESS: 1 rule files found" in output


def test_promtool_accepts_the_rules() -> None:
    output = promtool("check", "rules", "alerts.yml")
    assert f"SUCCESS: {len(rules())} rules found" in output


def test_every_alert_passes_its_unit_tests() -> None:
    assert "SUCCESS" in promtool("test", "rules", "alerts.test.yml")


# -- what the rules and their tests say ---------------------------------------------------------


def test_every_alert_has_a_case_that_fires_it_and_one_that_keeps_it_quiet() -> None:
    fired: dict[str, set[bool]] = {}
    for test in rule_tests():
        for case in test["alert_rule_test"]:
            fired.setdefault(case["alertname"], set()).add(bool(case["exp_alerts"]))
    alerts = [rule["alert"] for rule in rules()]
    assert len(set(alerts)) == len(alerts), "an alert name is used twice"
    assert set(fired) == set(alerts), "tests of alerts that do not exist, or alerts untested"
    untested = {name: cases for name, cases in fired.items() if cases != {True, False}}
    assert not untested, f"alerts without both a firing and a quiet case: {untested}"


def test_the_rules_and_their_tests_name_only_metrics_the_tailer_or_the_follower_serves() -> None:
    served = served_metric_names() | served_compact_metric_names()
    for rule in rules():
        named = names_in(rule["expr"])
        assert named or f'up{{job="{JOB}"}}' in rule["expr"], f"{rule['alert']} reads nothing"
        assert named <= served, f"{rule['alert']} names {named - served}"
        assert set(re.findall(r'job="([^"]+)"', rule["expr"])) <= {JOB, COMPACT_JOB}, rule["alert"]
    for test in rule_tests():
        for series in test["input_series"]:
            name = re.match(r"\w+", series["series"])
            assert name is not None, series
            assert name[0] in served | OTHER_METRICS, f"{test['name']}: {name[0]}"


def test_each_alert_has_a_severity_a_summary_and_its_section_in_docs_alerts_md() -> None:
    headings = re.findall(r"^## (DBLog\w+)$", ALERTS_DOC.read_text(), re.MULTILINE)
    alerts = [rule["alert"] for rule in rules()]
    assert headings == alerts, "docs/alerts.md: one section per alert, in the rules' order"
    for rule in rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        # GitHub's anchor of a `## Name` heading.
        assert rule["annotations"]["runbook"] == f"docs/alerts.md#{name.lower()}", name


# -- the scrape configuration and the compose stack ---------------------------------------------


def _compose() -> dict[str, Any]:
    services: dict[str, Any] = _yaml(DOCKER / "compose.yaml")["services"]
    return services


def test_prometheus_scrapes_every_tailer_of_the_stack_under_its_source_name() -> None:
    """Every `dblog tail` service of compose.yaml, at its metrics port inside the stack's
    network, labelled with the [source] name of the TOML it runs with: the rules group by it."""
    config = _yaml(PROMETHEUS / "prometheus.yml")
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == JOB]
    scraped = {
        target: group["labels"]["source"]
        for group in job["static_configs"]
        for target in group["targets"]
    }
    expected = {}
    for name, service in _compose().items():
        if service.get("command", [])[:2] != ["dblog", "tail"]:
            continue
        (toml,) = [v.split(":")[0] for v in service["volumes"] if ":/etc/dblog/dblog.toml" in v]
        tailer = load_config(DOCKER / toml)
        expected[f"{name}:{tailer.tailer.metrics_port}"] = tailer.source.name
    assert scraped == expected
    assert config["rule_files"] == ["alerts.yml"]


def test_prometheus_scrapes_every_compaction_follower_of_the_stack_under_its_source_name() -> None:
    """Every `dblog lake compact --follow` service of compose.yaml, at its `--metrics-port`,
    labelled with its TOML's [source] name; and the two jobs are all there is."""
    config = _yaml(PROMETHEUS / "prometheus.yml")
    assert [j["job_name"] for j in config["scrape_configs"]] == [JOB, COMPACT_JOB]
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == COMPACT_JOB]
    scraped = {
        target: group["labels"]["source"]
        for group in job["static_configs"]
        for target in group["targets"]
    }
    expected = {}
    for name, service in _compose().items():
        command = service.get("command", [])
        if command[:3] != ["dblog", "lake", "compact"]:
            continue
        args = build_parser().parse_args(command[1:])
        assert args.follow and args.metrics_address == "0.0.0.0", name
        (toml,) = [v.split(":")[0] for v in service["volumes"] if ":/etc/dblog/dblog.toml" in v]
        expected[f"{name}:{args.metrics_port}"] = load_config(DOCKER / toml).source.name
    assert scraped == expected and len(expected) == 2


def test_compose_runs_prometheus_and_grafana_on_these_files_on_loopback_only() -> None:
    services = _compose()
    prometheus = services["prometheus"]
    assert "./prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    assert prometheus["ports"] == ["127.0.0.1:9090:9090"]
    # The image is the version the tests check with (Debian's package).
    version = subprocess.run(
        [shutil.which("prometheus") or "prometheus", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    found = re.search(r"version (\d+\.\d+\.\d+)", version)
    assert found is not None, "prometheus is not installed: scripts/install-system-deps.sh"
    assert prometheus["image"] == f"prom/prometheus:v{found[1]}"

    grafana = services["grafana"]
    assert grafana["ports"] == ["127.0.0.1:3000:3000"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"] if v.startswith("./"))
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    dashboards = _yaml(GRAFANA / "provisioning" / "dashboards" / "dblog.yml")
    (provider,) = dashboards["providers"]
    assert mounts["./grafana/dblog.json"] == f"{provider['options']['path']}/dblog.json"
    datasources = _yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")
    (source,) = datasources["datasources"]
    assert (source["type"], source["url"]) == ("prometheus", "http://prometheus:9090")


# -- the dashboard ------------------------------------------------------------------------------


def test_the_dashboard_queries_only_metrics_the_tailer_or_the_follower_serves() -> None:
    served = served_metric_names() | served_compact_metric_names()
    board = dashboard()
    exprs = list(panel_exprs(board))
    assert exprs
    for title, expr in exprs:
        assert names_in(expr) <= served, f"{title}: {names_in(expr) - served}"
        assert set(re.findall(r'job="([^"]+)"', expr)) <= {JOB, COMPACT_JOB}, title
    shown = set().union(*(names_in(e) for _, e in exprs))
    families = {n.removesuffix("_total") for n in served if not n.endswith("_created")}
    families = {re.sub(r"_(bucket|count|sum)$", "", n) for n in families}
    missing = {f for f in families if not any(s.startswith(f) for s in shown)}
    assert not missing, f"metrics no panel shows: {missing}"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert names_in(variables["source"]["definition"]) <= served


def test_the_dashboard_reads_the_chosen_prometheus_and_its_panels_fit_together() -> None:
    """Every query reads the data source the `datasource` variable picks (so that the file
    imports into any Grafana), filters by the `source` variable, and panels have ids of their
    own."""
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = []
    for panel in board["panels"]:
        ids.append(panel["id"])
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
            if names_in(target["expr"]) or "up{" in target["expr"]:
                assert 'source=~"$source"' in target["expr"], panel["title"]
    assert len(ids) == len(set(ids))
