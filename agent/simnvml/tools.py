"""nvidia-smi and nvidia-cuda-mps-control, simulated: GPU reset, time slices and the MPS daemon (§1.3, §5)."""

from __future__ import annotations

import re
import subprocess

from agent.simnvml.base import SimNvmlBase
from agent.simnvml.devices import SimGpu, SimMps


class SimTools:
    """nvidia-smi and nvidia-cuda-mps-control as far as the agent uses them (§1.3, §5), acting on the simulation."""

    TOOLS = ("nvidia-smi", "nvidia-cuda-mps-control")

    def __init__(self, sim: SimNvmlBase):
        self.sim = sim
        self.calls: list[list[str]] = []

    def which(self, name: str) -> str | None:
        return f"/usr/bin/{name}" if name in self.TOOLS else None

    def run(self, argv: list[str], input: str | None = None) -> subprocess.CompletedProcess:
        self.calls.append(list(argv))
        tool, args = argv[0].rsplit("/", 1)[-1], list(argv[1:])
        if tool == "nvidia-smi" and args[:1] == ["-r"]:
            return self._reset(argv, args)
        if tool == "nvidia-smi" and args[:1] == ["compute-policy"]:
            return self._compute_policy(argv, args)
        if tool == "nvidia-cuda-mps-control":
            return self._mps(argv, args, input or "")
        return subprocess.CompletedProcess(argv, 127, "", f"{tool}: command not found")

    def _find(self, identifier: str) -> SimGpu | None:
        return next((g for g in self.sim.gpus if identifier in (g.uuid, g.pci_bus_id, str(g.index))), None)

    def _reset(self, argv: list[str], args: list[str]) -> subprocess.CompletedProcess:
        if len(args) != 3 or args[1] != "-i":
            return subprocess.CompletedProcess(argv, 2, "", "usage: nvidia-smi -r -i <ids>")
        gpus = [self._find(identifier) for identifier in args[2].split(",")]
        if None in gpus:
            return subprocess.CompletedProcess(argv, 2, "", f"No devices were found matching {args[2]}")
        for gpu in gpus:
            problem = self.sim.reset(gpu)
            if problem:
                code = 3 if not self.sim.reset_supported else 255
                return subprocess.CompletedProcess(argv, code, "", problem)
        return subprocess.CompletedProcess(argv, 0, "All done.\n", "")

    def _compute_policy(self, argv: list[str], args: list[str]) -> subprocess.CompletedProcess:
        if len(args) != 5 or args[1] != "-i" or args[3] != "--set-timeslice":
            usage = "usage: nvidia-smi compute-policy -i <id> --set-timeslice N"
            return subprocess.CompletedProcess(argv, 2, "", usage)
        gpu = self._find(args[2])
        if gpu is None or args[4] not in ("0", "1", "2", "3"):
            return subprocess.CompletedProcess(argv, 2, "", f"Invalid device or timeslice: {args[2]} {args[4]}")
        gpu.time_slice = int(args[4])
        return subprocess.CompletedProcess(argv, 0, f"Set timeslice to {args[4]} for GPU {gpu.pci_bus_id}\n", "")

    def _mps(self, argv: list[str], args: list[str], commands: str) -> subprocess.CompletedProcess:
        mps = self.sim.mps
        if args == ["-d"]:
            if mps.running:
                return subprocess.CompletedProcess(argv, 1, "", "An instance of this daemon is already running")
            self.sim.mps = SimMps(running=True)
            return subprocess.CompletedProcess(argv, 0, "", "")
        if args or not mps.running:
            return subprocess.CompletedProcess(argv, 1, "", "Cannot find MPS control daemon process")
        for line in commands.splitlines():
            words = line.split()
            if words == ["quit"]:
                mps.running = False
            elif words == ["get_server_list"]:
                continue  # no MPS server runs until a client connects
            elif len(words) == 2 and words[0] == "set_default_active_thread_percentage" and words[1].isdigit():
                if not 1 <= int(words[1]) <= 100:
                    return subprocess.CompletedProcess(argv, 1, "", f"Invalid percentage {words[1]}")
                mps.active_thread_percentage = int(words[1])
            elif (
                len(words) == 3
                and words[0] == "set_default_device_pinned_mem_limit"
                and self._find(words[1]) is not None
                and re.fullmatch(r"\d+[MG]", words[2])
            ):
                mps.pinned_mem_limits[int(words[1])] = words[2]
            elif words:
                return subprocess.CompletedProcess(argv, 1, "", f"Unrecognized command: {line}")
        return subprocess.CompletedProcess(argv, 0, "", "")
