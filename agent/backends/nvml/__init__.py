"""The real node: NVML through nvidia-ml-py (contracts §6), and NVIDIA's own tools where NVML stops (§2, §5).

`nvml` is the pynvml module on a GPU host; tests pass the simulated layer (agent/simnvml/), which exposes the same
functions, so this mapping is the code under test. Constants, ctypes structures and error classes always come from
pynvml itself: they need no driver.

The modules follow what the backend does: `calls` (errors and tool output in words), `inventory`, `metrics` (with
XID events), `mig`, `mps` (MPS, time-slicing, compute and persistence mode), `settings` (QoS node settings) and
`backend`, which puts them together as `NvmlBackend`.
"""

from agent.backends.nvml.backend import NvmlBackend

__all__ = ["NvmlBackend"]
