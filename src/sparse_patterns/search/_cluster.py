"""The cluster a search runs on: a LocalCluster of its own, a given ``Client``, or a
scheduler address, each checked so that a failure is one line within the stated time.

A scheduler address is first probed with a plain socket (``tcp://`` only): the
connection, and the scheduler's first message (the handshake every Dask server
sends on accepting a connection), must arrive within ``timeout`` seconds and
announce a sane size (:data:`MAX_HANDSHAKE`). A server that never answers, drips
bytes, speaks HTTP or announces a frame of exabytes is refused here, before
``distributed`` would wait on it or allocate what it announces. The ``Client``
is then made in a helper thread under distributed's own connect timeouts, and
waited for until the same deadline. A closed or asynchronous ``Client`` is a
``ValueError`` naming the client.

The local cluster starts worker processes with ``multiprocessing``'s spawn,
which imports the main module again in each of them: a script that calls
:func:`~sparse_patterns.search.search` outside ``if __name__ == "__main__":``
would start a cluster in every worker. :func:`check_not_bootstrapping` stops
that in the worker (quietly when the parent search is told, through a marker
file named in :data:`GUARD_ENV`) and the parent raises one ``RuntimeError``
naming the guard.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import re
import signal
import socket
import struct
import tempfile
import threading
import time
from typing import Any

from ._grid import _shown as shown

__all__ = ["connect", "close_all", "check_not_bootstrapping", "WORKER_ENV", "GUARD_ENV",
           "MAX_HANDSHAKE"]

#: Environment of the local cluster's worker processes: one thread each, for numba and BLAS.
WORKER_ENV = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "MKL_NUM_THREADS": "1"}
#: Names the marker file a worker process creates when it finds itself importing a main
#: module that calls search() unguarded (set only while a local cluster starts).
GUARD_ENV = "SPARSE_PATTERNS_SEARCH_GUARD"
#: Largest first message (bytes) a scheduler address may announce: a Dask handshake is a
#: few hundred bytes.
MAX_HANDSHAKE = 1 << 20
#: The scheduler of a local cluster: no dashboard, its HTTP endpoint (health checks) on a
#: free port of 127.0.0.1, never on 8787.
_NO_DASHBOARD = {"dashboard": False, "dashboard_address": "127.0.0.1:0"}
#: dask settings of the local cluster. dask sets MALLOC_TRIM_THRESHOLD_ for its workers, which
#: turns glibc's adaptive mmap threshold off: every large temporary of the plan is then a fresh
#: mmap, and planning runs about 2x slower, so our workers keep the allocator's defaults. With
#: no dashboard, the event loops' diagnostics (the workers' statistical profiler, every 10 ms;
#: the loops' blocked-tick check, 20 ms; the servers' psutil monitor, 500 ms) only take CPU from
#: the tasks: 30-60 ms of 1.1 s a grid of 48 candidates on 2 cores. The memory monitor stays.
_LOCAL_CONFIG = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
                 "distributed.worker.profile.enabled": False,
                 "distributed.admin.tick.interval": "1s",
                 "distributed.admin.system-monitor.interval": "5s"}
#: Seconds to close the client, then the local cluster, after Ctrl-C or an error.
_QUICK_CLOSE = 2
_ADDRESS = re.compile(r"^(?:(?:tcp|tls|ucx|ws|wss)://)?[\w.\-\[\]:]+:\d{1,5}$", re.ASCII)
_GUARD = ("search: the local cluster's workers did not start: each is a new process that "
          "imports the calling script again, which calls search() again; put that call under "
          "`if __name__ == \"__main__\":`")
_GUARD_CHILD = ("search: called while a new process imports the main module (a script without "
                "`if __name__ == \"__main__\":` around its search() call); put the call under "
                "that guard")


def check_not_bootstrapping() -> None:
    """``SystemExit`` in a process that ``multiprocessing`` is starting (it runs the main
    module to find its functions): a search there would start a cluster in every worker.

    Quiet (exit status 1) when the parent search named a marker file to create
    (:data:`GUARD_ENV`), which then says why; else the one-line reason.
    """
    if not getattr(multiprocessing.current_process(), "_inheriting", False):
        return
    mark = os.environ.get(GUARD_ENV)
    if mark:
        with contextlib.suppress(OSError):
            os.close(os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        raise SystemExit(1)
    raise SystemExit(_GUARD_CHILD)


def _shown(address: Any) -> str:
    return shown(address, 80)


def connect(client: Any, workers: int | None, timeout: float) -> tuple[Any, list[Any]]:
    """``(client, what to close afterwards, in order)``: a new LocalCluster (and the
    environment to put back after it), the given Client, or a Client of the given
    scheduler address."""
    from distributed import Client  # noqa: PLC0415

    if client is None:
        return _local(workers)
    if workers is not None:
        raise ValueError("workers: sizes the local cluster; a given client or scheduler has "
                         "its own workers")
    if isinstance(client, Client):
        if client.status in ("closing", "closed") or client.scheduler is None:
            raise ValueError(f"client: the given distributed.Client is {client.status}; give an "
                             "open one, a scheduler address or None (a local cluster)")
        if client.asynchronous:
            raise ValueError("client: the given distributed.Client is asynchronous; give a "
                             "synchronous one (Client(...)), an address or None")
        _has_workers(client, str(client.scheduler.address), timeout)
        return client, []
    if not isinstance(client, str):
        raise TypeError(f"client: expected None, a distributed.Client or a scheduler address "
                        f"(tcp://HOST:PORT), got {type(client).__name__}")
    address = client.strip()
    if _ADDRESS.match(address) is None:
        raise ValueError(f"client: not a scheduler address: {_shown(client)}; expected "
                         "tcp://HOST:PORT (the port `dask scheduler` prints, 8786 by default)")
    connected = _client_of(address, timeout)
    try:
        _has_workers(connected, address, timeout)
    except BaseException:
        connected.close()
        raise
    return connected, []


def _local(workers: int | None) -> tuple[Any, list[Any]]:
    """A LocalCluster of ``workers`` processes (one per core), and a Client of it."""
    import dask  # noqa: PLC0415
    from distributed import Client, LocalCluster  # noqa: PLC0415

    environ = _Environ()  # the nannies write their workers' variables into os.environ
    mark = os.path.join(tempfile.mkdtemp(prefix="sparse-patterns-"), "unguarded")
    os.environ[GUARD_ENV] = mark
    nw = workers if workers is not None else max(1, os.cpu_count() or 1)
    try:
        try:
            # silent while it runs (here and in its workers): what goes wrong comes back as
            # a row or one line; a Ctrl-C's broken transfers logged tracebacks on stderr
            with dask.config.set(_LOCAL_CONFIG), _quiet("distributed.nanny"):
                cluster = LocalCluster(n_workers=nw, threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=logging.CRITICAL,
                                       env=WORKER_ENV, scheduler_kwargs=_NO_DASHBOARD)
        except Exception as exc:
            if os.path.exists(mark):
                raise RuntimeError(_GUARD) from None
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise RuntimeError(f"workers: the local cluster did not start "
                               f"({type(exc).__name__}: {msg[:200]})") from None
        finally:
            os.environ.pop(GUARD_ENV, None)
            with contextlib.suppress(OSError):
                os.unlink(mark)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(mark))
    except BaseException:
        environ.close()
        raise
    try:
        # rows come straight from the workers, not through the scheduler, which runs
        # in this process and shares its cores with them
        return Client(cluster, set_as_default=False, direct_to_workers=True), [cluster, environ]
    except BaseException:
        cluster.close()
        environ.close()
        raise


@contextlib.contextmanager
def _quiet(name: str) -> Any:
    """No records from logger ``name`` (the nanny logs every failed start with a
    traceback; the failure comes back as one exception instead)."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def _client_of(address: str, timeout: float) -> Any:
    """A Client of the scheduler at ``address``, or ``ConnectionError`` within ``timeout``
    seconds (plus a moment for the helper thread to hand over)."""
    deadline = time.monotonic() + timeout
    _probe(address, deadline, timeout)
    box: dict[str, Any] = {}
    done = threading.Event()

    def start() -> None:
        import dask  # noqa: PLC0415
        from distributed import Client  # noqa: PLC0415

        left = max(0.1, deadline - time.monotonic())
        made = Client.__new__(Client)
        try:
            with dask.config.set({"distributed.comm.timeouts.connect": f"{left}s"}):
                made.__init__(address, timeout=left, set_as_default=False)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
            # closed here, briefly: else its __del__ closes it later, waiting up to 10 s
            # and printing "Exception ignored" when that times out
            with contextlib.suppress(BaseException):
                made.close(timeout=1)
        else:
            box["client"] = made
            if box.get("abandoned"):  # the caller gave up meanwhile
                with contextlib.suppress(Exception):
                    made.close()
        finally:
            done.set()

    threading.Thread(target=start, name="sparse-patterns-connect", daemon=True).start()
    if not done.wait(max(0.0, deadline - time.monotonic()) + 0.5):
        box["abandoned"] = True
        raise ConnectionError(f"scheduler: no answer from {_shown(address)} within {timeout:g} s")
    if "client" in box:
        return box["client"]
    exc = box["error"]
    if isinstance(exc, TimeoutError):
        raise ConnectionError(f"scheduler: no answer from {_shown(address)} within {timeout:g} s "
                              "(it accepts connections but does not answer as a scheduler)")
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    raise ConnectionError(f"scheduler: cannot reach {_shown(address)} within {timeout:g} s "
                          f"({msg[:160]})") from None


def _probe(address: str, deadline: float, timeout: float) -> None:
    """Connect to a ``tcp://`` address and read the server's first message, bounded in
    size and time; ``ConnectionError`` when it is not what a Dask server sends."""
    scheme, _, hostport = address.rpartition("://")
    if scheme not in ("", "tcp"):
        return
    host, _, port = hostport.rpartition(":")
    host = host.strip("[]")
    where = _shown(address)
    box: dict[str, BaseException | None] = {}

    def run() -> None:
        try:
            with socket.create_connection((host, int(port)), timeout=timeout) as sock:
                head = _recv(sock, 8, deadline)
                (size,) = struct.unpack("Q", head)
                if not 8 <= size <= MAX_HANDSHAKE:
                    raise _NotDask(f"its first message announces {size:,} bytes")
                body = _recv(sock, size, deadline)
                (frames,) = struct.unpack_from("Q", body)
                if not 1 <= frames <= 64 or 8 * (1 + frames) > size:
                    raise _NotDask(f"its first message announces {frames:,} frames")
                lengths = struct.unpack_from(f"{frames}Q", body, 8)
                rest = 8 * (1 + frames) + sum(lengths) - size
                if not 0 <= rest <= MAX_HANDSHAKE:
                    raise _NotDask("its first message's frames do not add up")
                if rest:
                    _recv(sock, rest, deadline)
            box["error"] = None
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    # a thread: name resolution (getaddrinfo) has no timeout of its own
    thread = threading.Thread(target=run, name="sparse-patterns-probe", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()) + 0.2)
    if "error" not in box:
        raise ConnectionError(f"scheduler: no answer from {where} within {timeout:g} s")
    exc = box["error"]
    if exc is None:
        return
    if isinstance(exc, _NotDask):
        raise ConnectionError(f"scheduler: {where} is not a Dask scheduler ({exc})") from None
    if isinstance(exc, (TimeoutError, socket.timeout)):
        raise ConnectionError(f"scheduler: no answer from {where} within {timeout:g} s") from None
    if isinstance(exc, EOFError):
        raise ConnectionError(f"scheduler: {where} closed the connection before saying what it "
                              "is (not a Dask scheduler?)") from None
    if isinstance(exc, OSError):
        why = exc.strerror or str(exc) or type(exc).__name__
        raise ConnectionError(f"scheduler: cannot reach {where} within {timeout:g} s "
                              f"({why[:120]})") from None
    raise ConnectionError(f"scheduler: cannot reach {where} ({type(exc).__name__})") from None


class _NotDask(Exception):
    """What a server sent that no Dask server sends."""


def _recv(sock: socket.socket, n: int, deadline: float) -> bytes:
    """Exactly ``n`` bytes by ``deadline`` (``TimeoutError``), or ``EOFError``."""
    chunks, got = [], 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        chunk = sock.recv(min(n - got, 1 << 16))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _has_workers(client: Any, address: str, timeout: float) -> None:
    """``ConnectionError`` unless the scheduler has a worker within ``timeout`` seconds."""
    try:
        client.wait_for_workers(1, timeout=timeout)
    except (OSError, TimeoutError):
        raise ConnectionError(f"scheduler: {_shown(address)} has no workers after {timeout:g} s; "
                              f"start some: dask worker {address[:200]}") from None


class _Environ:
    """``os.environ`` as it is now, put back by :meth:`close` (after the cluster closes)."""

    def __init__(self) -> None:
        self.saved = dict(os.environ)

    def close(self) -> None:
        for key in set(os.environ) - set(self.saved):
            del os.environ[key]
        for key, value in self.saved.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


def close_all(client: Any, owned: list[Any], own_client: bool, quick: bool = False) -> None:
    """Close our client (when we made it), then what we started, in order; ``quick``
    (Ctrl-C, an error): each within a few seconds, not waiting on busy workers."""
    if quick:
        for thing in owned:
            _kill_workers(thing)
    for thing in ([client] if own_client else []) + owned:
        try:
            if quick and not isinstance(thing, _Environ):
                thing.close(timeout=_QUICK_CLOSE)
            else:
                thing.close()
        except Exception:  # noqa: BLE001, S110 - closing what is already gone (or slow)
            pass


def _kill_workers(cluster: Any) -> None:
    """Kill the worker processes of our own LocalCluster: each one's nanny would otherwise
    give it 10 s to stop when the cluster closes (at exit, if not before), while the
    command has already said what is saved."""
    for nanny in list(getattr(cluster, "workers", {}).values()):
        pid = getattr(nanny, "pid", None)
        if isinstance(pid, int) and pid > 0:
            # the nanny would start a new worker for the one killed
            with contextlib.suppress(Exception):
                nanny.status = type(nanny.status).closing_gracefully
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
