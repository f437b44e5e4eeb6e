"""The ACL rules of each role (state/acl.py), as docs/operations.md shows them."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_dblog.state.acl import ROLES, acl_rules, acl_setuser

OPERATIONS = Path(__file__).resolve().parents[3] / "docs" / "operations.md"


def test_the_operations_guide_shows_each_role_s_rules_as_the_code_spells_them() -> None:
    guide = OPERATIONS.read_text()
    for role in ROLES:
        assert f"{acl_setuser(role, 'shop', f'dblog-{role}')} >password\n" in guide, role


def test_only_the_tailer_writes_the_tailer_s_keys_and_the_ui_writes_no_window() -> None:
    tailer, dump, ui, compactor = (acl_rules(role, "shop") for role in ROLES)
    assert "~dblog:{shop}:*" in tailer
    for reader in (dump, ui, compactor):
        assert "~dblog:{shop}:*" not in reader and "%R~dblog:{shop}:*" in reader
    assert not any("tailer" in rule for rule in dump + ui + compactor)
    assert not any("window" in rule for rule in ui + compactor)
    writes = [rule for rule in compactor if rule.startswith("~")]
    assert writes == ["~dblog:{shop}:compact:*", "~dblog:{shop}:direct:pending"]
    assert not any(rule.startswith("&") for rule in ui + compactor)
    rules = tailer[2:] + dump[2:] + ui[2:] + compactor[2:]
    assert all(rule.startswith(("+", "~", "%R~", "&")) for rule in rules)
    assert "+flushall" not in tailer and "+config" not in tailer and "+keys" not in tailer


def test_an_unknown_role_is_refused_naming_the_roles() -> None:
    roles = "tailer, dump, ui, compactor"
    with pytest.raises(ValueError, match=f"unknown role 'admin'; the roles are {roles}"):
        acl_rules("admin", "shop")
