"""A minimal Kueue controller: pending Workloads are admitted to ClusterQueues with free nominal quota.

What it does, as Kueue v1beta1 describes (docs/kueue.md): a Workload names a LocalQueue (`spec.queueName`) in its
namespace, which names a ClusterQueue (`spec.clusterQueue`). The Workload's pod sets request resources (per container
`requests`, else `limits`, times `count`). For each resource group of the ClusterQueue that covers requested
resources, the first flavor (in order) whose ResourceFlavor exists, whose `nodeLabels` do not contradict the pod's
`nodeSelector`, and whose free nominal quota holds every requested resource of the group is assigned. Admitted:
`status.admission` (clusterQueue, podSetAssignments with flavors, resourceUsage, count) and the conditions
QuotaReserved and Admitted (True); the ClusterQueue's `status.flavorsReservation`/`flavorsUsage` (totals per flavor
and resource over admitted, unfinished Workloads), `admittedWorkloads`, `reservingWorkloads`, `pendingWorkloads`.

Simplified (on purpose): no cohorts, borrowing, lending or preemption; no admission checks; no pods are created (a
Workload is its own record of use); pending Workloads are tried in creation order (BestEffortFIFO, no priorities);
quota lowered below usage evicts nothing (as Kueue: usage may exceed a lowered quota; nothing new is admitted).
A Workload that does not fit gets QuotaReserved False, reason Pending, and a message saying why.
"""

from __future__ import annotations

import re
from fractions import Fraction

from simulator.controller import ControllerLoop
from simulator.resources import CLUSTER_QUEUES, KUEUE, LOCAL_QUEUES, RESOURCE_FLAVORS, WORKLOADS
from simulator.store import Change, Store, now_timestamp

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1,
    "m": Fraction(1, 1000),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_KUEUE_PLURALS = {r.plural for r in KUEUE}


def quantity(text) -> Fraction:
    """A Kubernetes resource quantity ("4", "500m", "16Gi") as an exact number; ValueError if it is not one."""
    match = _QUANTITY.match(str(text).strip())
    if not match or match[2] not in _SUFFIX:
        raise ValueError(
            f"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}"
        )
    return Fraction(match[1]) * _SUFFIX[match[2]]


def quantity_text(value: Fraction) -> str:
    """The canonical form the API server would serve: an integer, else milli-units."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{round(value * 1000)}m"


def podset_requests(podset: dict) -> dict[str, Fraction]:
    """What one pod set asks for in all: per container requests (limits where a request is absent) × count."""
    total: dict[str, Fraction] = {}
    spec = (podset.get("template") or {}).get("spec") or {}
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in asked.items():
            total[name] = total.get(name, Fraction(0)) + quantity(value)
    count = int(podset.get("count", 1))
    return {name: value * count for name, value in total.items()}


def _condition(kind: str, status: str, reason: str, message: str) -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": now_timestamp()}


def _is_true(workload: dict, kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (workload.get("status") or {}).get("conditions", [])
    )


def _flavor_fits_selector(flavor: dict, node_selector: dict) -> bool:
    """Kueue skips a flavor whose nodeLabels give a key the pod selects another value for."""
    labels = (flavor.get("spec") or {}).get("nodeLabels") or {}
    return all(labels.get(key, value) == value for key, value in node_selector.items())


class Kueue(ControllerLoop):
    """One pass per batch of changes to Kueue objects: recompute usage, admit what fits, write status."""

    def __init__(self, store: Store):
        super().__init__("sim-kueue")
        self._store = store
        self._queued = False

    def on_change(self, change: Change) -> None:
        """Store listener (under the store lock): changes to Kueue objects queue one pass, coalesced."""
        if change.resource.plural in _KUEUE_PLURALS and not self._queued:
            self._queued = True
            self.submit(self._pass)

    def _pass(self) -> None:
        self._queued = False
        store = self._store
        flavors = {f["metadata"]["name"]: f for f in store.objects(RESOURCE_FLAVORS)}
        queues = {q["metadata"]["name"]: q for q in store.objects(CLUSTER_QUEUES)}
        local = {(q["metadata"]["namespace"], q["metadata"]["name"]): q for q in store.objects(LOCAL_QUEUES)}
        workloads = sorted(
            store.objects(WORKLOADS),
            key=lambda w: (w["metadata"].get("creationTimestamp", ""), int(w["metadata"]["resourceVersion"])),
        )
        usage: dict[str, dict[tuple[str, str], Fraction]] = {name: {} for name in queues}
        counts = {name: {"admitted": 0, "pending": 0} for name in queues}
        pending = []
        for workload in workloads:
            admission = (workload.get("status") or {}).get("admission")
            if _is_true(workload, "Finished"):
                continue
            if admission and admission.get("clusterQueue") in queues:
                cq = admission["clusterQueue"]
                counts[cq]["admitted"] += 1
                for assignment in admission.get("podSetAssignments") or []:
                    for resource, value in (assignment.get("resourceUsage") or {}).items():
                        flavor = (assignment.get("flavors") or {}).get(resource, "")
                        key = (flavor, resource)
                        usage[cq][key] = usage[cq].get(key, Fraction(0)) + quantity(value)
            elif not admission:
                pending.append(workload)
        for workload in pending:
            meta = workload["metadata"]
            queue = local.get((meta["namespace"], (workload.get("spec") or {}).get("queueName", "")))
            cq_name = (queue or {}).get("spec", {}).get("clusterQueue", "")
            if cq_name not in queues:
                why = f"LocalQueue {workload.get('spec', {}).get('queueName', '')} doesn't exist or has no ClusterQueue"
                self._pend(workload, why)
                continue
            counts[cq_name]["pending"] += 1
            assignments, why = self._assign(workload, queues[cq_name], flavors, usage[cq_name])
            if assignments is None:
                self._pend(workload, why)
                continue
            counts[cq_name]["pending"] -= 1
            counts[cq_name]["admitted"] += 1
            for assignment in assignments:
                for resource, value in assignment["resourceUsage"].items():
                    key = (assignment["flavors"][resource], resource)
                    usage[cq_name][key] = usage[cq_name].get(key, Fraction(0)) + quantity(value)
            self._admit(workload, cq_name, assignments)
        for name, cq in queues.items():
            self._write_queue_status(cq, usage[name], counts[name])
        for (namespace, name), queue in local.items():
            cq = queue.get("spec", {}).get("clusterQueue", "")
            mine = [
                w
                for w in workloads
                if w["metadata"]["namespace"] == namespace and (w.get("spec") or {}).get("queueName") == name
            ]
            status = {
                "admittedWorkloads": sum(1 for w in mine if _is_true(w, "Admitted") and not _is_true(w, "Finished")),
                "pendingWorkloads": sum(1 for w in mine if not (w.get("status") or {}).get("admission")),
            }
            if cq in queues:
                self._store.mutate(LOCAL_QUEUES, namespace, name, lambda obj, s=status: obj.__setitem__("status", s))

    def _assign(self, workload: dict, cq: dict, flavors: dict, used: dict) -> tuple[list[dict] | None, str]:
        """Each pod set's flavors, or None and why the Workload does not fit now."""
        groups = (cq.get("spec") or {}).get("resourceGroups") or []
        tentative = dict(used)
        assignments = []
        for podset in (workload.get("spec") or {}).get("podSets") or []:
            try:
                requests = podset_requests(podset)
            except ValueError as exc:
                return None, str(exc)
            selector = ((podset.get("template") or {}).get("spec") or {}).get("nodeSelector") or {}
            chosen: dict[str, str] = {}
            for resource in requests:
                if not any(resource in g.get("coveredResources", []) for g in groups):
                    return None, f"resource {resource} unavailable in ClusterQueue"
            for group in groups:
                wanted = {r: v for r, v in requests.items() if r in group.get("coveredResources", [])}
                if not wanted:
                    continue
                reasons = []
                for flavor in group.get("flavors") or []:
                    name = flavor["name"]
                    if name not in flavors:
                        reasons.append(f"flavor {name} not found")
                        continue
                    if not _flavor_fits_selector(flavors[name], selector):
                        reasons.append(f"flavor {name} doesn't match node affinity")
                        continue
                    quota = {r["name"]: quantity(r["nominalQuota"]) for r in flavor.get("resources") or []}
                    short = [
                        r for r, v in wanted.items() if tentative.get((name, r), Fraction(0)) + v > quota.get(r, 0)
                    ]
                    if short:
                        reasons.append(f"insufficient unused quota for {', '.join(short)} in flavor {name}")
                        continue
                    for r, v in wanted.items():
                        chosen[r] = name
                        tentative[(name, r)] = tentative.get((name, r), Fraction(0)) + v
                    break
                else:
                    return None, "couldn't assign flavors to pod set " + podset.get("name", "main") + ": " + "; ".join(
                        reasons
                    )
            assignments.append(
                {
                    "name": podset.get("name", "main"),
                    "flavors": chosen,
                    "resourceUsage": {r: quantity_text(v) for r, v in requests.items()},
                    "count": int(podset.get("count", 1)),
                }
            )
        return assignments, ""

    def _admit(self, workload: dict, cq_name: str, assignments: list[dict]) -> None:
        meta = workload["metadata"]

        def admit(obj: dict) -> None:
            status = obj.setdefault("status", {})
            status["admission"] = {"clusterQueue": cq_name, "podSetAssignments": assignments}
            message = f"Quota reserved in ClusterQueue {cq_name}"
            status["conditions"] = [
                c for c in status.get("conditions", []) if c.get("type") not in ("QuotaReserved", "Admitted")
            ] + [
                _condition("QuotaReserved", "True", "QuotaReserved", message),
                _condition("Admitted", "True", "Admitted", "The workload is admitted"),
            ]

        self._store.mutate(WORKLOADS, meta["namespace"], meta["name"], admit)

    def _pend(self, workload: dict, why: str) -> None:
        current = next(
            (c for c in (workload.get("status") or {}).get("conditions", []) if c.get("type") == "QuotaReserved"), {}
        )
        if current.get("status") == "False" and current.get("message") == why:
            return  # unchanged: no write, no watch event

        def pend(obj: dict) -> None:
            status = obj.setdefault("status", {})
            status["conditions"] = [c for c in status.get("conditions", []) if c.get("type") != "QuotaReserved"] + [
                _condition("QuotaReserved", "False", "Pending", why)
            ]

        meta = workload["metadata"]
        self._store.mutate(WORKLOADS, meta["namespace"], meta["name"], pend)

    def _write_queue_status(self, cq: dict, used: dict, counts: dict) -> None:
        flavors_usage = []
        for group in (cq.get("spec") or {}).get("resourceGroups") or []:
            for flavor in group.get("flavors") or []:
                resources = [
                    {"name": r, "total": quantity_text(used.get((flavor["name"], r), Fraction(0))), "borrowed": "0"}
                    for r in group.get("coveredResources", [])
                ]
                flavors_usage.append({"name": flavor["name"], "resources": resources})

        def write(obj: dict) -> None:
            status = obj.setdefault("status", {})
            status.update(
                flavorsReservation=flavors_usage,
                flavorsUsage=flavors_usage,
                admittedWorkloads=counts["admitted"],
                reservingWorkloads=counts["admitted"],
                pendingWorkloads=counts["pending"],
            )
            ready = [c for c in status.get("conditions", []) if c.get("type") == "Active"]
            if not ready:
                status["conditions"] = [_condition("Active", "True", "Ready", "Can admit new workloads")]

        self._store.mutate(CLUSTER_QUEUES, "", cq["metadata"]["name"], write)
