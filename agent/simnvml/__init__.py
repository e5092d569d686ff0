"""A simulated NVML: the pynvml functions the NVML backend calls, over GPUs built from the MIG catalog.

Handles are real ctypes pointers and results are pynvml's own structures, so `agent/backends/nvml/` runs unchanged
over it. Errors are the NVMLError a GPU would raise: a GPU instance at a placement the catalog forbids
(NVML_ERROR_INVALID_ARGUMENT), one that overlaps or exceeds a profile's count (INSUFFICIENT_RESOURCES), destroying
what a process uses (IN_USE). A MIG mode change stays pending until the GPU is reset or the node reboots (§1.3).

Everything is deterministic from the seed and the clock: UUIDs, PCI ids, NUMA nodes, the background workload
(processes come and go in 5-minute windows) and the metrics that follow it. Tests and the demo drive it with
`start_process`, `stop_process`, `inject_xid`, `add_ecc_errors`, `reboot`, and the host's `set`. `SimTools` stands
in for nvidia-smi and nvidia-cuda-mps-control; there is no nvidia-mig-parted, so MIG goes through NVML.

The modules follow NVML's areas: `devices` (the simulated hardware's state), `base` (handles, workload, reset),
`inventory`, `metrics`, `settings` (GPU settings), `mig`, `events`, `host` (host identity and tuning), `tools`
(nvidia-smi and MPS) and `node`, which puts them together as `SimNvml`.
"""

from agent.simnvml.node import SimNvml

__all__ = ["SimNvml"]
