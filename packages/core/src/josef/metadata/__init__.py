"""Cluster metadata: records, the image built from them, and the controller that writes them."""
