"""josef: a Kafka-compatible event streaming platform, assembled from plugins."""

import importlib.metadata

from josef.hookspecs import hookimpl

__version__ = importlib.metadata.version("josef")
__all__ = ["hookimpl", "__version__"]
