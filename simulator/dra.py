"""NVIDIA's DRA driver (`gpu.nvidia.com`) on the nodes that run it, and the scheduler's allocator for its claims.

The kubelet plugin, as kubernetes-sigs/dra-driver-nvidia-gpu does it (docs/nvidia-contracts.md §13): one pool per node
named after the node, one slice in static mode, device names and attribute keys as `deviceinfo.go`/`mig.go` make them,
MIG devices instead of (never beside) their parent, nothing for a MIG-enabled GPU without instances. It discovers the
hardware once, when its pod starts: a MIG change shows only after the pod is deleted and recreated. The slice is kept
or replaced by the resourceslice controller's rule (§13.2): an in-place update keeps the pool generation.

The allocator stands in for kube-scheduler's DRA plugin for the pods the simulator places (pods are not created
through the API): a pod names claims (or claim templates) or asks an extended resource a DeviceClass maps; each
request gets free devices of one node's pool whose DeviceClass and request CEL selectors hold, evaluated by cel-python.
Claims of a deleted pod lose it from `reservedFor`; with no consumer left a template's claim is deleted and any other
claim deallocated, as the resourceclaim controller does. Not simulated: DynamicMIG (shared counters), `firstAvailable`,
`allocationMode: All`, constraints, admin access, device taints, `semver()` in CEL (version attributes are strings).
"""

from __future__ import annotations

import functools

import celpy
from celpy import celtypes

from sharing.dra import DRIVER, newest_complete, pool_key
from sharing.mig import GpuProduct
from simulator.controller import ControllerLoop
from simulator.errors import ApiError
from simulator.fleet import Gpu, MigDevice, SimNode
from simulator.ids import suffix
from simulator.kueue import quantity
from simulator.resources import (
    DAEMONSETS,
    DEVICE_CLASSES,
    NAMESPACES,
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from simulator.store import Change, Store, now_timestamp
from simulator.workload import DAEMONSET_TOLERATIONS, pod_object

PLUGIN_NAMESPACE = "nvidia-dra-driver-gpu"
PLUGIN_DAEMONSET = "dra-driver-nvidia-gpu-kubelet-plugin"
# The Helm chart's pod labels (templates/_helpers.tpl: templateLabels + selectorLabels for "kubelet-plugin").
PLUGIN_LABELS = {"app.kubernetes.io/name": "dra-driver-nvidia-gpu", "dra-driver-nvidia-gpu-component": "kubelet-plugin"}
PLUGIN_IMAGE = "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.4.1"
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
_DRA_PLURALS = {"resourceclaims", "resourceslices", "deviceclasses", "resourceclaimtemplates"}


# -- what the kubelet plugin publishes (pure) ---------------------------------------------------------------------


def _semver(text: str) -> str:
    """Masterminds semver's normal form, as the driver publishes version attributes ("12.4" -> "12.4.0")."""
    parts = [str(int(p)) for p in text.split(".")] + ["0", "0"]
    return ".".join(parts[:3])


def _architecture(product: GpuProduct) -> str:
    return product.architecture.replace("-", " ").title()  # NVML's names: Hopper, Ampere, Ada Lovelace


def _common_attributes(node: SimNode, gpu: Gpu) -> dict:
    product = gpu.product
    return {
        "productName": {"string": product.display_name},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": _architecture(product)},
        "cudaComputeCapability": {"version": _semver("{}.{}".format(*product.compute_capability))},
        "driverVersion": {"version": _semver(node.driver_version)},
        "cudaDriverVersion": {"version": _semver(node.cuda_version)},
        # the standard attribute's form is domain:bus:device.function with a 4-digit domain (NVML gives 8)
        "resource.kubernetes.io/pciBusID": {"string": gpu.pci_bus_id.lower()[-12:]},
    }


def gpu_device(node: SimNode, gpu: Gpu) -> dict:
    """`GpuInfo.GetDevice()`: `gpu-<minor>` (the simulated minor is the GPU's index) with its attributes and memory."""
    return {
        "name": f"gpu-{gpu.index}",
        "attributes": {"type": {"string": "gpu"}, "uuid": {"string": gpu.uuid}, **_common_attributes(node, gpu)},
        "capacity": {"memory": {"value": f"{gpu.product.memory_mib}Mi"}},
    }


def mig_device_name(gpu_minor: int, profile: str, profile_id: int, start: int) -> str:
    """`MigSpecTuple.ToCanonicalName`: dots dropped from the profile, then the GI profile id and placement start."""
    return f"gpu-{gpu_minor}-mig-{profile.replace('.', '').replace('+', '-')}-{profile_id}-{start}"


def mig_device(node: SimNode, gpu: Gpu, mig: MigDevice) -> dict:
    """`MigDeviceInfo.GetDevice()`: the parent's attributes, type/uuid/parentUUID/profile, and one memorySlice<i>
    capacity per memory slice it holds. Engine counts are not in Tessera's catalog, so only SMs and memory."""
    profile = gpu.product.mig_profile(mig.profile)
    capacity = {
        "multiprocessors": {"value": str(profile.multiprocessors)},
        "memory": {"value": f"{profile.memory_mib}Mi"},
    }
    for i in range(mig.start, mig.start + mig.size):
        capacity[f"memorySlice{i}"] = {"value": "1"}
    attributes = {
        "type": {"string": "mig"},
        "uuid": {"string": mig.uuid},
        "parentUUID": {"string": gpu.uuid},
        "profile": {"string": mig.profile},
        **_common_attributes(node, gpu),
    }
    return {
        "name": mig_device_name(gpu.index, mig.profile, profile.profile_id, mig.start),
        "attributes": attributes,
        "capacity": capacity,
    }


def discover(node: SimNode) -> list[dict]:
    """`GetPerGpuAllocatableDevices()` at plugin start: whole GPUs, or the MIG devices of a MIG-enabled GPU (nothing
    for one without instances)."""
    devices = []
    for gpu in node.gpus:
        if gpu.mig_enabled:
            devices += [mig_device(node, gpu, mig) for mig in sorted(gpu.mig_devices, key=lambda m: m.start)]
        else:
            devices.append(gpu_device(node, gpu))
    return devices


def device_classes() -> list[dict]:
    """The chart's classes (templates/deviceclass-{gpu,mig}.yaml): `gpu.nvidia.com` maps `nvidia.com/gpu`."""

    def cls(name: str, kind: str, extra: dict) -> dict:
        selector = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
        return {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": selector}}], **extra}}

    return [
        cls("gpu.nvidia.com", "gpu", {"extendedResourceName": "nvidia.com/gpu"}),
        cls("mig.nvidia.com", "mig", {}),
    ]


def slice_object(node: str, node_uid: str, generation: int, devices: list[dict], name: str | None = None) -> dict:
    owner = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
    meta: dict = {"ownerReferences": [owner]}
    if name:
        meta["name"] = name
    else:
        meta["generateName"] = f"00000-{DRIVER}-{node}-"
    return {
        "metadata": meta,
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


# -- CEL, as kube-scheduler evaluates DeviceClass and request selectors ----------------------------------------------


@functools.lru_cache(maxsize=512)
def _program(expression: str):
    """Compiled once per expression; a syntax error raises celpy.CELParseError."""
    env = celpy.Environment()
    return env.program(env.compile(expression), functions=_CEL_FUNCTIONS)


def _cel_quantity(text) -> celtypes.IntType:
    return celtypes.IntType(int(quantity(str(text))))


def _compare(a, b) -> celtypes.IntType:
    return celtypes.IntType((a > b) - (a < b))


_CEL_FUNCTIONS = {
    "quantity": _cel_quantity,
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: celtypes.BoolType(a > b),
    "isLessThan": lambda a, b: celtypes.BoolType(a < b),
    "asInteger": lambda a: celtypes.IntType(a),
}


def cel_device(driver: str, device: dict) -> dict:
    """The `device` variable: attributes and capacity by domain (a bare key belongs to the driver's domain)."""
    attributes: dict[str, dict] = {}
    for key, value in (device.get("attributes") or {}).items():
        domain, _, name = key.rpartition("/")
        (kind, raw), *_ = value.items()
        attributes.setdefault(domain or driver, {})[name] = raw
    capacity: dict[str, dict] = {}
    for key, value in (device.get("capacity") or {}).items():
        domain, _, name = key.rpartition("/")
        capacity.setdefault(domain or driver, {})[name] = int(quantity(value["value"]))
    return {
        "driver": driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": bool(device.get("allowMultipleAllocations")),
    }


def selectors_match(selectors: list[dict], device: dict) -> bool:
    """All CEL selectors hold for `device` (cel_device form); a runtime error (a missing attribute) is an error for
    the claim, as the scheduler reports it, not a silent mismatch."""
    activation = {"device": celpy.json_to_cel(device)}
    for selector in selectors:
        expression = (selector.get("cel") or {}).get("expression", "")
        try:
            result = _program(expression).evaluate(activation)
        except celpy.CELParseError as exc:
            raise AllocationError(f"selector {expression!r}: CEL compile error: {exc}") from exc
        except celpy.CELEvalError as exc:
            raise AllocationError(f"selector {expression!r}: CEL runtime error: {exc.args[0]}") from exc
        if not isinstance(result, celtypes.BoolType):
            raise AllocationError(f"selector {expression!r}: must evaluate to bool")
        if not result:
            return False
    return True


class AllocationError(Exception):
    """Why a claim cannot be allocated (shown on the pod's PodScheduled condition)."""


def _check_selectors(path: str, selectors: object) -> None:
    for i, selector in enumerate(selectors or []):
        expression = ((selector or {}).get("cel") or {}).get("expression") if isinstance(selector, dict) else None
        if not isinstance(expression, str) or not expression:
            raise ApiError.invalid("resourceclaims", "", f"{path}.selectors[{i}].cel.expression: Required value")
        try:
            _program(expression)
        except celpy.CELParseError as exc:
            raise ApiError.invalid(
                "resourceclaims", "", f"{path}.selectors[{i}].cel.expression: Invalid value: compilation failed: {exc}"
            ) from exc


def normalize_claim_spec(kind: str, name: str, spec: dict, path: str = "spec") -> None:
    """kube-apiserver's validation and defaulting of `spec.devices.requests` (v1): a request is `exactly` (count 1,
    ExactCount by default) or `firstAvailable`; selectors must compile. 422 otherwise."""
    requests = ((spec or {}).get("devices") or {}).get("requests") or []
    seen = set()
    for i, request in enumerate(requests):
        where = f"{path}.devices.requests[{i}]"
        rname = request.get("name", "")
        if not rname or rname in seen:
            raise ApiError.invalid(kind, name, f"{where}.name: {'Duplicate' if rname else 'Required'} value")
        seen.add(rname)
        exactly, first = request.get("exactly"), request.get("firstAvailable")
        if bool(exactly) == bool(first):
            raise ApiError.invalid(kind, name, f"{where}: Invalid value: exactly one of `exactly` or `firstAvailable`")
        for j, sub in enumerate([exactly] if exactly else first):
            sub_path = f"{where}.exactly" if exactly else f"{where}.firstAvailable[{j}]"
            if not sub.get("deviceClassName"):
                raise ApiError.invalid(kind, name, f"{sub_path}.deviceClassName: Required value")
            _check_selectors(sub_path, sub.get("selectors"))
            sub.setdefault("allocationMode", "ExactCount")
            if sub["allocationMode"] == "ExactCount":
                sub.setdefault("count", 1)


def _normalize_claim(old: dict | None, new: dict) -> None:
    if old is not None and old.get("spec") != new.get("spec"):
        raise ApiError.invalid("resourceclaims", new["metadata"]["name"], "spec: Invalid value: field is immutable")
    normalize_claim_spec("resourceclaims", new["metadata"].get("name", ""), new.get("spec") or {})


def _normalize_template(old: dict | None, new: dict) -> None:
    spec = (new.get("spec") or {}).get("spec") or {}
    normalize_claim_spec("resourceclaimtemplates", new["metadata"].get("name", ""), spec, "spec.spec")


def _normalize_class(old: dict | None, new: dict) -> None:
    for i, selector in enumerate((new.get("spec") or {}).get("selectors") or []):
        expression = (selector.get("cel") or {}).get("expression", "")
        try:
            _program(expression)
        except celpy.CELParseError as exc:
            raise ApiError.invalid(
                "deviceclasses",
                new["metadata"]["name"],
                f"spec.selectors[{i}].cel.expression: Invalid value: compilation failed: {exc}",
            ) from exc


# -- the driver and the allocator --------------------------------------------------------------------------------


class Dra(ControllerLoop):
    """The GPU kubelet plugin on every DRA node and the allocator, on one thread fed by store changes."""

    def __init__(self, store: Store, nodes: dict[str, SimNode], dra_nodes: set[str], seed: int):
        super().__init__("sim-dra")
        self._store = store
        self._nodes = nodes
        self.dra_nodes = dra_nodes
        self._seed = seed
        self._queued = False
        self._waiting: set[tuple[str, str]] = set()  # pods Pending on devices: (namespace, name)
        self.plugin_starts = dict.fromkeys(dra_nodes, 0)

    def install(self) -> None:
        store = self._store
        store.set_normalizer(RESOURCE_CLAIMS, _normalize_claim)
        store.set_normalizer(RESOURCE_CLAIM_TEMPLATES, _normalize_template)
        store.set_normalizer(DEVICE_CLASSES, _normalize_class)

    def bootstrap(self) -> None:
        """Classes, the plugin's DaemonSet and pods, and the first generation of every DRA node's pool."""
        if not self.dra_nodes:
            return
        store = self._store
        store.load(NAMESPACES, [{"metadata": {"name": PLUGIN_NAMESPACE}, "status": {"phase": "Active"}}])
        store.load(DEVICE_CLASSES, device_classes())
        store.load(DAEMONSETS, [self._daemonset()])
        for name in sorted(self.dra_nodes):
            store.create(PODS, self._plugin_pod(name))
            self._publish(name)

    def resume(self) -> None:
        """After a restore: the pods still waiting for devices."""
        self._waiting = {_key(p) for p in self._store.objects(PODS) if _waiting(p)}
        if self._waiting:
            self.submit(self._schedule)

    # store listener (under the store lock): decide, enqueue
    def on_change(self, change: Change) -> None:
        resource = change.resource
        obj = change.entry.obj
        if resource is PODS:
            if change.type == "DELETED":
                self._waiting.discard(_key(obj))
                node = obj["spec"].get("nodeName")
                if _is_plugin_pod(obj) and node in self.dra_nodes:
                    self.submit(lambda: self._plugin_restarted(node))
                elif obj["spec"].get("resourceClaims") or obj["status"].get("extendedResourceClaimStatus"):
                    self.submit(lambda: self._release(obj))
                return
            if not _waiting(obj):
                self._waiting.discard(_key(obj))
                return
            self._waiting.add(_key(obj))
        elif resource.plural not in _DRA_PLURALS:
            return
        if self._waiting and not self._queued:
            self._queued = True
            self.submit(self._schedule)

    # -- the kubelet plugin ----------------------------------------------------------------------------------

    def restart_plugin(self, node: str) -> None:
        """`kubectl delete pod` of the node's plugin pod; the DaemonSet makes a new one, which discovers again."""
        pod = self.plugin_pod(node)
        if pod is not None:
            self._store.delete(PODS, PLUGIN_NAMESPACE, pod["metadata"]["name"])

    def plugin_pod(self, node: str) -> dict | None:
        return next((p for p in self._store.indexed(PODS, node) if _is_plugin_pod(p)), None)

    def _plugin_restarted(self, node: str) -> None:
        if self.plugin_pod(node) is None:
            self._store.create(PODS, self._plugin_pod(node))
        self._publish(node)

    def _publish(self, node: str) -> None:
        """The resourceslice controller's sync of the node's pool (resourceslicecontroller.go l.725-810): one desired
        slice; an existing one at the newest generation is updated in place (generation kept), older ones deleted."""
        self.plugin_starts[node] = self.plugin_starts.get(node, 0) + 1
        devices = discover(self._nodes[node])
        store = self._store
        mine = [s for s in store.objects(RESOURCE_SLICES) if pool_key(s) == (DRIVER, node)]
        generation = max((s["spec"]["pool"].get("generation", 0) for s in mine), default=0)
        current = [s for s in mine if s["spec"]["pool"].get("generation", 0) == generation]
        matched = next((s for s in current if s["metadata"]["name"].startswith("00000-")), None)
        for obsolete in mine:
            if obsolete is not matched:
                store.delete(RESOURCE_SLICES, "", obsolete["metadata"]["name"])
        node_uid = store.get(NODES, "", node).obj["metadata"]["uid"]
        if matched is None:
            store.create(RESOURCE_SLICES, slice_object(node, node_uid, generation + 1, devices))
            return
        wanted = slice_object(node, node_uid, generation, devices, matched["metadata"]["name"])

        def update(obj: dict) -> None:
            obj["spec"] = wanted["spec"]

        store.mutate(RESOURCE_SLICES, "", matched["metadata"]["name"], update)

    def _daemonset(self) -> dict:
        count = len(self.dra_nodes)
        labels = {**PLUGIN_LABELS, "app.kubernetes.io/instance": "nvidia-dra-driver-gpu"}
        return {
            "metadata": {"name": PLUGIN_DAEMONSET, "namespace": PLUGIN_NAMESPACE, "labels": labels},
            "spec": {
                "selector": {"matchLabels": {"dra-driver-nvidia-gpu-component": "kubelet-plugin"}},
                "template": {
                    "metadata": {"labels": dict(PLUGIN_LABELS)},
                    "spec": {"containers": [{"name": "gpus", "image": PLUGIN_IMAGE, "env": _plugin_env()}]},
                },
            },
            "status": {
                "desiredNumberScheduled": count,
                "currentNumberScheduled": count,
                "numberReady": count,
                "updatedNumberScheduled": count,
                "numberAvailable": count,
                "numberMisscheduled": 0,
                "observedGeneration": 1,
            },
        }

    def _plugin_pod(self, node: str) -> dict:
        starts = self.plugin_starts.get(node, 0)
        while True:
            name = f"{PLUGIN_DAEMONSET}-{suffix(self._seed, node, 'dra', starts)}"
            if self._store.find(PODS, PLUGIN_NAMESPACE, name) is None:
                break
            starts += 1
        host_ip = self._nodes[node].internal_ip
        return pod_object(
            name=name,
            namespace=PLUGIN_NAMESPACE,
            node=node,
            containers=[{"name": "gpus", "image": PLUGIN_IMAGE, "env": _plugin_env()}],
            labels=dict(PLUGIN_LABELS),
            owner={
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "name": PLUGIN_DAEMONSET,
                "uid": self._store.get(DAEMONSETS, PLUGIN_NAMESPACE, PLUGIN_DAEMONSET).obj["metadata"]["uid"],
                "controller": True,
            },
            priority_class="system-node-critical",
            priority=2000001000,
            host_ip=host_ip,
            pod_ip=host_ip,
            tolerations=DAEMONSET_TOLERATIONS,
        )

    # -- the allocator (kube-scheduler's DRA plugin and the resourceclaim controller) -----------------------------

    def _schedule(self) -> None:
        self._queued = False
        for namespace, name in sorted(self._waiting):
            pod = self._store.find(PODS, namespace, name)
            if pod is not None and _waiting(pod):
                self._try_bind(pod)

    def _try_bind(self, pod: dict) -> None:
        store, meta = self._store, pod["metadata"]
        try:
            claims = self._claims_of(pod)
            node, results = self._place(pod, claims)
        except AllocationError as exc:
            self._unschedulable(pod, str(exc))
            return
        now = now_timestamp()
        reserve = {"resource": "pods", "name": meta["name"], "uid": meta["uid"]}
        statuses = []
        for (pod_claim, claim), chosen in zip(claims, results, strict=True):
            cname = claim["metadata"]["name"]
            if chosen is not None:
                allocation = {
                    "devices": {"results": chosen},
                    "nodeSelector": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                        ]
                    },
                    "allocationTimestamp": now,
                }
            else:
                allocation = None

            def write(obj: dict, allocation=allocation) -> None:
                status = obj.setdefault("status", {})
                if allocation is not None:
                    status["allocation"] = allocation
                reserved = status.setdefault("reservedFor", [])
                if reserve not in reserved:
                    reserved.append(reserve)

            store.mutate(RESOURCE_CLAIMS, meta["namespace"], cname, write)
            if pod_claim is not None:
                statuses.append({"name": pod_claim, "resourceClaimName": cname})
        host_ip = self._nodes[node].internal_ip

        def bind(obj: dict) -> None:
            obj["spec"]["nodeName"] = node
            status = obj["status"]
            status.update(phase="Running", hostIP=host_ip, startTime=now)
            status["conditions"] = [
                {"type": kind, "status": "True", "lastTransitionTime": now}
                for kind in ("Initialized", "Ready", "PodScheduled")
            ]
            if statuses:
                status["resourceClaimStatuses"] = statuses
            extended = next((c for p, c in claims if p is None), None)
            if extended is not None:
                status["extendedResourceClaimStatus"] = {
                    "resourceClaimName": extended["metadata"]["name"],
                    "requestMappings": _extended_mappings(obj),
                }
            for container in status.get("containerStatuses") or []:
                container.update(ready=True, started=True, state={"running": {"startedAt": now}})

        store.mutate(PODS, meta["namespace"], meta["name"], bind)

    def _claims_of(self, pod: dict) -> list[tuple[str | None, dict]]:
        """(pod claim name, claim) for each `spec.resourceClaims` entry (a template's claim is made now, as the
        resourceclaim controller does) and the extended-resource claim (pod claim name None)."""
        store = self._store
        namespace = pod["metadata"]["namespace"]
        result = []
        for entry in pod["spec"].get("resourceClaims") or []:
            if entry.get("resourceClaimName"):
                claim = store.find(RESOURCE_CLAIMS, namespace, entry["resourceClaimName"])
                if claim is None:
                    raise AllocationError(f'resourceclaim "{entry["resourceClaimName"]}" not found')
            else:
                claim = self._claim_from_template(pod, entry)
            result.append((entry["name"], claim))
        extended = _extended_requests(pod)
        if extended:
            result.append((None, self._extended_claim(pod, extended)))
        return result

    def _claim_from_template(self, pod: dict, entry: dict) -> dict:
        store, meta = self._store, pod["metadata"]
        existing = next(
            (
                c
                for c in store.objects(RESOURCE_CLAIMS)
                if c["metadata"]["namespace"] == meta["namespace"]
                and (c["metadata"].get("annotations") or {}).get(POD_CLAIM_ANNOTATION) == entry["name"]
                and _owned_by(c, pod)
            ),
            None,
        )
        if existing is not None:
            return existing
        template = store.find(RESOURCE_CLAIM_TEMPLATES, meta["namespace"], entry.get("resourceClaimTemplateName", ""))
        if template is None:
            raise AllocationError(f'resourceclaimtemplate "{entry.get("resourceClaimTemplateName")}" not found')
        body = template.get("spec") or {}
        claim = {
            "metadata": {
                "generateName": f"{meta['name']}-{entry['name']}-",
                "namespace": meta["namespace"],
                "labels": dict((body.get("metadata") or {}).get("labels") or {}),
                "annotations": {POD_CLAIM_ANNOTATION: entry["name"]},
                "ownerReferences": [_owner(pod)],
            },
            "spec": body.get("spec") or {},
        }
        return store.create(RESOURCE_CLAIMS, claim)

    def _extended_claim(self, pod: dict, requests: list[dict]) -> dict:
        store, meta = self._store, pod["metadata"]
        existing = next(
            (
                c
                for c in store.objects(RESOURCE_CLAIMS)
                if c["metadata"]["namespace"] == meta["namespace"]
                and (c["metadata"].get("annotations") or {}).get(EXTENDED_CLAIM_ANNOTATION) == "true"
                and _owned_by(c, pod)
            ),
            None,
        )
        if existing is not None:
            return existing
        claim = {
            "metadata": {
                "generateName": f"{meta['name']}-extended-resources-",
                "namespace": meta["namespace"],
                "annotations": {EXTENDED_CLAIM_ANNOTATION: "true"},
                "ownerReferences": [_owner(pod)],
            },
            "spec": {"devices": {"requests": requests}},
        }
        return store.create(RESOURCE_CLAIMS, claim)

    def _place(self, pod: dict, claims: list[tuple[str | None, dict]]) -> tuple[str, list[list[dict] | None]]:
        """The first DRA node (the pod's own if it names one) where every unallocated claim fits."""
        store = self._store
        allocated_on = {
            _allocated_node(c) for _, c in claims if (c.get("status") or {}).get("allocation") is not None
        } - {None}
        candidates = sorted(self.dra_nodes)
        wanted = pod["spec"].get("nodeSelector", {}).get("kubernetes.io/hostname")
        if wanted:
            candidates = [n for n in candidates if n == wanted]
        if allocated_on:
            candidates = [n for n in candidates if n in allocated_on]
        classes = {c["metadata"]["name"]: c for c in store.objects(DEVICE_CLASSES)}
        in_use = _devices_in_use(store.objects(RESOURCE_CLAIMS))
        reasons = []
        for node in candidates:
            obj = store.find(NODES, "", node)
            if obj is None or obj["spec"].get("unschedulable") or not _ready(obj):
                continue
            devices = _pool_devices(store.objects(RESOURCE_SLICES), node)
            taken = set(in_use)
            results: list[list[dict] | None] = []
            try:
                for _, claim in claims:
                    if (claim.get("status") or {}).get("allocation") is not None:
                        results.append(None)
                        continue
                    chosen = _allocate(claim, node, devices, classes, taken)
                    taken |= {r["device"] for r in chosen}
                    results.append(chosen)
            except AllocationError as exc:
                reasons.append(f"{node}: {exc}")
                continue
            return node, results
        if not reasons:
            raise AllocationError("0 nodes are available: no Ready, schedulable node runs the gpu.nvidia.com driver")
        raise AllocationError("; ".join(reasons[:3]) + (f" (and {len(reasons) - 3} more)" if len(reasons) > 3 else ""))

    def _unschedulable(self, pod: dict, why: str) -> None:
        current = next((c for c in pod["status"].get("conditions") or [] if c.get("type") == "PodScheduled"), {})
        if current.get("message") == why:
            return

        def write(obj: dict) -> None:
            obj["status"]["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": why,
                    "lastTransitionTime": now_timestamp(),
                }
            ]

        self._store.mutate(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], write)

    def _release(self, pod: dict) -> None:
        """The resourceclaim controller: a deleted pod leaves `reservedFor`; a claim nobody uses is deallocated, or
        deleted when the pod owned it."""
        store, uid = self._store, pod["metadata"]["uid"]
        for claim in store.objects(RESOURCE_CLAIMS):
            if claim["metadata"]["namespace"] != pod["metadata"]["namespace"]:
                continue
            reserved = (claim.get("status") or {}).get("reservedFor") or []
            if not any(r.get("uid") == uid for r in reserved) and not _owned_by(claim, pod):
                continue
            left = [r for r in reserved if r.get("uid") != uid]
            name = claim["metadata"]["name"]
            if not left and _owned_by(claim, pod):
                store.delete(RESOURCE_CLAIMS, claim["metadata"]["namespace"], name)
                continue

            def write(obj: dict, left=left) -> None:
                status = obj.setdefault("status", {})
                status["reservedFor"] = left
                if not left:
                    status.pop("reservedFor")
                    status.pop("allocation", None)

            store.mutate(RESOURCE_CLAIMS, claim["metadata"]["namespace"], name, write)

    # -- Python API -----------------------------------------------------------------------------------------------

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        claims: list[dict] | None = None,
        gpus: int = 0,
        node: str | None = None,
        labels: dict | None = None,
    ) -> dict:
        """A pod for the scheduler: `claims` as in `spec.resourceClaims` ({"name", "resourceClaimName" or
        "resourceClaimTemplateName"}), `gpus` as `nvidia.com/gpu` limits (the extended-resource path); `node` pins
        it (a nodeSelector on kubernetes.io/hostname). It starts Pending and runs once its claims are allocated."""
        container: dict = {"name": "main", "image": "nvcr.io/nvidia/pytorch:25.01-py3"}
        if claims:
            container["resources"] = {"claims": [{"name": c["name"]} for c in claims]}
        if gpus:
            container.setdefault("resources", {})["limits"] = {"nvidia.com/gpu": str(gpus)}
        pod = pod_object(
            name=name,
            namespace=namespace,
            node="",
            containers=[container],
            labels=dict(labels or {}),
            owner={"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": self._store.new_uid()},
        )
        del pod["spec"]["nodeName"]
        if claims:
            pod["spec"]["resourceClaims"] = [dict(c) for c in claims]
        if node:
            pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        pod["status"] = {"phase": "Pending", "qosClass": pod["status"]["qosClass"], "conditions": []}
        created = self._store.create(PODS, pod)
        self.settle()
        return self._store.find(PODS, namespace, created["metadata"]["name"]) or created


def _plugin_env() -> list[dict]:
    return [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "FEATURE_GATES", "value": "TimeSlicingSettings=true,"},
    ]


def _is_plugin_pod(pod: dict) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return pod["metadata"].get("namespace") == PLUGIN_NAMESPACE and all(
        labels.get(k) == v for k, v in PLUGIN_LABELS.items()
    )


def _pool_devices(slices: list[dict], node: str) -> list[dict]:
    return [d for s in newest_complete(slices).get((DRIVER, node), []) for d in s["spec"].get("devices") or []]


def _devices_in_use(claims: list[dict]) -> set[str]:
    """Devices (as `pool/device`) any claim holds; the pool is the node."""
    used = set()
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            used.add(f"{result['pool']}/{result['device']}")
    return used


def _allocate(claim: dict, node: str, devices: list[dict], classes: dict, taken: set[str]) -> list[dict]:
    """Each request's `count` devices, first fit in device-name order; AllocationError says which request failed."""
    results = []
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        exactly = request.get("exactly")
        if not exactly:
            raise AllocationError(f"request {request.get('name')}: firstAvailable is not simulated")
        if exactly.get("allocationMode", "ExactCount") != "ExactCount":
            raise AllocationError(f"request {request['name']}: allocationMode All is not simulated")
        cls = classes.get(exactly.get("deviceClassName", ""))
        if cls is None:
            missing = exactly.get("deviceClassName")
            raise AllocationError(f'request {request["name"]}: deviceclass "{missing}" not found')
        selectors = list((cls.get("spec") or {}).get("selectors") or []) + list(exactly.get("selectors") or [])
        chosen = []
        for device in sorted(devices, key=lambda d: _natural(d["name"])):
            key = f"{node}/{device['name']}"
            if key in taken or len(chosen) == int(exactly.get("count", 1)):
                continue
            if selectors_match(selectors, cel_device(DRIVER, device)):
                chosen.append(device["name"])
                taken.add(key)
        if len(chosen) < int(exactly.get("count", 1)):
            raise AllocationError(
                f"cannot allocate all claims: request {request['name']} of claim {claim['metadata']['name']} wants "
                f"{exactly.get('count', 1)} device(s) of class {exactly['deviceClassName']}, {len(chosen)} free match"
            )
        results += [{"request": request["name"], "driver": DRIVER, "pool": node, "device": d} for d in chosen]
    return results


def _natural(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in name.split("-"))


def _extended_requests(pod: dict) -> list[dict]:
    """KEP-5004: `nvidia.com/gpu` limits become requests of the class that maps it, named container-<i>-request-<j>."""
    requests = []
    for i, container in enumerate(pod["spec"].get("containers") or []):
        limits = (container.get("resources") or {}).get("limits") or {}
        for j, (resource, value) in enumerate(sorted(limits.items())):
            if resource == "nvidia.com/gpu":
                requests.append(
                    {
                        "name": f"container-{i}-request-{j}",
                        "exactly": {"deviceClassName": "gpu.nvidia.com", "count": int(value)},
                    }
                )
    return requests


def _extended_mappings(pod: dict) -> list[dict]:
    return [
        {"containerName": pod["spec"]["containers"][int(r["name"].split("-")[1])]["name"], "requestName": r["name"]}
        | {"resourceName": "nvidia.com/gpu"}
        for r in _extended_requests(pod)
    ]


def _wants_devices(pod: dict) -> bool:
    return bool(pod["spec"].get("resourceClaims")) or bool(_extended_requests(pod))


def _waiting(pod: dict) -> bool:
    """Pending with no node yet, asking devices: the allocator's to place."""
    return pod["status"].get("phase") == "Pending" and not pod["spec"].get("nodeName") and _wants_devices(pod)


def _key(pod: dict) -> tuple[str, str]:
    return pod["metadata"].get("namespace", ""), pod["metadata"]["name"]


def _owner(pod: dict) -> dict:
    meta = pod["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _owned_by(obj: dict, pod: dict) -> bool:
    return any(o.get("uid") == pod["metadata"]["uid"] for o in obj["metadata"].get("ownerReferences") or [])


def _allocated_node(claim: dict) -> str | None:
    terms = (((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector") or {}).get("nodeSelectorTerms")
    for term in terms or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("values"):
                return field["values"][0]
    return None


def _ready(node: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in node["status"].get("conditions") or [])
