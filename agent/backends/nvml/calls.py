"""How the NVML backend calls NVML and NVIDIA's tools: errors by name, unreadable metrics as unknown."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

import pynvml

from agent.errors import ApplyError, BusyError

MIB = 1024 * 1024
NOT_AVAILABLE = 0xFFFFFFFF  # NVML's "no instance" in process and event records (outside MIG)
COMPUTE_MODES = {
    pynvml.NVML_COMPUTEMODE_DEFAULT: "default",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "exclusive_thread",
    pynvml.NVML_COMPUTEMODE_PROHIBITED: "prohibited",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "exclusive_process",
}
_ERROR_NAMES = {
    value: name for name, value in vars(pynvml).items() if name.startswith("NVML_ERROR_") and isinstance(value, int)
}

Runner = Callable[..., subprocess.CompletedProcess]


def nvml_error_name(error: pynvml.NVMLError) -> str:
    """NVML_ERROR_IN_USE rather than "NVML Error with code 19": pynvml only has text for some codes."""
    return _ERROR_NAMES.get(error.value, f"NVML error {error.value}")


def run_tool(argv: list[str], input: str | None = None) -> subprocess.CompletedProcess:
    """Run one of NVIDIA's command-line tools, capturing its output for the outcome message."""
    return subprocess.run(argv, input=input, capture_output=True, text=True, timeout=300, check=False)


def last_line(result: subprocess.CompletedProcess) -> str:
    """The line of a tool's output that says what went wrong."""
    lines = (result.stderr or result.stdout or "").strip().splitlines()
    return lines[-1] if lines else "no output"


def instance_id(value: int) -> int | None:
    return None if value == NOT_AVAILABLE else value


def on_gpus(indices: list[int]) -> str:
    return "GPU " + ", ".join(map(str, indices))


def read_metric(call: Callable[..., Any] | None, *args: Any) -> Any:
    """A metric NVML cannot read on this GPU (NotSupported, NoPermission, …) is unknown, not a failed report; so is
    one whose function the bindings no longer have (None: nvmlDeviceGetApplicationsClock is deprecated)."""
    if call is None:
        return None
    try:
        return call(*args)
    except pynvml.NVMLError:
        return None


def call_nvml(what: str, call: Callable[..., Any], *args: Any) -> Any:
    """An NVML call that changes the GPU: IN_USE means busy (§1.2), other errors fail the apply with their name."""
    try:
        return call(*args)
    except pynvml.NVMLError_InUse:
        raise BusyError(f"{what}: the GPU is in use (NVML_ERROR_IN_USE)") from None
    except pynvml.NVMLError_NoPermission:
        raise ApplyError(f"{what}: NVML_ERROR_NO_PERMISSION (the agent must run as root)") from None
    except pynvml.NVMLError_NotSupported:
        raise ApplyError(f"{what}: NVML_ERROR_NOT_SUPPORTED (this GPU or driver cannot do it)") from None
    except pynvml.NVMLError as error:
        raise ApplyError(f"{what}: {nvml_error_name(error)}") from None
