"""The settings types the configuration parses into, at the bottom of the package: this module
imports nothing of it, so whatever reads a setting loads none of what uses it.

- `TailerSettings`: the `[tailer]` section, how a tailer paces itself (window expiry, batches,
  buffer, checkpoints, lease, beats and backoff) and where it serves its metrics.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TailerSettings:
    window_ttl_s: float = 120.0
    """An open window whose hw has not come by then expires; the dump retries the chunk."""
    batch_events: int = 2000
    """At most this many events per output write (each write made durable before its marks);
    a dump's chunk rows count one per KiB of their lines, so a chunk of small rows and the log
    events behind it share a write."""
    buffer_items: int = 20_000
    """The buffer between the reader and the writer holds about this many events and marks (a
    chunk row counts one per KiB of its line if that is more)."""
    checkpoint_s: float = 0.2
    """The checkpoint (and the source's acknowledgement of what is durable) is saved at most
    this often: a Redis round trip a transaction would cost small transactions most of their
    read. At an idle log it is saved at the reader's next idle beat after that (a second at
    most), and at a stop at once; a tailer killed reads about this much of the log again."""
    lease_ttl_ms: int = 10_000
    heartbeat_s: float = 1.0
    reconnect_max_s: float = 30.0
    writer_stop_s: float = 30.0
    """How long an ending session waits for its writer to stop. A writer still stuck in the
    output after that stops the tailer (a supervisor restarts it): a second writer must never
    write beside it."""
    metrics_port: int | None = None
    """Serve the Prometheus metrics (`tailer.metrics`) on this TCP port; None: no endpoint."""
    metrics_address: str = "127.0.0.1"
    """The address the metrics endpoint binds to (`0.0.0.0`: every interface)."""
