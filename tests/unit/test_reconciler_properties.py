"""Property-based histories against the model tailer: whatever the interleaving, the output is a
faithful change stream (see `histories.py` for what a history holds and what is checked).

The last test runs the same histories against deliberately broken reconcilers and requires
that hypothesis catches each of them. tests/integration/test_tailer_properties.py plays the
same histories against the production `Session`.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

from airflow_provider_dblog.core.reconciler import Reconciler
from tests.unit.broken_reconcilers import BROKEN_RECONCILERS
from tests.unit.histories import History, histories, mutant_search, run_history
from tests.unit.simulation import ModelTailer, ModelWindows, Source

EXAMPLES = int(os.environ.get("DBLOG_PROPERTY_EXAMPLES", "1000"))
MUTANT_EXAMPLES = 2000


def run_model(history: History, reconciler_class: type[Reconciler] = Reconciler) -> None:
    windows = ModelWindows()

    def start_tailer(source: Source) -> ModelTailer:
        return ModelTailer(source, windows, reconciler_class)

    run_history(history, windows, start_tailer)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(histories)
def test_dump_with_concurrent_writes_converges(history: History) -> None:
    run_model(history)


@pytest.mark.parametrize("broken", BROKEN_RECONCILERS, ids=lambda c: c.__name__)
def test_broken_reconcilers_are_caught(broken: type[Reconciler]) -> None:
    @mutant_search(MUTANT_EXAMPLES)
    @given(histories)
    def broken_run(history: History) -> None:
        run_model(history, broken)

    with pytest.raises(AssertionError):
        broken_run()
