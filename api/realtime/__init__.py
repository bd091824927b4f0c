"""The asyncio shells of the realtime sessions: they own the client socket, the clocks,
the Redis-held session state and the relay to the worker, and drive the sans-I/O state
machines of :mod:`realtime` (which imports none of asyncio, FastAPI, Starlette or Redis;
``tests/unit/test_realtime_sans_io.py`` holds it to that)."""
