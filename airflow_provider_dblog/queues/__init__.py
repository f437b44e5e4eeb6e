"""message queues of the DBLog Airflow provider (common-messaging's `MessageQueueTrigger`)."""
