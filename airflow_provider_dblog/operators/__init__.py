"""operators of the DBLog Airflow provider."""
