"""A small TCP proxy in front of each service, inside the services host: it listens on
the service's address and forwards to the service on 127.0.0.1, and can delay every
chunk each way (a slow link) while keeping each direction's order.

``python -m tests.cluster.proxy CONTROL LISTEN=TARGET ...``: ``CONTROL`` is a JSON file
(``{"delay_s": 0.2}``) read whenever it changes; each ``LISTEN=TARGET`` is
``host:port=host:port``. It prints ``ready`` once every listener is bound.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any


class Control:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.delay_s = 0.0
        self._mtime = 0.0

    async def watch(self) -> None:
        while True:
            try:
                mtime = self.path.stat().st_mtime
                if mtime != self._mtime:
                    self._mtime = mtime
                    self.delay_s = float(json.loads(self.path.read_text()).get("delay_s", 0))
            except (OSError, ValueError):
                pass
            await asyncio.sleep(0.05)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, c: Control) -> None:
    """Copy one direction; each chunk leaves ``delay_s`` after it arrived, in order."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(65536)
            await queue.put((time.monotonic() + c.delay_s, data))
            if not data:
                break
        await sender
    except (ConnectionError, OSError):
        sender.cancel()
    finally:
        writer.close()


def _handler(target: tuple[str, int], control: Control) -> Any:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            _pump(reader, up_writer, control),
            _pump(up_reader, writer, control),
            return_exceptions=True,
        )

    return handle


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def main(control_path: str, routes: list[str]) -> None:
    control = Control(Path(control_path))
    watcher = asyncio.create_task(control.watch())
    servers = []
    for route in routes:
        listen, _, target = route.partition("=")
        host, port = _address(listen)
        handler = _handler(_address(target), control)
        servers.append(await asyncio.start_server(handler, host, port, reuse_address=True))
    print("ready", flush=True)
    try:
        await asyncio.gather(*(s.serve_forever() for s in servers))
    finally:
        watcher.cancel()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
