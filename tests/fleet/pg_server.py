"""A throwaway PostgreSQL server for the fleet tests: a temp directory, 127.0.0.1, a free port.

PostgreSQL refuses to run as root, and the tests (here and in CI) run as root, so the server is
initialised and started as an unprivileged system user: ``postgres`` when it exists, else a
system user created for the purpose. Run as any other user, the server runs as that user.
The binaries are looked up on PATH, then in ``/usr/lib/postgresql/<version>/bin``; when none are
found, :func:`find_binaries` returns None and the tests skip with that reason.

The server is tuned for tests, not durability (``fsync=off``): it lives for one pytest session.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SERVICE_USER = "postgres"
FALLBACK_USER = "cuzk-pg"
SUPERUSER = "cuzk"
START_TIMEOUT_S = 60


@dataclass(frozen=True)
class PgBinaries:
    """The server programs this module runs."""

    initdb: str
    pg_ctl: str


@dataclass(frozen=True)
class PgServer:
    """A running server: ``dsn(dbname)`` connects to one of its databases."""

    host: str
    port: int
    root: Path
    user: str | None
    netns: str | None = None  # the network namespace it runs in (None: this process's)

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq URI for ``dbname`` as the trusted superuser."""
        return f"postgresql://{SUPERUSER}@{self.host}:{self.port}/{dbname}"

    def socket_dsn(self, dbname: str = "postgres") -> str:
        """The same through the server's Unix socket (reached from any network namespace)."""
        return f"postgresql://{SUPERUSER}@/{dbname}?host={self.root}&port={self.port}"


def find_binaries() -> PgBinaries | None:
    """initdb and pg_ctl from PATH, else from the newest /usr/lib/postgresql/*/bin; None if absent."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl:
        return PgBinaries(initdb, pg_ctl)
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                  key=lambda d: int(Path(d).parent.name) if Path(d).parent.name.isdigit() else 0)
    for d in reversed(dirs):
        if os.access(f"{d}/initdb", os.X_OK) and os.access(f"{d}/pg_ctl", os.X_OK):
            return PgBinaries(f"{d}/initdb", f"{d}/pg_ctl")
    return None


def _service_user() -> str | None:
    """The user to run the server as: None when not root, else an unprivileged system user."""
    if os.geteuid() != 0:
        return None
    for name in (SERVICE_USER, FALLBACK_USER):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    subprocess.run([_sbin("useradd"), "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    FALLBACK_USER], check=True, capture_output=True)
    return FALLBACK_USER


def _sbin(program: str) -> str:
    """A system program that may live outside a non-login PATH (runuser, useradd)."""
    path = os.pathsep.join((os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin", "/bin"))
    return shutil.which(program, path=path) or program


def _temp_root(user: str | None) -> str:
    """A temp directory the server's user can reach: $TMPDIR when others may traverse it, else /tmp."""
    tmp = tempfile.gettempdir()
    if user is not None and not os.stat(tmp).st_mode & 0o001:
        tmp = "/tmp"
    return tmp


def _run_as(user: str | None, argv: list[str], netns: str | None = None,
            **kw: object) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (as ``user`` through runuser when given, in network namespace ``netns`` when given),
    raising with its output on failure."""
    cmd = [_sbin("runuser"), "-u", user, "--", *argv] if user else argv
    cmd = ["ip", "netns", "exec", netns, *cmd] if netns else cmd
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}
    proc = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:2])} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc  # type: ignore[no-any-return]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(bins: PgBinaries, root: Path, user: str | None, port: int | None = None, host: str = "127.0.0.1",
           netns: str | None = None) -> int:
    """pg_ctl start on ``host`` and ``port``, else on a free port (a few tries in case another process
    takes the port first), in network namespace ``netns`` when given."""
    last: Exception | None = None
    for _ in range(1 if port is not None else 3):
        chosen = port if port is not None else _free_port()
        opts = (f"-h {host} -p {chosen} -k {root} -c fsync=off -c synchronous_commit=off "
                "-c full_page_writes=off -c max_connections=200 -c shared_buffers=32MB")
        try:
            _run_as(user, [bins.pg_ctl, "-D", str(root / "data"), "-l", str(root / "server.log"),
                           "-w", "-t", str(START_TIMEOUT_S), "-o", opts, "start"], netns)
            return chosen
        except RuntimeError as e:
            last = e
            time.sleep(0.2)
    log = (root / "server.log").read_text(errors="replace") if (root / "server.log").exists() else ""
    raise RuntimeError(f"PostgreSQL did not start: {last}\n{log[-4000:]}")


def stop(bins: PgBinaries, server: PgServer, mode: str = "immediate") -> None:
    """Stop ``server`` (an outage): its clients' connections break, new ones are refused. An
    ``immediate`` stop is a crash: without fsync, what was committed last may be lost with it;
    a ``fast`` one writes everything out first."""
    _run_as(server.user, [bins.pg_ctl, "-D", str(server.root / "data"), "-m", mode, "-w", "stop"])


def start_again(bins: PgBinaries, server: PgServer) -> None:
    """Start a stopped ``server`` again on its own port (the end of an outage)."""
    _start(bins, server.root, server.user, server.port, server.host, server.netns)


@contextlib.contextmanager
def fresh_database(server: PgServer, name: str) -> Iterator[str]:
    """A database created on ``server`` for the block (dropped after it); its DSN."""
    import psycopg
    admin = server.socket_dsn() if server.netns else server.dsn()  # the test may cut the namespace's link
    with psycopg.connect(admin, autocommit=True) as conn:
        # FILE_COPY (PostgreSQL 15+) copies the small template faster than the WAL_LOG default.
        strategy = " STRATEGY FILE_COPY" if conn.info.server_version >= 150000 else ""
        conn.execute(f"CREATE DATABASE {name}{strategy}")
    try:
        yield server.dsn(name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextlib.contextmanager
def running_server(bins: PgBinaries, host: str = "127.0.0.1", netns: str | None = None) -> Iterator[PgServer]:
    """Initialise and start a server in a fresh temp directory; stop it and remove the directory.

    ``host`` is the address it listens on (beside its Unix socket), ``netns`` the network namespace it
    runs in (where the test made one): clients on that namespace's subnets are trusted too."""
    user = _service_user()
    root = Path(tempfile.mkdtemp(prefix="cuzk-fleet-pg-", dir=_temp_root(user)))
    try:
        os.chmod(root, 0o700)
        if user is not None:
            pw = pwd.getpwnam(user)
            os.chown(root, pw.pw_uid, pw.pw_gid)
        _run_as(user, [bins.initdb, "-D", str(root / "data"), "-U", SUPERUSER, "-A", "trust",
                       "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"])
        if netns is not None:
            with open(root / "data" / "pg_hba.conf", "a") as hba:
                hba.write("host all all samenet trust\n")
        port = _start(bins, root, user, host=host, netns=netns)
        try:
            yield PgServer(host, port, root, user, netns)
        finally:
            _run_as(user, [bins.pg_ctl, "-D", str(root / "data"), "-m", "immediate", "-w", "stop"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
