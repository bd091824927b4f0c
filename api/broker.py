"""Moved to ``realtime/broker.py`` (the shared session relay uses it); kept as an alias
so code written against the old path still imports."""

from realtime.broker import BROKER_ERRORS, BROKER_TIMEOUT_S, bounded

__all__ = ["BROKER_ERRORS", "BROKER_TIMEOUT_S", "bounded"]
