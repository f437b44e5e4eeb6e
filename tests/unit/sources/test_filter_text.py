"""A dump's filter is one condition that stays inside the chunk query's parentheses: what could
close them, end the statement, comment out the rest or read another table is refused by name,
whatever quoting hides it from a naive look; quoted text may hold anything."""

from __future__ import annotations

import dataclasses

import pytest

from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.sources.filter_text import MYSQL, POSTGRES, scan_filter

MYSQL_PLAIN = dataclasses.replace(MYSQL, backslash_escapes=False)


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ("region = 'eu'", set()),
        ("owner LIKE '%7%' AND (balance > 10 OR balance IS NULL)", set()),
        ("lower(owner) = 'a;b -- c /* d */ (e'", {"lower"}),
        ("note = 'it''s' AND \"weird;name\" = 1", set()),
        ("updated >= now() - interval '1 day'", {"now"}),
        ("coalesce (n, 0) > 2", {"coalesce"}),
        ("tags @> $$}{;)$$ AND name = $q$ ) $q$", set()),
        ("name = E'it\\'s ) ; --'", set()),
    ],
)
def test_postgres_conditions_pass_with_the_functions_they_call(text: str, calls: set[str]) -> None:
    assert scan_filter(text, POSTGRES) == calls


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ("region = 'eu' AND `odd;col` > 1", set()),
        ("owner LIKE '%7%' AND JSON_VALUE(tags, '$.a') = \"x)\"", {"json_value"}),
        ("note = 'a''b' OR note = \"c\"\"d\"", set()),
    ],
)
def test_mysql_conditions_pass_with_the_functions_they_call(text: str, calls: set[str]) -> None:
    assert scan_filter(text, MYSQL) == calls
    assert scan_filter(text, MYSQL_PLAIN) == calls


@pytest.mark.parametrize(
    ("text", "refusal"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("id = 1; DROP TABLE accounts", "no ';'"),
        ("id = 1) UNION SELECT * FROM secrets WHERE (true", "closes a parenthesis"),
        ("id = 1) OR (true", "closes a parenthesis"),
        ("(id = 1", "parenthesis open"),
        ("id = 1 -- the rest", "no comment"),
        ("id = 1 /* x */", "no comment"),
        ("id IN (SELECT id FROM other)", "no subquery"),
        ("EXISTS (select 1)", "no subquery"),
        ("name = 'unterminated", "unterminated"),
        ('"unterminated = 1', "unterminated"),
        ("name = $$x", r"unterminated \$\$"),
        ("id = 1\x00; DROP TABLE t", "control character"),
    ],
)
def test_postgres_refusals_name_the_problem(text: str, refusal: str) -> None:
    with pytest.raises(InvalidRequest, match=refusal):
        scan_filter(text, POSTGRES)


@pytest.mark.parametrize(
    ("text", "refusal"),
    [
        ("id = 1 # the rest", "no comment"),
        ("(@x := 1) = 1", "assign no variable"),
        ("id IN (SeLeCt id FROM other)", "no subquery"),
        ("id = 1) LIMIT 1 -- ", "closes a parenthesis"),
    ],
)
def test_mysql_refusals_name_the_problem(text: str, refusal: str) -> None:
    with pytest.raises(InvalidRequest, match=refusal):
        scan_filter(text, MYSQL)


def test_a_backslash_read_two_ways_cannot_hide_a_parenthesis() -> None:
    """With backslash escapes the quoted text runs to the last quote; without them (sql_mode
    NO_BACKSLASH_ESCAPES) it ends at `\\'`, and the rest closes the chunk's parenthesis: one
    of the two readings refuses it, so MySQL's check, which takes both, does."""
    text = "name = 'a\\' ) OR (true' "
    assert scan_filter(text, MYSQL) == set()
    with pytest.raises(InvalidRequest):
        scan_filter(text, MYSQL_PLAIN)
