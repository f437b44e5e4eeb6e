"""DBLog change data capture for Apache Airflow, with dumps on Apache Spark.

Importing this package touches no network and starts nothing.
"""

__version__ = "0.1.0"
