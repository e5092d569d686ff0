"""Server-side printing: the `meta.k8s.io/v1` Table that `kubectl get` asks for, with the real columns."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from simulator.resources import ResourceType


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery duration.HumanDuration, as the AGE column shows it."""
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    years = days // 365
    return f"{years}y{days % 365}d" if days % 365 else f"{years}y"


def _age(timestamp: str | None) -> str:
    if not timestamp:
        return "<unknown>"
    then = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return human_duration((datetime.now(UTC) - then).total_seconds())


def _column(name: str, kind: str = "string", priority: int = 0, description: str = "", fmt: str = "") -> dict:
    return {"name": name, "type": kind, "format": fmt, "description": description, "priority": priority}


_NAME = _column("Name", fmt="name", description="Name must be unique within a namespace.")
_AGE = _column(
    "Age", description="CreationTimestamp is a timestamp representing the server time when this object was created."
)


def _node_cells(node: dict) -> list:
    status = node.get("status", {})
    ready = next((c["status"] for c in status.get("conditions", []) if c["type"] == "Ready"), "Unknown")
    state = {"True": "Ready", "False": "NotReady"}.get(ready, "NotReady")
    if node.get("spec", {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    roles = sorted(
        key.split("/", 1)[1] for key in node["metadata"].get("labels", {}) if key.startswith("node-role.kubernetes.io/")
    )
    info = status.get("nodeInfo", {})
    addresses = {a["type"]: a["address"] for a in status.get("addresses", [])}
    return [
        node["metadata"]["name"],
        state,
        ",".join(roles) or "<none>",
        _age(node["metadata"].get("creationTimestamp")),
        info.get("kubeletVersion", ""),
        addresses.get("InternalIP", "<none>"),
        addresses.get("ExternalIP", "<none>"),
        info.get("osImage", ""),
        info.get("kernelVersion", ""),
        info.get("containerRuntimeVersion", ""),
    ]


_NODE_COLUMNS = [
    _NAME,
    _column("Status", description="The status of the node"),
    _column("Roles", description="The roles of the node"),
    _AGE,
    _column("Version", description="Kubelet Version reported by the node."),
    _column("Internal-IP", priority=1),
    _column("External-IP", priority=1),
    _column("OS-Image", priority=1),
    _column("Kernel-Version", priority=1),
    _column("Container-Runtime", priority=1),
]


def _pod_cells(pod: dict) -> list:
    status = pod.get("status", {})
    containers = status.get("containerStatuses", [])
    ready = sum(1 for c in containers if c.get("ready"))
    reason = status.get("phase", "Unknown")
    for container in containers:
        waiting = container.get("state", {}).get("waiting")
        if waiting:
            reason = waiting.get("reason", reason)
    if pod["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    return [
        pod["metadata"]["name"],
        f"{ready}/{len(pod.get('spec', {}).get('containers', []))}",
        reason,
        str(sum(c.get("restartCount", 0) for c in containers)),
        _age(pod["metadata"].get("creationTimestamp")),
        status.get("podIP") or "<none>",
        pod.get("spec", {}).get("nodeName") or "<none>",
        "<none>",
        "<none>",
    ]


_POD_COLUMNS = [
    _NAME,
    _column("Ready", description="The aggregate readiness state of this pod for accepting traffic."),
    _column("Status", description="The aggregate status of the containers in this pod."),
    _column(
        "Restarts", kind="string", description="The number of times the containers in this pod have been restarted."
    ),
    _AGE,
    _column("IP", priority=1),
    _column("Node", priority=1),
    _column("Nominated Node", priority=1),
    _column("Readiness Gates", priority=1),
]


def _event_cells(event: dict) -> list:
    involved = event.get("involvedObject", {})
    return [
        _age(event.get("lastTimestamp")),
        event.get("type", ""),
        event.get("reason", ""),
        f"{involved.get('kind', '').lower()}/{involved.get('name', '')}",
        event.get("message", ""),
    ]


def _daemonset_cells(ds: dict) -> list:
    status = ds.get("status", {})
    selector = ds.get("spec", {}).get("template", {}).get("spec", {}).get("nodeSelector", {})
    return [
        ds["metadata"]["name"],
        status.get("desiredNumberScheduled", 0),
        status.get("currentNumberScheduled", 0),
        status.get("numberReady", 0),
        status.get("updatedNumberScheduled", 0),
        status.get("numberAvailable", 0),
        ",".join(f"{k}={v}" for k, v in selector.items()) or "<none>",
        _age(ds["metadata"].get("creationTimestamp")),
    ]


def _param_ref(binding: dict) -> str:
    """kubectl's PARAMREF column: `<unset>`, else `namespace/name` (`*/` for any namespace, a selector for name)."""
    ref = binding.get("spec", {}).get("paramRef")
    if not ref:
        return "<unset>"
    name = ref.get("name") or str(ref.get("selector") or "")
    return f"{ref['namespace']}/{name}" if ref.get("namespace") else f"*/{name}"


def _param_kind(policy: dict) -> str:
    kind = policy.get("spec", {}).get("paramKind")
    return f"{kind.get('apiVersion', '')}/{kind.get('kind', '')}" if kind else "<unset>"


_COLUMNS: dict[str, tuple[list[dict], Callable[[dict], list]]] = {
    "nodes": (_NODE_COLUMNS, _node_cells),
    "pods": (_POD_COLUMNS, _pod_cells),
    "configmaps": (
        [_NAME, _column("Data", kind="integer"), _AGE],
        lambda cm: [
            cm["metadata"]["name"],
            len(cm.get("data") or {}) + len(cm.get("binaryData") or {}),
            _age(cm["metadata"].get("creationTimestamp")),
        ],
    ),
    "namespaces": (
        [_NAME, _column("Status"), _AGE],
        lambda ns: [
            ns["metadata"]["name"],
            ns.get("status", {}).get("phase", "Active"),
            _age(ns["metadata"].get("creationTimestamp")),
        ],
    ),
    "events": (
        [_column("Last Seen"), _column("Type"), _column("Reason"), _column("Object"), _column("Message")],
        _event_cells,
    ),
    "daemonsets": (
        [_NAME]
        + [_column(n, kind="integer") for n in ("Desired", "Current", "Ready", "Up-to-date", "Available")]
        + [_column("Node Selector"), _AGE],
        _daemonset_cells,
    ),
    "poddisruptionbudgets": (
        [
            _NAME,
            _column("Min Available"),
            _column("Max Unavailable"),
            _column("Allowed Disruptions", kind="integer"),
            _AGE,
        ],
        lambda pdb: [
            pdb["metadata"]["name"],
            str(pdb.get("spec", {}).get("minAvailable", "N/A")),
            str(pdb.get("spec", {}).get("maxUnavailable", "N/A")),
            pdb.get("status", {}).get("disruptionsAllowed", 0),
            _age(pdb["metadata"].get("creationTimestamp")),
        ],
    ),
    "clusterpolicies": (
        [_NAME, _column("Status"), _AGE],
        lambda cp: [
            cp["metadata"]["name"],
            cp.get("status", {}).get("state", ""),
            _age(cp["metadata"].get("creationTimestamp")),
        ],
    ),
    "validatingadmissionpolicies": (
        [
            _NAME,
            _column("Validations", kind="integer", description="the number of validation rules in the policy"),
            _column("ParamKind", description="the kind of resources that parameterize the policy"),
            _AGE,
        ],
        lambda vap: [
            vap["metadata"]["name"],
            len(vap.get("spec", {}).get("validations") or []),
            _param_kind(vap),
            _age(vap["metadata"].get("creationTimestamp")),
        ],
    ),
    "validatingadmissionpolicybindings": (
        [
            _NAME,
            _column("PolicyName", description="the policy the binding binds"),
            _column("ParamRef", description="the param resource the binding configures"),
            _AGE,
        ],
        lambda binding: [
            binding["metadata"]["name"],
            binding.get("spec", {}).get("policyName", ""),
            _param_ref(binding),
            _age(binding["metadata"].get("creationTimestamp")),
        ],
    ),
}


def _condition_status(obj: dict, kind: str) -> str:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c.get("status", "") for c in conditions if c.get("type") == kind), "")


# Kueue's printer columns (kubebuilder:printcolumn in apis/kueue/v1beta1, docs/kueue.md), priority 0 only.
_COLUMNS.update(
    {
        "resourceflavors": (
            [_NAME, _AGE],
            lambda rf: [rf["metadata"]["name"], _age(rf["metadata"].get("creationTimestamp"))],
        ),
        "clusterqueues": (
            [_NAME, _column("Cohort"), _column("Pending Workloads", kind="integer")],
            lambda cq: [
                cq["metadata"]["name"],
                (cq.get("spec") or {}).get("cohort", ""),
                (cq.get("status") or {}).get("pendingWorkloads", 0),
            ],
        ),
        "localqueues": (
            [
                _NAME,
                _column("ClusterQueue"),
                _column("Pending Workloads", kind="integer"),
                _column("Admitted Workloads", kind="integer"),
            ],
            lambda lq: [
                lq["metadata"]["name"],
                (lq.get("spec") or {}).get("clusterQueue", ""),
                (lq.get("status") or {}).get("pendingWorkloads", 0),
                (lq.get("status") or {}).get("admittedWorkloads", 0),
            ],
        ),
        "workloads": (
            [_NAME, _column("Queue"), _column("Reserved in"), _column("Admitted"), _column("Finished"), _AGE],
            lambda wl: [
                wl["metadata"]["name"],
                (wl.get("spec") or {}).get("queueName", ""),
                ((wl.get("status") or {}).get("admission") or {}).get("clusterQueue", ""),
                _condition_status(wl, "Admitted"),
                _condition_status(wl, "Finished"),
                _age(wl["metadata"].get("creationTimestamp")),
            ],
        ),
    }
)


def _claim_state(claim: dict) -> str:
    """kubectl's STATE column of a ResourceClaim (pkg/printers/internalversion: allocated,reserved / pending)."""
    status = claim.get("status") or {}
    states = ["allocated"] if status.get("allocation") else ["pending"]
    if status.get("reservedFor"):
        states.append("reserved")
    return ",".join(states)


# resource.k8s.io/v1 as kube-apiserver prints them (pkg/printers/internalversion/printers.go), priority 0 only.
_COLUMNS.update(
    {
        "deviceclasses": (
            [_NAME, _AGE],
            lambda o: [o["metadata"]["name"], _age(o["metadata"].get("creationTimestamp"))],
        ),
        "resourceslices": (
            [_NAME, _column("Node"), _column("Driver"), _column("Pool"), _AGE],
            lambda o: [
                o["metadata"]["name"],
                o["spec"].get("nodeName", ""),
                o["spec"].get("driver", ""),
                (o["spec"].get("pool") or {}).get("name", ""),
                _age(o["metadata"].get("creationTimestamp")),
            ],
        ),
        "resourceclaims": (
            [_NAME, _column("State"), _AGE],
            lambda o: [o["metadata"]["name"], _claim_state(o), _age(o["metadata"].get("creationTimestamp"))],
        ),
        "resourceclaimtemplates": (
            [_NAME, _AGE],
            lambda o: [o["metadata"]["name"], _age(o["metadata"].get("creationTimestamp"))],
        ),
    }
)


def _partial_metadata(obj: dict) -> dict:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}


def table(resource: ResourceType, objects: list[dict], resource_version: int, include: str, cont: str | None) -> dict:
    """Rows carry the object (metadata only by default) so kubectl can print -L label and -A namespace columns."""
    columns, cells = _COLUMNS[resource.plural]
    rows = []
    for obj in objects:
        row: dict = {"cells": cells(obj)}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = _partial_metadata(obj)
        rows.append(row)
    metadata: dict = {"resourceVersion": str(resource_version)}
    if cont:
        metadata["continue"] = cont
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": columns,
        "rows": rows,
    }
