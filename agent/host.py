"""The host around the GPUs, read from /proc and /sys: identity, NUMA layout and the tuning a QoS policy checks.

`LinuxHost.apply` writes a QoS policy's host tuning the way `sysctl -w` and `echo … > /sys/…` do, then reads every
file back. Writing needs root (and, in a container, a privileged one: /proc/sys and /sys are read-only otherwise).
"""

from __future__ import annotations

import errno
import os
import re
import socket
from collections.abc import Collection, Sequence
from dataclasses import fields
from pathlib import Path

from agent.errors import ApplyError
from agent.protocol import HostSettings, HostTuning

THP_FILE = "sys/kernel/mm/transparent_hugepage/enabled"
SYSCTL_FILES = {  # HostTuning field -> procfs file (the vm.* sysctls)
    "swappiness": "proc/sys/vm/swappiness",
    "dirty_ratio": "proc/sys/vm/dirty_ratio",
    "dirty_background_ratio": "proc/sys/vm/dirty_background_ratio",
}
CPU_DIR = "sys/devices/system/cpu"
SYSCTL_MAX = {"swappiness": 200, "dirty_ratio": 100, "dirty_background_ratio": 100}  # 200: kernel ≥ 5.8
_GOVERNOR_RE = re.compile(r"^[a-z][a-z0-9_]*$")
# HostTuning field -> HostSettings field (the report's older, shorter name for THP).
REPORTED_AS = {"transparent_hugepages": "thp"}
LABELS = {"transparent_hugepages": "THP", "cpu_governor": "CPU governor"}


def thp_mode(text: str | None) -> str | None:
    """ "always [madvise] never" → "madvise": the kernel brackets the active mode."""
    if text is None:
        return None
    selected = re.search(r"\[(\w+)\]", text)
    return selected[1] if selected else text.strip() or None


def tuning_problems(tuning: HostTuning, current: HostSettings, governors: Collection[str] | None) -> list[str]:
    """Why this tuning cannot be applied on a host that runs `current`; checked before anything is written."""
    problems = []
    for name, highest in SYSCTL_MAX.items():
        value = getattr(tuning, name)
        if value is not None and not 0 <= value <= highest:
            problems.append(f"{name} must be 0 to {highest}, not {value}")
    ratio = tuning.dirty_ratio if tuning.dirty_ratio is not None else current.dirty_ratio
    background = (
        tuning.dirty_background_ratio if tuning.dirty_background_ratio is not None else current.dirty_background_ratio
    )
    touched = tuning.dirty_ratio is not None or tuning.dirty_background_ratio is not None
    if touched and ratio and background and background >= ratio:
        # The kernel takes it, then silently uses half of dirty_ratio as the background threshold.
        problems.append(f"dirty_background_ratio ({background}) must be lower than dirty_ratio ({ratio})")
    governor = tuning.cpu_governor
    if governor is not None:
        if not _GOVERNOR_RE.match(governor):
            problems.append(f"{governor!r} is not a CPU governor name")
        elif governors is not None and governor not in governors:
            offered = " ".join(sorted(governors)) or "none"
            problems.append(f"CPU governor {governor} is not available on this host (it offers: {offered})")
    return problems


def tuning_changes(before: HostSettings, after: HostSettings) -> list[str]:
    """What changed, for the outcome message: "swappiness 10 (was 60)"."""
    changes = []
    for name in (f.name for f in fields(HostTuning)):
        reported = REPORTED_AS.get(name, name)
        old, new = getattr(before, reported), getattr(after, reported)
        if old != new:
            changes.append(f"{LABELS.get(name, name)} {new} (was {old if old is not None else 'unknown'})")
    return changes


def tuning_mismatches(tuning: HostTuning, now: HostSettings) -> list[str]:
    """Settings the host does not run after they were written: the re-read is what counts."""
    problems = []
    for name in (f.name for f in fields(HostTuning)):
        wanted, actual = getattr(tuning, name), getattr(now, REPORTED_AS.get(name, name))
        if wanted is not None and actual != wanted:
            problems.append(f"{LABELS.get(name, name)} reads {actual} after writing {wanted}")
    return problems


def _write_error(path: Path, value: str, error: OSError) -> str:
    if isinstance(error, PermissionError) or error.errno in (errno.EACCES, errno.EPERM):
        return f"cannot write {path}: permission denied (the agent must run as root, privileged in a container)"
    if error.errno == errno.EROFS:
        return f"cannot write {path}: read-only file system (unprivileged containers see /proc/sys and /sys read-only)"
    if isinstance(error, FileNotFoundError):
        return f"{path} does not exist on this host"
    if error.errno == errno.EINVAL:
        return f"the kernel refused {value!r} for {path} (invalid argument)"
    return f"cannot write {path}: {error.strerror or error}"


class LinuxHost:
    """Reads and tunes a Linux host's files; `root` lets tests point it at a fake tree."""

    def __init__(self, root: str | Path = "/"):
        self.root = Path(root)

    def _read(self, relative: str | Path) -> str | None:
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

    def _write(self, path: Path, value: str) -> None:
        """One write, as `echo value > path` (sysfs and procfs take a value per write call); never creates a file."""
        descriptor = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(descriptor, (value + "\n").encode())
        finally:
            os.close(descriptor)

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

    # -- CPU frequency governors ---------------------------------------------------------------------------------

    def _cpufreq_dirs(self) -> list[Path]:
        """cpufreq of every online CPU that has one, in CPU order (offline CPUs and VMs often have none)."""
        cpus = self.root / CPU_DIR
        if not cpus.is_dir():
            return []
        found = [path for path in cpus.iterdir() if re.fullmatch(r"cpu\d+", path.name) and (path / "cpufreq").is_dir()]
        return [path / "cpufreq" for path in sorted(found, key=lambda path: int(path.name[3:]))]

    def cpu_governor(self) -> str | None:
        values = {self._read(directory / "scaling_governor") for directory in self._cpufreq_dirs()} - {None}
        if not values:
            return None
        return values.pop() if len(values) == 1 else "mixed"

    def available_governors(self) -> set[str] | None:
        """Governors every CPU offers; None when the host does not say (no scaling_available_governors)."""
        offered = None
        for directory in self._cpufreq_dirs():
            text = self._read(directory / "scaling_available_governors")
            if text is not None:
                offered = set(text.split()) if offered is None else offered & set(text.split())
        return offered

    # -- settings -------------------------------------------------------------------------------------------------

    def settings(self) -> HostSettings:
        return HostSettings(
            thp=thp_mode(self._read(THP_FILE)),
            swappiness=self._read_int(SYSCTL_FILES["swappiness"]),
            cpu_governor=self.cpu_governor(),
            dirty_ratio=self._read_int(SYSCTL_FILES["dirty_ratio"]),
            dirty_background_ratio=self._read_int(SYSCTL_FILES["dirty_background_ratio"]),
        )

    def check_tuning(self, tuning: HostTuning) -> None:
        """Refuse a tuning this host cannot take, before anything is written."""
        problems = tuning_problems(tuning, self.settings(), self.available_governors())
        if tuning.cpu_governor is not None and not self._cpufreq_dirs():
            problems.append(
                f"no CPU frequency scaling on this host ({self.root / CPU_DIR}/cpu*/cpufreq is missing: a VM, or no "
                "cpufreq driver)"
            )
        if problems:
            raise ApplyError("host tuning: " + "; ".join(problems))

    def apply(self, tuning: HostTuning) -> list[str]:
        """Write every setting the tuning has, read them back, and say what changed; ApplyError names each failure."""
        self.check_tuning(tuning)
        before = self.settings()
        writes: list[tuple[Path, str]] = []
        if tuning.transparent_hugepages is not None:
            writes.append((self.root / THP_FILE, tuning.transparent_hugepages))
        for name, relative in SYSCTL_FILES.items():
            if getattr(tuning, name) is not None:
                writes.append((self.root / relative, str(getattr(tuning, name))))
        if tuning.cpu_governor is not None:
            writes.extend((directory / "scaling_governor", tuning.cpu_governor) for directory in self._cpufreq_dirs())
        failures = self._write_all(writes)
        after = self.settings()
        failures += [] if failures else tuning_mismatches(tuning, after)
        changes = tuning_changes(before, after)
        if failures:
            done = f"; changed before that: {', '.join(changes)}" if changes else "; nothing was changed"
            raise ApplyError("host tuning: " + "; ".join(failures) + done)
        return changes

    def _write_all(self, writes: Sequence[tuple[Path, str]]) -> list[str]:
        """Try every write and return the failures; every CPU's governor failing alike gives one line, not 128."""
        failures: dict[tuple, tuple[str, int]] = {}
        for path, value in writes:
            try:
                self._write(path, value)
            except OSError as error:
                key = (path.name, type(error), error.errno)
                message, count = failures.get(key, (_write_error(path, value, error), 0))
                failures[key] = (message, count + 1)
        return [
            message + (f" (and {count - 1} more CPUs)" if count > 1 else "") for message, count in failures.values()
        ]
