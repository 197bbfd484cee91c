"""Consumer groups for josef."""
