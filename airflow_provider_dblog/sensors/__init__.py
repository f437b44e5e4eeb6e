"""sensors of the DBLog Airflow provider."""
