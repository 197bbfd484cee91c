"""The broker's network side: connections, framing and request dispatch."""
