"""Stable Audio: text-to-audio."""
