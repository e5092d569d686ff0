"""Backends: how the agent reads and changes a node's GPUs (base.py is the interface)."""
