"""Segmented local-disk log storage for josef, in Kafka's on-disk format."""

from josef_storage_local.log import LocalLog
from josef_storage_local.storage import LocalLogStorage

__all__ = ["LocalLog", "LocalLogStorage"]
