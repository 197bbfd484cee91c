"""KRaft metadata quorum for josef."""
