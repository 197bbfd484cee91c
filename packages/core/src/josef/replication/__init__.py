"""Partition replicas on this broker: leaders, followers, the high watermark, the purgatory where requests wait.

Private to the core: plugins use the public API (see :mod:`josef.api`)."""
