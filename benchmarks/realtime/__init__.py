"""Realtime sessions: voice (``audio``), video (``video``), world-model pacing."""
