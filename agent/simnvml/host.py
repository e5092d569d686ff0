"""A simulated node's host: its identity and tuning, changed as sysctl or sysfs would (§6)."""

from __future__ import annotations

import uuid as uuid_module
from typing import Any

from agent.errors import ApplyError
from agent.host import SYSCTL_FILES, THP_FILE, tuning_changes, tuning_problems
from agent.protocol import HostSettings, HostTuning
from agent.simnvml.devices import SimGpu

CPU_GOVERNORS = ("conservative", "ondemand", "performance", "powersave", "schedutil", "userspace")  # acpi-cpufreq


class SimHost:
    """Host identity and tuning of a simulated node; `set` changes a setting as sysctl or sysfs would."""

    def __init__(self, gpus: list[SimGpu], hostname: str, numa_nodes: int):
        self._gpus = gpus
        self._hostname = hostname
        self._numa_nodes = numa_nodes
        self._boot_id = str(uuid_module.uuid4())  # simulated GPUs start fresh in every process: a new boot
        self._settings: dict[str, Any] = {
            "thp": "madvise",
            "swappiness": 60,
            "cpu_governor": "performance",
            "dirty_ratio": 20,
            "dirty_background_ratio": 10,
        }
        self.available_governors = set(CPU_GOVERNORS)
        self.writable = True  # False: an agent that is not root, or an unprivileged container

    def hostname(self) -> str:
        return self._hostname

    def boot_id(self) -> str:
        return self._boot_id

    def reboot(self) -> None:
        self._boot_id = str(uuid_module.uuid4())

    def numa_nodes(self) -> int:
        return self._numa_nodes

    def pci_numa_node(self, pci_bus_id: str) -> int | None:
        return next((gpu.numa_node for gpu in self._gpus if gpu.pci_bus_id == pci_bus_id), None)

    def settings(self) -> HostSettings:
        return HostSettings(**self._settings)

    def set(self, name: str, value: Any) -> None:
        if name not in self._settings:
            raise KeyError(f"{name} is not a host setting; known: {', '.join(self._settings)}")
        self._settings[name] = value

    def check_tuning(self, tuning: HostTuning) -> None:
        problems = tuning_problems(tuning, self.settings(), self.available_governors)
        if problems:
            raise ApplyError("host tuning: " + "; ".join(problems))

    def apply(self, tuning: HostTuning) -> list[str]:
        """As LinuxHost.apply, in memory: the same checks, messages and refusals (not root: permission denied)."""
        self.check_tuning(tuning)
        wanted = tuning.to_dict()  # only the settings the tuning has
        if wanted and not self.writable:
            first = next(iter(wanted))
            path = THP_FILE if first == "transparent_hugepages" else SYSCTL_FILES.get(first, "sys/devices/system/cpu")
            raise ApplyError(
                f"host tuning: cannot write /{path}: permission denied (the agent must run as root, privileged in a "
                "container); nothing was changed"
            )
        before = self.settings()
        for name, value in wanted.items():
            self._settings["thp" if name == "transparent_hugepages" else name] = value
        return tuning_changes(before, self.settings())
