"""The host around the GPUs, read from /proc and /sys: identity, NUMA layout and the tuning a QoS policy checks."""

from __future__ import annotations

import re
import socket
from pathlib import Path

from agent.protocol import HostSettings


class LinuxHost:
    """Reads a Linux host's files; `root` lets tests point it at a fake tree."""

    def __init__(self, root: str | Path = "/"):
        self.root = Path(root)

    def _read(self, relative: str) -> str | None:
        try:
            return (self.root / relative).read_text().strip()
        except OSError:
            return None

    def _read_int(self, relative: str) -> int | None:
        text = self._read(relative)
        try:
            return int(text) if text is not None else None
        except ValueError:
            return None

    def hostname(self) -> str:
        return socket.gethostname()

    def boot_id(self) -> str:
        """Changes on every boot: MIG layouts, the MPS daemon and time-slice lengths do not survive one (§1.3, §5)."""
        return self._read("proc/sys/kernel/random/boot_id") or ""

    def numa_nodes(self) -> int | None:
        nodes = self.root / "sys/devices/system/node"
        if not nodes.is_dir():
            return None
        return sum(1 for path in nodes.iterdir() if re.fullmatch(r"node\d+", path.name))

    def pci_numa_node(self, pci_bus_id: str) -> int | None:
        """NUMA node of a PCI device from sysfs: the fallback when the driver lacks nvmlDeviceGetNumaNodeId (§6)."""
        domain, _, rest = pci_bus_id.partition(":")  # NVML writes an 8-digit domain, sysfs a 4-digit one
        return self._read_int(f"sys/bus/pci/devices/{int(domain, 16):04x}:{rest.lower()}/numa_node")

    def settings(self) -> HostSettings:
        thp = self._read("sys/kernel/mm/transparent_hugepage/enabled")
        if thp is not None and (selected := re.search(r"\[(\w+)\]", thp)):
            thp = selected[1]  # "always [madvise] never": the bracketed word is the active one
        return HostSettings(
            thp=thp,
            swappiness=self._read_int("proc/sys/vm/swappiness"),
            cpu_governor=self._read("sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
            dirty_ratio=self._read_int("proc/sys/vm/dirty_ratio"),
            dirty_background_ratio=self._read_int("proc/sys/vm/dirty_background_ratio"),
        )
