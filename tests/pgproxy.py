"""A TCP proxy in front of Postgres that a test controls: it can cut a connection at the
moment a chosen message goes through, and refuse new connections for a while.

It looks for a marker in what the client sends (a value unique to one statement, such
as a task's result, which travels in the Bind message). Two cuts:

- ``before``: the message never reaches Postgres; the client's connection is closed.
  The statement did not run, and the client cannot know that.
- ``after``: the message reaches Postgres; everything Postgres answers from then on is
  swallowed, and once it has answered (so the statement has committed) the client's
  connection is closed. The statement ran, and the client cannot know that either.

Use ``sslmode=disable`` in the DSN so the stream is plain.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Literal

Cut = Literal["before", "after"]


@dataclass
class _Arm:
    marker: bytes
    cut: Cut
    go_dark: bool
    fired: asyncio.Event = field(default_factory=asyncio.Event)


class PgProxy:
    def __init__(self, upstream_port: int, *, host: str = "127.0.0.1") -> None:
        self.upstream = (host, upstream_port)
        self.port = 0
        self.refuse = False
        """Close every new connection at once (Postgres "unreachable")."""
        self._arm: _Arm | None = None
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    def dsn(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}?sslmode=disable"

    async def start(self) -> PgProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._conns):
            t.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def arm(self, marker: bytes, cut: Cut, *, go_dark: bool = False) -> asyncio.Event:
        """Cut the first connection whose client sends ``marker``; the event is set once
        the cut is done. ``go_dark``: at that moment also cut every other connection and
        refuse new ones (Postgres unreachable from then on)."""
        self._arm = _Arm(marker, cut, go_dark)
        return self._arm.fired

    def go_dark(self) -> None:
        self.refuse = True
        me = asyncio.current_task()
        for t in self._conns:
            if t is not me:
                t.cancel()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            if self.refuse:
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            except OSError:
                return
            try:
                await self._pump_both(reader, writer, up_reader, up_writer)
            finally:
                up_writer.close()
        finally:
            writer.close()
            self._conns.discard(task)

    async def _pump_both(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         up_reader: asyncio.StreamReader,
                         up_writer: asyncio.StreamWriter) -> None:
        answered = asyncio.Event()
        swallow = False
        hit: _Arm | None = None

        async def client_to_server() -> None:
            nonlocal swallow, hit
            tail = b""
            while data := await reader.read(65536):
                arm = self._arm
                if arm is not None and arm.marker in tail + data:
                    self._arm, hit = None, arm
                    if arm.go_dark:
                        self.go_dark()
                    if arm.cut == "before":
                        return
                    swallow = True
                    up_writer.write(data)
                    await up_writer.drain()
                    await answered.wait()
                    return
                tail = data[-64:]
                up_writer.write(data)
                await up_writer.drain()

        async def server_to_client() -> None:
            swallowed = b""
            while data := await up_reader.read(65536):
                if swallow:
                    swallowed += data
                    # ReadyForQuery ('Z', length 5, status): the statement is over and,
                    # outside a transaction block, committed.
                    if swallowed[-6:-1] == b"Z\x00\x00\x00\x05":
                        answered.set()
                    continue
                writer.write(data)
                await writer.drain()

        pumps = [asyncio.create_task(client_to_server()), asyncio.create_task(server_to_client())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for p in pumps:
                p.cancel()
            for p in pumps:
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await p
            if hit is not None:
                hit.fired.set()
