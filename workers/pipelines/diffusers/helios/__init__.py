"""Helios: a steerable world session, chunk by chunk."""
