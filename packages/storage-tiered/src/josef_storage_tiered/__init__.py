"""Tiered storage for josef (KIP-405): remote storage backends that copy rolled segments to an object store."""

__version__ = "0.1.0"
