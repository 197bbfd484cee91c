"""josef: a Kafka-compatible event streaming platform, assembled from plugins."""

from josef.hookspecs import hookimpl

__version__ = "0.1.0"
__all__ = ["hookimpl", "__version__"]
