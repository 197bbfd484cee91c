"""Producer and consumer interceptors, chained with Kafka's contract.

Interceptors are registered by name through the ``register_interceptors``
hook and listed in ``interceptor.classes``; each is called in that order,
and one that raises is logged while the chain goes on (unlike pluggy hooks,
which stop at the first error).

A producer interceptor may define ``on_send(record) -> record`` and
``on_acknowledgement(metadata, error)``; a consumer interceptor
``on_consume(records) -> records`` and ``on_commit(offsets)``. Missing
methods are skipped.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Sequence

import pluggy

from josef.plugins import collect, get_plugin_manager

log = logging.getLogger(__name__)


class InterceptorChain:
    def __init__(self, interceptors: Sequence[Any]) -> None:
        self.interceptors = list(interceptors)

    @classmethod
    def from_config(cls, names: Iterable[str], config: dict[str, Any], pm: pluggy.PluginManager | None = None) -> InterceptorChain:
        names = list(names)
        if not names:
            return cls([])
        registry = collect(pm or get_plugin_manager(), "register_interceptors", "interceptor")
        return cls([registry.get(name)(config) for name in names])

    def __bool__(self) -> bool:
        return bool(self.interceptors)

    def _each(self, method: str) -> Iterable[tuple[Any, Any]]:
        for interceptor in self.interceptors:
            function = getattr(interceptor, method, None)
            if function is not None:
                yield interceptor, function

    def on_send(self, record: Any) -> Any:
        """Each interceptor may replace the record; a failing one leaves it as it was."""
        for interceptor, function in self._each("on_send"):
            try:
                record = function(record)
            except Exception:
                log.exception("interceptor %r failed in on_send; continuing", interceptor)
        return record

    def on_acknowledgement(self, metadata: Any, error: Exception | None) -> None:
        for interceptor, function in self._each("on_acknowledgement"):
            try:
                function(metadata, error)
            except Exception:
                log.exception("interceptor %r failed in on_acknowledgement; continuing", interceptor)

    def on_consume(self, records: Any) -> Any:
        for interceptor, function in self._each("on_consume"):
            try:
                records = function(records)
            except Exception:
                log.exception("interceptor %r failed in on_consume; continuing", interceptor)
        return records

    def on_commit(self, offsets: Any) -> None:
        for interceptor, function in self._each("on_commit"):
            try:
                function(offsets)
            except Exception:
                log.exception("interceptor %r failed in on_commit; continuing", interceptor)
