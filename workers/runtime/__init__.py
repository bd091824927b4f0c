"""The worker process: the Celery app and its tasks, the context it builds, the supervisor of
``omniqueue up``, shutdown, reserved ports, memory, metrics, failpoints, stop signals,
and the classification of failures."""
