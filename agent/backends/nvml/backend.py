"""NvmlBackend: the NVML backend's parts put together, with the driver opened at start and released at close."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

import pynvml

from agent.backends.nvml.calls import Runner, run_tool
from agent.backends.nvml.metrics import NvmlMetrics
from agent.backends.nvml.mig import NvmlMig
from agent.backends.nvml.settings import NvmlNodeSettings
from agent.host import LinuxHost


class NvmlBackend(NvmlMetrics, NvmlMig, NvmlNodeSettings):
    """A GPU node driven through NVML, nvidia-mig-parted, nvidia-cuda-mps-control and nvidia-smi."""

    def __init__(
        self,
        nvml: Any = pynvml,
        *,
        run: Runner = run_tool,
        which: Callable[[str], str | None] = shutil.which,
        host: Any = None,
    ):
        self.nvml = nvml
        self.run = run
        self.which = which
        self.host = host if host is not None else LinuxHost()
        nvml.nvmlInit()  # no driver: NVMLError_LibraryNotFound / DriverNotLoaded, for the caller to explain
        self._event_set = self._register_xid_events()

    def close(self) -> None:
        if self._event_set is not None:
            self.nvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
        self.nvml.nvmlShutdown()
