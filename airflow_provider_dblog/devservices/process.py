"""Running one local server as a child process: ports, start-up, shutdown.

Tests, the demo and developers need real PostgreSQL, MariaDB and Redis servers without Docker.
Every server here is a process in its own session (so it can outlive the command that started it),
writes its output to a log file in its directory, is ready only when a real query succeeds, and
is stopped gracefully first and killed (with everything it forked) after a grace period.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import logging
import os
import pwd
import secrets
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
#: Unix socket paths longer than this do not fit in sockaddr_un (108 bytes with the NUL).
MAX_SOCKET_PATH = 100

_ports_handed_out: set[int] = set()


class ServerStartError(RuntimeError):
    """A server did not start; the message ends with the tail of its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (and that we did not hand out yet)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((LOOPBACK, 0))
            port: int = sock.getsockname()[1]
        if port not in _ports_handed_out:
            _ports_handed_out.add(port)
            return port


def port_is_free(port: int) -> bool:
    """True if a server could bind 127.0.0.1:port now (as servers do, with SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def generate_password() -> str:
    """A random password that needs no quoting in a URL, a conninfo string or SQL."""
    return secrets.token_hex(16)


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def socket_dir(preferred: Path, socket_name: str) -> Path:
    """`preferred` if a socket named `socket_name` fits in it, else a fresh short directory."""
    if len(str(preferred / socket_name)) <= MAX_SOCKET_PATH:
        preferred.mkdir(parents=True, exist_ok=True)
        return preferred
    import tempfile

    return Path(tempfile.mkdtemp(prefix="dblog-sock-"))


# --- processes -----------------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process from /proc, or None if it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def is_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie."""
    if not Path("/proc").is_dir():  # pragma: no cover - not Linux
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    found = _proc_stat(pid)
    return found is not None and found[0] not in ("Z", "X")


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def descendants(pid: int) -> list[int]:
    """All processes below `pid` (PostgreSQL backends start their own sessions, so
    a process group is not enough to find them)."""
    children: dict[int, list[int]] = {}
    if not Path("/proc").is_dir():  # pragma: no cover - not Linux: the process group must do
        return []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            found = _proc_stat(int(entry.name))
            if found is not None:
                children.setdefault(found[1], []).append(int(entry.name))
    result: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            result.append(child)
            todo.append(child)
    return result


def _signal(pid: int, sig: int, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def stop_process(
    pid: int,
    *,
    graceful: signal.Signals | None = signal.SIGTERM,
    grace_seconds: float = 15.0,
    popen: subprocess.Popen[bytes] | None = None,
) -> None:
    """Stop a server and everything it started.

    Sends `graceful` to the server alone (it shuts its workers down itself), waits up to
    `grace_seconds`, then SIGKILLs its process group and every descendant. With
    `graceful=None` it kills at once (a crash, for tests). Returns when all are gone.
    """
    victims = [pid, *descendants(pid)]

    def gone() -> bool:
        # Our own child is gone once reaped: the kernel reaps a process only after all its
        # threads ended, while its main thread may show as a zombie before the others let go
        # of its sockets (a port then still bound for a moment after SIGKILL).
        if popen is not None and popen.poll() is None:
            return False
        return not any(is_alive(p) for p in victims)

    if graceful is not None:
        _signal(pid, graceful)
        if _wait(gone, grace_seconds):
            return
        logger.warning(
            "pid %d did not stop within %.0fs after %s: killing", pid, grace_seconds, graceful.name
        )
    victims = [*victims, *descendants(pid)]
    _signal(pid, signal.SIGKILL, group=True)
    for victim in victims:
        _signal(victim, signal.SIGKILL)
    if not _wait(gone, 10.0):
        alive = [p for p in victims if is_alive(p)]
        raise RuntimeError(f"processes {alive} still alive after SIGKILL")


def _wait(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll `condition` until it holds or `timeout` passes; True if it held."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)


def wait_until_answers(
    check: Callable[[], object],
    *,
    what: str,
    popen: subprocess.Popen[bytes],
    log_file: Path,
    timeout: float,
) -> None:
    """Call `check` (a real query) until it returns without raising.

    Fails at once if the process exits, and after `timeout` otherwise; either error carries
    the tail of the server's log.
    """
    deadline = time.monotonic() + timeout
    delay = 0.01
    last_error: Exception | None = None
    while True:
        code = popen.poll()
        if code is not None:
            raise ServerStartError(
                f"{what} exited with code {code} while starting; log {log_file}:\n"
                f"{log_tail(log_file)}"
            )
        try:
            check()
            return
        except Exception as error:
            last_error = error
        if time.monotonic() >= deadline:
            raise ServerStartError(
                f"{what} did not answer within {timeout:.0f}s (last error: {last_error}); "
                f"log {log_file}:\n{log_tail(log_file)}"
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)


# --- running as another user -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunAs:
    """The system user a server runs as (PostgreSQL refuses to run as root)."""

    uid: int
    gid: int

    @classmethod
    def user(cls, name: str) -> RunAs:
        entry = pwd.getpwnam(name)
        return cls(entry.pw_uid, entry.pw_gid)

    def popen_kwargs(self) -> dict[str, Any]:
        if self.uid == os.geteuid():
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def own(self, *paths: Path) -> None:
        """Give `paths` to this user (no-op when it is us)."""
        if self.uid != os.geteuid():
            for path in paths:
                os.chown(path, self.uid, self.gid)

    def make_reachable(self, path: Path) -> None:
        """Let this user reach `path`: add o+x to any directory above it that lacks it.

        Needed when root runs a server as another user inside a private directory (pytest's
        /tmp/pytest-of-root is 0700). Search only: directory listings stay private.
        """
        if self.uid == os.geteuid():
            return
        for directory in [path, *path.parents]:
            mode = directory.stat().st_mode
            if not mode & stat.S_IXOTH:
                logger.info("adding o+x to %s so uid %d can reach %s", directory, self.uid, path)
                directory.chmod(mode | stat.S_IXOTH)


def current_user() -> RunAs:
    return RunAs(os.geteuid(), os.getegid())


def run_logged(
    argv: Sequence[str | Path], log_file: Path, *, what: str, timeout: float = 120, **kwargs: Any
) -> None:
    """Run a one-shot setup command (initdb, install-db) with its output appended to the log."""
    with log_file.open("ab") as log:
        log.write(f"$ {' '.join(map(str, argv))}\n".encode())
        log.flush()
        result = subprocess.run(
            [str(a) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
            **kwargs,
        )
    if result.returncode != 0:
        raise ServerStartError(
            f"{what} failed with code {result.returncode}; log {log_file}:\n{log_tail(log_file)}"
        )


# --- what a caller gets --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServiceInfo:
    """Where a running server is, plus a handle on it (to restart it in tests).

    Subclasses add the connection fields. `to_json` leaves the handle out; an info read back
    with `from_json` has none, and its `restart()` etc. raise.
    """

    data_dir: Path
    log_file: Path
    server: ServerProcess | None = dataclasses.field(default=None, repr=False, compare=False)

    def _handle(self) -> ServerProcess:
        if self.server is None:
            raise RuntimeError("this info was read from a state file: it has no server handle")
        return self.server

    def start(self) -> None:
        self._handle().start()

    def stop(self) -> None:
        self._handle().stop()

    def restart(self) -> None:
        self._handle().restart()

    def kill(self) -> None:
        """SIGKILL the server and all its processes (a crash); `start()` brings it back."""
        self._handle().kill()

    def answers(self) -> bool:
        """True if the server answers a real query now."""
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        return {
            f.name: str(value) if isinstance(value, Path) else value
            for f in dataclasses.fields(self)
            if f.name != "server"
            for value in [getattr(self, f.name)]
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        kwargs: dict[str, Any] = {
            f.name: Path(data[f.name]) if f.type in ("Path", Path) else data[f.name]
            for f in dataclasses.fields(cls)
            if f.name in data
        }
        return cls(**kwargs)


# --- the server life cycle -----------------------------------------------------------------


class ServerProcess(abc.ABC):
    """One server in `base_dir`: set up on first start, then started, stopped, restarted.

    Subclasses say how to set the server up (`_initialise`, `_bootstrap`), how to run it
    (`_command`), how to tell it answers (`_check`) and what callers need (`info`).
    """

    name: ClassVar[str]
    graceful_signal: ClassVar[signal.Signals] = signal.SIGTERM
    grace_seconds: ClassVar[float] = 15.0
    start_timeout: ClassVar[float] = 60.0

    def __init__(self, base_dir: Path | str, *, port: int | None = None) -> None:
        self.base_dir = Path(base_dir).resolve()
        self.port: int = port or 0
        self._fixed_port = port is not None
        self.password = generate_password()
        self.log_file = self.base_dir / f"{self.name}.log"
        self.run_as = current_user()
        self.start_seconds: float | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self._initialised = False

    @property
    def label(self) -> str:
        """How logs and errors name this server."""
        return self.name

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    @property
    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    @abc.abstractmethod
    def _initialise(self) -> None:
        """Create the data directory and configuration (first start only)."""

    @abc.abstractmethod
    def _command(self) -> list[str]:
        """The command line that runs the server in the foreground on self.port."""

    @abc.abstractmethod
    def _check(self) -> None:
        """Run a real query as the admin; raise if the server does not answer yet."""

    @abc.abstractmethod
    def _bootstrap(self) -> None:
        """Create the application user and database (first start only)."""

    def _prepare(self) -> None:
        """Before every start: undo what others may have changed since (default: nothing)."""
        return None

    @property
    @abc.abstractmethod
    def info(self) -> ServiceInfo:
        """What a caller needs to connect."""

    def start(self) -> Self:
        """Start the server and return once it answers queries. No-op if it runs."""
        if self.running:
            return self
        began = time.monotonic()
        first = not self._initialised
        if first:
            self.base_dir.mkdir(parents=True, exist_ok=True)
            self._initialise()
        self._prepare()
        for attempt in range(3):
            if not self.port:
                self.port = free_port()
            try:
                self._spawn()
                break
            except ServerStartError as error:
                # Someone took the port between free_port() and the server's bind: pick another,
                # unless callers already know the port (a restart).
                movable = first and not self._fixed_port
                if not movable or attempt == 2 or "already in use" not in str(error):
                    raise
                logger.info("%s: port %d was taken, trying another", self.label, self.port)
                self.port = 0
        if first:
            try:
                self._bootstrap()
            except BaseException:
                self.kill()
                raise
            self._initialised = True
        self.start_seconds = time.monotonic() - began
        logger.info(
            "%s started on %s:%d in %.2fs (log %s)",
            self.label,
            LOOPBACK,
            self.port,
            self.start_seconds,
            self.log_file,
        )
        return self

    def _spawn(self) -> None:
        with self.log_file.open("ab") as log:
            self._popen = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,
                start_new_session=True,  # its own process group, and it survives our exit
                **self.run_as.popen_kwargs(),
            )
        try:
            wait_until_answers(
                self._check,
                what=f"{self.label} on port {self.port}",
                popen=self._popen,
                log_file=self.log_file,
                timeout=self.start_timeout,
            )
        except ServerStartError:
            self.kill()
            raise

    def stop(self) -> None:
        """Stop gracefully (SIGKILL after the grace period). The data stays for `start()`."""
        if self._popen is not None:
            stop_process(
                self._popen.pid,
                graceful=self.graceful_signal,
                grace_seconds=self.grace_seconds,
                popen=self._popen,
            )
            self._popen = None

    def kill(self) -> None:
        """SIGKILL the server and all its processes at once, as in a crash."""
        if self._popen is not None:
            stop_process(self._popen.pid, graceful=None, popen=self._popen)
            self._popen = None

    def restart(self) -> None:
        """Stop and start again on the same port, directory and data."""
        self.stop()
        self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
