"""Transactions for josef."""
