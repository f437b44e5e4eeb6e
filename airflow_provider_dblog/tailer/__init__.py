"""The log tailer: the one writer of the ordered output.

It reads the source's log, feeds the core's `Reconciler`, and hands events in order to a writer
thread through a bounded buffer, so a slow output slows the read but memory stays bounded. It
never waits for a dump: chunk rows are in Redis before their hw is in the log.

- `service.Tailer`: the lease loop, one per process; `Tailer.from_config` builds it from the TOML;
  `service.tune_gc` the process's garbage collection for it.
- `session.Session`: one connected stretch of leadership, one method per kind of log item.
- `windows.OpenWindows`: a session's open windows and how one fails; `closer.WindowCloser`: a
  window at its hw (the reads checked, then its rows emitted or a direct window recorded);
  `positional.PositionalWindows`: read-only windows, armed and closed between two transactions.
- `writer.Writer`: the writer thread and its batching (`take_batch`, pure).
- `TailerSettings`: the `[tailer]` options, defined in `airflow_provider_dblog.settings` (below
  the configuration) and importable from `tailer.settings` too.
"""

from airflow_provider_dblog.settings import TailerSettings
from airflow_provider_dblog.tailer.service import Tailer, TailerFailed, tune_gc

__all__ = ["Tailer", "TailerFailed", "TailerSettings", "tune_gc"]
