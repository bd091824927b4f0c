"""What every path of the worker uses and nothing else in ``workers`` is imported by: the
metrics, the device-memory accounting, the failpoints of the tests, the stop signal that a
cancel, a deadline or a shutdown sets, and the classification of failures."""
