"""Realtime sessions on a worker: the world and voice runners, their slots, leases, turns
and checkpoints, and the persisting of a session's video."""
