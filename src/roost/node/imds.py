"""An EC2 instance metadata service (IMDS) for the instances on one node.

Instances reach it at the URL in ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` (the SDKs and the
CLI read that variable), instead of 169.254.169.254. Because all instances of a node
share this one server, the only hard question is *who is asking*: it is answered by
``resolve(peer host, peer port)`` from kernel facts (see `roost.node.peers`), never from
anything in the request, which the caller controls.

Wire behaviour follows EC2's documented IMDS:

- ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` (1..21600,
  else 400) returns a session token bound to the calling instance; a PUT carrying
  ``X-Forwarded-For`` is refused (403), as EC2 does against proxies and SSRF.
- A GET with ``X-aws-ec2-metadata-token`` must carry a valid token of the caller's
  instance (else 401) and its reply tells the token's remaining seconds in
  ``X-aws-ec2-metadata-token-ttl-seconds``. A GET without one is IMDSv1: allowed when
  the instance's ``http_tokens`` is 'optional', 401 when 'required'.
- An unknown caller gets 404 (nothing to see here), an instance whose
  ``http_endpoint`` is 'disabled' 403 ("the IMDS is turned off"), methods other than
  GET, HEAD (and PUT on the token path) 405. Paths and bodies: `roost.node.imds_tree`.

Wiring on a node (the server's real port is only known after ``start``, and need not
be: the app hands the resolver each connection's own server address)::

    server = MetadataServer(ledger_lookup, resolver_by_groups(pids_by_instance,
                                                              "127.0.0.1", 0))
    await server.start()
    env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = server.endpoint   # http://127.0.0.1:N/
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import time
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from roost.node.imds_tokens import TokenSigner, parse_ttl
from roost.node.imds_tree import InstanceMetadata, find, instance_tree

__all__ = ["CallerResolver", "ConnectionResolver", "InstanceMetadata", "MetadataLookup",
           "MetadataServer", "build_app"]

log = logging.getLogger(__name__)

MetadataLookup = Callable[[str], InstanceMetadata | None]
"""Instance id -> its metadata now (None: no such instance here). Called on the event
loop, once per request."""
CallerResolver = Callable[[str, int], str | None]
"""(peer host, peer port) -> the calling instance's id, or None. Called in a worker
thread, since resolving may read /proc."""

TOKEN_PATH = "/latest/api/token"
TOKEN_HEADER = "x-aws-ec2-metadata-token"
TTL_HEADER = "x-aws-ec2-metadata-token-ttl-seconds"
_METHODS = ["GET", "HEAD", "PUT", "POST", "DELETE", "PATCH", "OPTIONS", "TRACE"]
_TITLES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed"}


@runtime_checkable
class ConnectionResolver(Protocol):
    """A CallerResolver that can also use the server end of the connection, so one
    resolver works whatever port the server ended up bound to."""

    def __call__(self, peer_host: str, peer_port: int, /) -> str | None: ...

    def resolve_connection(self, peer_host: str, peer_port: int, server_host: str,
                           server_port: int) -> str | None: ...


def build_app(lookup: MetadataLookup, resolve: CallerResolver, *, secret: bytes,
              clock: Callable[[], float] = time.time,
              server_port: int | None = None) -> Starlette:
    """The IMDS as an ASGI app. ``clock`` (epoch seconds) times tokens; ``server_port``
    overrides the server port reported by the ASGI server to a `ConnectionResolver`
    (for a server behind a port mapping, or one that reports none)."""
    signer = TokenSigner(secret)

    async def identify(request: Request) -> str | None:
        if request.client is None:
            return None
        peer_host, peer_port = request.client.host, request.client.port
        server = request.scope.get("server") or ("", 0)
        srv_host, srv_port = str(server[0] or ""), int(server[1] or 0)
        if server_port is not None:
            srv_port = server_port
        if isinstance(resolve, ConnectionResolver) and srv_host:
            return await run_in_threadpool(resolve.resolve_connection, peer_host, peer_port,
                                           srv_host, srv_port)
        return await run_in_threadpool(resolve, peer_host, peer_port)

    async def handle(request: Request) -> Response:
        instance_id = await identify(request)
        md = lookup(instance_id) if instance_id is not None else None
        if md is None:
            # Said, not hidden at debug: an instance refused here sees no user data.
            log.info("IMDS: %s from %s: %s", request.url.path, request.client,
                     "no instance's processes hold the connection" if instance_id is None
                     else f"{instance_id} is not pending or running here")
            return _error(404)
        if md.http_endpoint != "enabled":
            return _error(403)
        path = request.url.path
        if path.rstrip("/") == TOKEN_PATH:
            if request.method != "PUT":
                return _error(405, allow="PUT")
            return issue_token(request, md)
        if request.method not in ("GET", "HEAD"):
            return _error(405, allow="GET, HEAD")
        return read(request, md, path)

    def issue_token(request: Request, md: InstanceMetadata) -> Response:
        if "x-forwarded-for" in request.headers:
            return _error(403)
        ttl = parse_ttl(request.headers.get(TTL_HEADER))
        if ttl is None:
            return _error(400)
        token = signer.issue(md.instance_id, ttl, now=clock())
        return Response(token, media_type="text/plain", headers={TTL_HEADER: str(ttl)})

    def read(request: Request, md: InstanceMetadata, path: str) -> Response:
        headers: dict[str, str] = {}
        token = request.headers.get(TOKEN_HEADER)
        if token is not None:
            left = signer.remaining(token, md.instance_id, now=clock())
            if left is None:
                return _error(401)
            headers[TTL_HEADER] = str(left)
        elif md.http_tokens == "required":
            return _error(401)
        leaf = find(instance_tree(md), path)
        if leaf is None:
            return _error(404)
        return Response(leaf.body, media_type=leaf.content_type, headers=headers)

    return Starlette(routes=[Route("/{path:path}", handle, methods=_METHODS)])


def _error(status: int, *, allow: str | None = None) -> Response:
    """EC2's error replies: a small XHTML page naming the status. Clients look only at
    the status code; the page is for people running curl."""
    title = f"{status} - {_TITLES[status]}"
    body = ('<?xml version="1.0" encoding="iso-8859-1"?>\n'
            '<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN"\n'
            '\t"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">\n'
            '<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="en" lang="en">\n'
            f' <head>\n  <title>{title}</title>\n </head>\n'
            f' <body>\n  <h1>{title}</h1>\n </body>\n</html>\n')
    headers = {"Allow": allow} if allow else None
    return Response(body, status_code=status, media_type="text/html", headers=headers)


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the node agent owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class MetadataServer:
    """`build_app` served by uvicorn inside the caller's event loop, on a socket it
    binds itself so that ``port=0`` works and `endpoint` names the real port.

    Without a ``secret`` one is drawn at random: tokens then die with the server, which
    clients survive (botocore fetches a new token when a GET answers 401).
    """

    def __init__(self, lookup: MetadataLookup, resolve: CallerResolver, *,
                 host: str = "127.0.0.1", port: int = 0, secret: bytes | None = None) -> None:
        self._app = build_app(lookup, resolve, secret=secret or secrets.token_bytes(32))
        self.host = host
        self._port = port
        self._sock: socket.socket | None = None
        self._server: _Server | None = None
        self._serving: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        if self._sock is None:
            raise RuntimeError("the metadata server is not started")
        return int(self._sock.getsockname()[1])

    @property
    def endpoint(self) -> str:
        """What the node puts in AWS_EC2_METADATA_SERVICE_ENDPOINT. The trailing slash
        is EC2's own form (http://169.254.169.254/); botocore joins paths either way."""
        shown = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.host,
                                                                           self.host)
        if ":" in shown:
            shown = f"[{shown}]"
        return f"http://{shown}:{self.port}/"

    async def start(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP spelled out so asyncio turns Nagle off (see gateway.server).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind((self.host, self._port))
        except OSError:
            sock.close()
            raise
        self._sock = sock
        # proxy_headers off: uvicorn would otherwise take the client address from
        # X-Forwarded-For on loopback connections, letting a caller name its peer.
        self._server = _Server(uvicorn.Config(self._app, log_level="warning",
                                              access_log=False, lifespan="off",
                                              server_header=False, proxy_headers=False))
        self._serving = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._serving.done():
                self._serving.result()  # raises what stopped it
                raise RuntimeError("the metadata server exited while starting")
            await asyncio.sleep(0.01)
        log.info("instance metadata service on %s", self.endpoint)

    async def stop(self) -> None:
        if self._server is not None and self._serving is not None:
            self._server.should_exit = True
            await asyncio.gather(self._serving, return_exceptions=True)
        if self._sock is not None:
            self._sock.close()

    async def __aenter__(self) -> MetadataServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
