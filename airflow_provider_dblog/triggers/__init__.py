"""triggers of the DBLog Airflow provider."""
