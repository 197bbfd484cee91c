"""Errors josef's client raises; each carries the Kafka error code when the broker gave one."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from josef.config import ConfigError

__all__ = ["ConfigError", "KafkaError", "KafkaConnectionError", "KafkaTimeoutError", "UnsupportedVersionError", "check"]


class KafkaError(Exception):
    """A request failed. ``code`` is Kafka's error code; ``retriable`` says whether trying again may help."""

    def __init__(self, code: ErrorCode, message: str = "") -> None:
        self.code = code
        self.message = message or code.name.upper()
        super().__init__(f"{code.name.upper()} ({int(code)}): {self.message}" if message else self.message)

    @property
    def retriable(self) -> bool:
        return bool(self.code.retriable)


class KafkaConnectionError(KafkaError):
    """The connection to a broker failed or closed; the request may or may not have been processed."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.network_exception, message)


class KafkaTimeoutError(KafkaError):
    """The broker did not answer within ``request.timeout.ms``, or a wait ran past its deadline."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.request_timed_out, message)


class UnsupportedVersionError(KafkaError):
    """The broker and josef share no version of an API."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.unsupported_version, message)


def check(code: ErrorCode, message: str | None = None) -> None:
    """Raise :class:`KafkaError` unless ``code`` is NONE."""
    if code != ErrorCode.none:
        raise KafkaError(code, message or "")
