"""Running a broker: on this thread until a signal (the CLI), or on a background thread (tests, notebooks)."""

from __future__ import annotations

import contextlib
import gc
import logging
import signal
from concurrent.futures import Future
from typing import Any, Mapping

import anyio
import anyio.from_thread
import pluggy

from josef.node.broker import Broker
from josef.config import Config
from josef.node.server_properties import load_config

log = logging.getLogger(__name__)


def backend_options() -> dict[str, Any]:
    """uvloop when installed: same asyncio semantics, faster loop."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return {}
    return {"use_uvloop": True}


def run_forever(config: Config, *, auto_format: bool, pm: pluggy.PluginManager | None = None) -> None:
    """Run a broker on this thread until SIGTERM or SIGINT, then shut it down cleanly."""

    async def main() -> None:
        broker = Broker(config, pm, auto_format=auto_format)
        async with anyio.create_task_group() as tg:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                await tg.start(broker.run)
                # What start-up made (modules, plugins, the image, open logs) lives as long as the process: out of
                # the collector's sight, a full collection no longer walks it, which held the event loop for tens
                # of ms each time on a broker with thousands of partitions.
                gc.freeze()
                async for signum in signals:
                    log.info("received %s, shutting down", signal.Signals(signum).name)
                    broker.request_stop()
                    break

    try:
        anyio.run(main, backend="asyncio", backend_options=backend_options())
    except BaseExceptionGroup as group:
        raise _sole(group) from None


def _sole(exc: BaseException) -> BaseException:
    """The one error inside nested task-group wrappers, so start-up failures read plainly."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


class BrokerThread:
    """A real broker on its own thread and event loop, for tests and interactive use.

    >>> with BrokerThread({"log.dirs": "/tmp/x", "listeners": "PLAINTEXT://127.0.0.1:0"}) as b:
    ...     b.bootstrap_servers
    """

    def __init__(self, overrides: Mapping[str, str], pm: pluggy.PluginManager | None = None) -> None:
        self.overrides = dict(overrides)
        self.pm = pm
        self.broker: Broker | None = None
        self._stack: contextlib.ExitStack | None = None
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._task: Future[None] | None = None

    @property
    def port(self) -> int:
        assert self.broker is not None, "broker is not running"
        return self.broker.client_listeners()[0].port

    @property
    def bootstrap_servers(self) -> str:
        assert self.broker is not None, "broker is not running"
        bound = self.broker.client_listeners()[0]
        return f"{bound.host or '127.0.0.1'}:{bound.port}"

    def start(self) -> BrokerThread:
        config = load_config(None, self.overrides, self.pm)
        self._stack = contextlib.ExitStack()
        self._portal = self._stack.enter_context(
            anyio.from_thread.start_blocking_portal("asyncio", backend_options()))
        try:
            self.broker = self._portal.call(lambda: Broker(config, self.pm, auto_format=True))
            self._task, _ = self._portal.start_task(self.broker.run, name="josef-broker")
        except BaseException:
            self._stack.close()
            raise
        return self

    def call(self, func: Any, *args: Any) -> Any:
        """Run ``func(*args)`` (a coroutine function or a plain one) on the broker's loop and return its result."""
        assert self._portal is not None
        return self._portal.call(func, *args)

    def stop(self) -> None:
        """Shut down cleanly (close logs, write checkpoints), as SIGTERM does."""
        if self._task is not None and self._portal is not None and self.broker is not None:
            self._portal.call(self.broker.request_stop)
            with contextlib.suppress(BaseException):
                self._task.result(timeout=30)
        if self._stack is not None:
            self._stack.close()
        self._task = self._portal = self._stack = None

    def restart(self) -> BrokerThread:
        """Stop cleanly and start again on the same port, as a restarted broker would be found by clients."""
        if self.broker is not None and self.broker.bound:
            self.overrides["listeners"] = ",".join(f"{b.name}://{b.host}:{b.port}" for b in self.broker.bound)
        self.stop()
        return self.start()

    def __enter__(self) -> BrokerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
