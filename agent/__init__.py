"""Tessera node agent: reports a node's GPUs to the server and applies the sharing config it is given.

Standalone: no Django. Its own dependencies are nvidia-ml-py and PyYAML (agent/requirements.txt); it reuses the
pure MIG catalog (sharing/mig/) and the NVIDIA config renderers (sharing/render.py).
"""

AGENT_VERSION = "0.1.0"
