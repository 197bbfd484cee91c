"""The coordinator runtime shared by the group, transaction and share coordinators."""
