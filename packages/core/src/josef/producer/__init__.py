"""Producers as the broker sees them: producer ids, idempotent-producer state, transaction verification.

Private to the core: plugins use the public API (see :mod:`josef.api`)."""
