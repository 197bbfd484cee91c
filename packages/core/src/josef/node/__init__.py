"""A josef node: assembling a broker and/or controller from plugins, its lifecycle, its lines to peers and controller, running it.

Private to the core: plugins use the public API (see :mod:`josef.api`)."""
