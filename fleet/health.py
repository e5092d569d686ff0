"""GPU health from the signals NVIDIA's components really export (contracts §10, §11). Pure: no Django, no I/O.

The state follows the device plugin, which decides whether Kubernetes still schedules onto the GPU: an XID it
counts as an application error (13, 31, 43, 45, 68, 109) leaves the GPU healthy, any other XID makes it unhealthy.
The words say more than the state: reset needed, row remap pending, fallen off the bus.
"""

from dataclasses import dataclass

# XIDs the device plugin treats as application errors: the GPU stays allocatable (contracts §11).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

# What an admin does after an XID that is not an application error, where NVIDIA's XID catalogue says more than
# "unhealthy". XID 63/64 are the row remapper's (or page retirement's) record and failure events (contracts §10).
_XID_WORDS = {
    48: "uncorrectable ECC error: reset needed",
    61: "internal micro-controller breakpoint: reset needed",
    62: "internal micro-controller halt: reset needed",
    63: "row remap pending: reset the GPU once drained",
    64: "row remapping failed: replace the GPU",
    74: "NVLink error: check the links, reset needed",
    79: "fallen off the bus: reboot the node; reseat or replace the GPU if it recurs",
    92: "high single-bit ECC error rate: watch the GPU",
    94: "contained uncorrectable ECC error: reset needed",
    95: "uncontained uncorrectable ECC error: reset needed",
    119: "GSP timeout: reset needed",
    120: "GSP error: reset needed",
}
_OTHER_XID = "unhealthy to the device plugin; see NVIDIA's XID catalogue"
# The application errors the device plugin ignores: the GPU stays healthy, the workload is at fault.
_APPLICATION_XID_WORDS = {
    13: "graphics engine exception (kernel fault): check the workload",
    31: "GPU memory page fault: check the workload's memory use",
    43: "GPU stopped processing the workload's work: check the workload",
    45: "preemptive cleanup after a process was stopped: nothing to do",
    68: "video processor exception: check the workload",
    109: "context switch timeout: check the workload",
}


def xid_words(xid: int) -> str:
    """What an XID means and what to do, in the words of the GPU page and the event log (one table for both)."""
    if xid in APPLICATION_XIDS:
        return f"{_APPLICATION_XID_WORDS[xid]}; the GPU stays healthy"
    return _XID_WORDS.get(xid, _OTHER_XID)


def gpu_health(
    *,
    last_xid: int | None,
    ecc_dbe_total: int = 0,
    row_remap_failure: bool | None = None,
    row_remap_pending: bool | None = None,
) -> str:
    """Unhealthy after an XID the device plugin counts against the GPU, a failed row remap or a double-bit ECC
    error; degraded while a row remap waits for a reset; healthy otherwise (application XIDs included)."""
    if row_remap_failure or ecc_dbe_total > 0 or (last_xid and last_xid not in APPLICATION_XIDS):
        return "unhealthy"
    if row_remap_pending:
        return "degraded"
    return "healthy"


def health_words(
    *,
    last_xid: int | None,
    ecc_dbe_total: int = 0,
    row_remap_failure: bool | None = None,
    row_remap_pending: bool | None = None,
) -> str:
    """Why the GPU is in its state, and what to do, in a few words ("" when there is nothing to say)."""
    if row_remap_failure:
        return "row remapping failed: replace the GPU"
    if last_xid and last_xid not in APPLICATION_XIDS:
        return f"XID {last_xid}: " + xid_words(last_xid)
    if row_remap_pending:
        return "row remap pending: reset the GPU once drained"
    if ecc_dbe_total > 0:
        return "uncorrectable ECC errors: reset needed"
    if last_xid:
        return f"XID {last_xid}: application error; the GPU stays healthy, check the workload"
    return ""


@dataclass(frozen=True)
class Signal:
    """A dcgm-exporter counter Tessera reads for health, as a line of its counters CSV."""

    field: str
    kind: str
    help: str
    meaning: str
    default: bool  # enabled in dcgm-exporter's default-counters.csv and the operator's dcp-metrics-included.csv

    @property
    def csv_line(self) -> str:
        return f"{self.field}, {self.kind}, {self.help}"


HEALTH_SIGNALS = (
    Signal("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", "last XID", True),
    Signal("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", "row remap failure", True),
    Signal(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        "rows remapped after uncorrectable errors",
        True,
    ),
    Signal(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        "rows remapped after correctable errors",
        True,
    ),
    Signal(
        "DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending", "row remap pending", False
    ),
    Signal(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "counter",
        "Total number of double-bit volatile ECC errors.",
        "double-bit ECC errors",
        False,
    ),
    Signal(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "counter",
        "Total number of single-bit volatile ECC errors.",
        "single-bit ECC errors",
        False,
    ),
)
HEALTH_FIELDS = frozenset(s.field for s in HEALTH_SIGNALS)
# NVML cannot read remapped rows while MIG is on (contracts §10): these are never exported for a MIG GPU.
ROW_REMAP_FIELDS = frozenset(s.field for s in HEALTH_SIGNALS if "REMAP" in s.field)


def missing_signals(exported, *, mig_enabled: bool) -> list[dict]:
    """The health signals not exported for a GPU, each with why and the CSV line that would enable it.

    `exported` is the set of fields the GPU's last scrape carried (None: the source does not say, e.g. an agent).
    """
    if exported is None:
        return []
    exported = set(exported)
    missing = []
    for signal in HEALTH_SIGNALS:
        if signal.field in exported:
            continue
        unreadable = mig_enabled and signal.field in ROW_REMAP_FIELDS
        if unreadable:
            reason = "NVML cannot read remapped rows while MIG is enabled"
        elif signal.default:
            reason = "on in the default counters but not exported: a custom counters CSV, or a GPU without it"
        else:
            reason = "commented out in dcgm-exporter's default counters"
        missing.append({"signal": signal, "reason": reason, "enable": not unreadable})
    return missing
