"""`python -m airflow_provider_dblog.cli`, the same as the `dblog` command."""

import sys

from airflow_provider_dblog.cli import main

sys.exit(main())
