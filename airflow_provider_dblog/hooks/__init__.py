"""hooks of the DBLog Airflow provider."""
