"""The worker process, the composition root of ``workers``: the Celery app and its tasks,
the context it builds (every service, the pipelines, the runners), the supervisor of
``omniqueue up``, child processes and their reserved ports, and worker groups (one job over
several devices, a process per rank)."""
