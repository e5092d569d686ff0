"""Pods: the GPU Operator's DaemonSet pods on each node, and a seeded user workload holding GPU resources."""

from __future__ import annotations

import functools
import hashlib
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sharing.qos import qos_class
from simulator.errors import ApiError
from simulator.ids import suffix
from simulator.labels import is_gpu_resource
from simulator.nodes import DEPLOY_PREFIX
from simulator.resources import DAEMONSETS, NODES, PODS
from simulator.store import Store, now_timestamp

OPERATOR_NAMESPACE = "gpu-operator"
WORKLOAD_NAMESPACES = ("ml-training", "inference", "research")
PROTECTED_LABEL = "sim.tessera.io/protected"  # eviction is refused (429), as if a PodDisruptionBudget forbade it


@dataclass(frozen=True)
class DaemonSetSpec:
    """One of the GPU Operator's DaemonSets, as far as its pods show it."""

    name: str
    component: str  # the nvidia.com/gpu.deploy.<component> label that schedules it (contracts §1.1)
    containers: tuple[str, ...]
    image: str

    @functools.cached_property
    def revision(self) -> str:
        return suffix(self.name, self.image, length=10)


DAEMONSET_SPECS = (
    DaemonSetSpec(
        "nvidia-device-plugin-daemonset",
        "device-plugin",
        ("nvidia-device-plugin", "config-manager"),
        "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
    ),
    DaemonSetSpec(
        "gpu-feature-discovery",
        "gpu-feature-discovery",
        ("gpu-feature-discovery", "config-manager"),
        "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
    ),
    DaemonSetSpec(
        "nvidia-dcgm-exporter",
        "dcgm-exporter",
        ("nvidia-dcgm-exporter",),
        "nvcr.io/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-distroless",
    ),
    DaemonSetSpec(
        "nvidia-mig-manager",
        "mig-manager",
        ("nvidia-mig-manager",),
        "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.15.0",
    ),
)
DAEMONSET_BY_APP = {spec.name: spec for spec in DAEMONSET_SPECS}
EXPORTER = "nvidia-dcgm-exporter"
# The exporter's container as the operator's DaemonSet declares it: port `metrics` 9400, no hostPort, and the host
# label taken from NODE_NAME (contracts §10).
_EXPORTER_CONTAINER = {
    "ports": [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}],
    "env": [
        {"name": "DCGM_EXPORTER_LISTEN", "value": ":9400"},
        {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"},
        {"name": "DCGM_EXPORTER_COLLECTORS", "value": "/etc/dcgm-exporter/dcp-metrics-included.csv"},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}},
    ],
}


def exporter_service() -> dict:
    """The Service the operator puts in front of the exporter pods (port `gpu-metrics` 9400)."""
    return {
        "metadata": {
            "name": EXPORTER,
            "namespace": OPERATOR_NAMESPACE,
            "labels": {"app": EXPORTER},
            "annotations": {"prometheus.io/scrape": "true"},
            "creationTimestamp": now_timestamp(),
        },
        "spec": {
            "selector": {"app": EXPORTER},
            "ports": [{"name": "gpu-metrics", "port": 9400, "targetPort": 9400, "protocol": "TCP"}],
            "type": "ClusterIP",
            "clusterIP": "10.96.94.0",
            "internalTrafficPolicy": "Cluster",
        },
    }


@functools.lru_cache(maxsize=64)
def _image_id(image: str) -> str:
    return image.split(":")[0] + "@sha256:" + hashlib.sha256(image.encode()).hexdigest()


# Added to every pod without its own by the DefaultTolerationSeconds admission plugin.
DEFAULT_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
)
# What the DaemonSet controller adds to its pods' tolerations.
DAEMONSET_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
)
POOL_TAINT_KEY = "tessera.io/pool"
# namespace -> (priority class, priority) of its workload; research pods have one only sometimes.
PRIORITY_CLASSES = {"inference": ("inference-high", 100000), "ml-training": ("batch-low", 1000)}
RESEARCH_PRIORITY = ("research-normal", 5000)


def _defaulted(container: dict) -> dict:
    """The API server's defaulting: a limit without a request gets the limit as its request."""
    resources = container.get("resources")
    if resources and resources.get("limits"):
        requests = resources.setdefault("requests", {})
        for name, value in resources["limits"].items():
            requests.setdefault(name, value)
    return container


def pod_object(
    *,
    name: str,
    namespace: str,
    node: str,
    containers: list[dict],
    labels: dict[str, str],
    owner: dict | None = None,
    priority_class: str | None = None,
    priority: int = 0,
    volumes: list[dict] | None = None,
    host_ip: str = "",
    pod_ip: str = "",
    started: str | None = None,
    init_containers: list[dict] | None = None,
    tolerations: list[dict] | tuple[dict, ...] = DEFAULT_TOLERATIONS,
) -> dict:
    started = started or now_timestamp()
    spec: dict = {
        "nodeName": node,
        "containers": [_defaulted(c) for c in containers],
        "restartPolicy": "Always" if owner is None or owner["kind"] != "Job" else "Never",
        "schedulerName": "default-scheduler",
        "serviceAccountName": "default",
        "priority": priority,
        "terminationGracePeriodSeconds": 30,
        "tolerations": [dict(t) for t in tolerations],
    }
    if init_containers:
        spec["initContainers"] = [_defaulted(c) for c in init_containers]
    if priority_class:
        spec["priorityClassName"] = priority_class
    if volumes:
        spec["volumes"] = volumes
    metadata: dict = {"name": name, "namespace": namespace, "labels": labels, "creationTimestamp": started}
    if owner:
        metadata["ownerReferences"] = [owner]
    condition = {"status": "True", "lastTransitionTime": started}
    return {
        "metadata": metadata,
        "spec": spec,
        "status": {
            "phase": "Running",
            "conditions": [dict(condition, type=kind) for kind in ("Initialized", "Ready", "PodScheduled")],
            "hostIP": host_ip,
            "podIP": pod_ip,
            "startTime": started,
            "qosClass": qos_class(spec),
            "containerStatuses": [
                {
                    "name": c["name"],
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "image": c["image"],
                    "imageID": _image_id(c["image"]),
                    "containerID": "containerd://"
                    + hashlib.sha256(f"{namespace}/{name}/{c['name']}".encode()).hexdigest(),
                    "state": {"running": {"startedAt": started}},
                }
                for c in containers
            ],
            **(
                {"initContainerStatuses": [_completed(namespace, name, c, started) for c in init_containers]}
                if init_containers
                else {}
            ),
        },
    }


def _completed(namespace: str, pod: str, container: dict, started: str) -> dict:
    """An init container that ran to completion."""
    digest = hashlib.sha256(f"{namespace}/{pod}/{container['name']}".encode()).hexdigest()
    return {
        "name": container["name"],
        "ready": True,
        "restartCount": 0,
        "started": False,
        "image": container["image"],
        "imageID": _image_id(container["image"]),
        "containerID": "containerd://" + digest,
        "state": {
            "terminated": {
                "exitCode": 0,
                "reason": "Completed",
                "startedAt": started,
                "finishedAt": started,
                "containerID": "containerd://" + digest,
            }
        },
    }


def gpu_requests(pod: dict) -> dict[str, int]:
    """GPU extended resources a pod holds (requested in limits, contracts §7.3)."""
    held: dict[str, int] = {}
    for container in pod["spec"].get("containers", []):
        for resource, value in container.get("resources", {}).get("limits", {}).items():
            if is_gpu_resource(resource):
                held[resource] = held.get(resource, 0) + int(value)
    return held


def holds_gpu(pod: dict) -> bool:
    """Holds a GPU resource, or DRA devices through ResourceClaims (simulator/dra.py)."""
    held = bool(gpu_requests(pod)) or bool(pod["spec"].get("resourceClaims"))
    return pod["status"].get("phase") in ("Pending", "Running") and held


class DaemonSets:
    """The DaemonSet controller for the operator's DaemonSets: one pod per node whose deploy label is `true`."""

    def __init__(self, store: Store, seed: int):
        self._store = store
        self._seed = seed
        self._generation: dict[tuple[str, str], int] = {}
        self._names: set[str] = set()

    def export_state(self) -> dict:
        """The pod-name generations per DaemonSet and node: names stay unique across a restart."""
        return {f"{ds}/{node}": generation for (ds, node), generation in self._generation.items()}

    def restore(self, state: dict, pod_names: set[str]) -> None:
        self._generation = {tuple(key.split("/", 1)): generation for key, generation in state.items()}
        self._names = set(pod_names)

    def objects(self, node_count: int, mig_node_count: int) -> list[dict]:
        created = now_timestamp()
        result = []
        for spec in DAEMONSET_SPECS:
            desired = mig_node_count if spec.component == "mig-manager" else node_count
            result.append(
                {
                    "metadata": {
                        "name": spec.name,
                        "namespace": OPERATOR_NAMESPACE,
                        "labels": {"app": spec.name, "app.kubernetes.io/managed-by": "gpu-operator"},
                        "creationTimestamp": created,
                    },
                    "spec": {
                        "selector": {"matchLabels": {"app": spec.name}},
                        "template": {
                            "metadata": {"labels": {"app": spec.name}},
                            "spec": {
                                "nodeSelector": {DEPLOY_PREFIX + spec.component: "true"},
                                "containers": [{"name": c, "image": spec.image} for c in spec.containers],
                            },
                        },
                    },
                    "status": {
                        "desiredNumberScheduled": desired,
                        "currentNumberScheduled": desired,
                        "numberReady": desired,
                        "updatedNumberScheduled": desired,
                        "numberAvailable": desired,
                        "numberMisscheduled": 0,
                        "observedGeneration": 1,
                    },
                }
            )
        return result

    def pod(self, spec: DaemonSetSpec, node: dict) -> dict:
        node_name = node["metadata"]["name"]
        while True:  # 5-letter suffixes collide now and then; the real controller retries with a new one too
            generation = self._generation.get((spec.name, node_name), 0)
            self._generation[(spec.name, node_name)] = generation + 1
            name = f"{spec.name}-{suffix(self._seed, node_name, spec.name, generation)}"
            if name not in self._names:
                self._names.add(name)
                break
        ds = self._store.find(DAEMONSETS, OPERATOR_NAMESPACE, spec.name)
        host_ip = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
        extra = {}
        if spec.name == EXPORTER:  # on the pod network: no hostNetwork, no hostPort
            extra = _EXPORTER_CONTAINER
            digest = hashlib.sha256(name.encode()).digest()
            pod_ip = f"10.244.{digest[0]}.{digest[1] % 253 + 2}"
        else:
            pod_ip = host_ip
        return pod_object(
            name=name,
            namespace=OPERATOR_NAMESPACE,
            node=node_name,
            containers=[{"name": c, "image": spec.image, **extra} for c in spec.containers],
            labels={"app": spec.name, "controller-revision-hash": spec.revision},
            owner={
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "name": spec.name,
                "uid": ds["metadata"]["uid"] if ds else "",
                "controller": True,
                "blockOwnerDeletion": True,
            },
            priority_class="system-node-critical",
            priority=2000001000,
            host_ip=host_ip,
            pod_ip=pod_ip,
            tolerations=DAEMONSET_TOLERATIONS,
        )

    def desired_specs(self, node: dict) -> list[DaemonSetSpec]:
        labels = node["metadata"].get("labels", {})
        return [spec for spec in DAEMONSET_SPECS if labels.get(DEPLOY_PREFIX + spec.component) == "true"]

    def pod_on(self, app: str, node: str) -> dict | None:
        """The pod of DaemonSet `app` on the node (by its owner: labels may be edited behind the operator's back)."""
        return next(
            (
                pod
                for pod in self._store.indexed(PODS, node)
                if pod["metadata"]["namespace"] == OPERATOR_NAMESPACE
                and (pod["metadata"].get("ownerReferences") or [{}])[0].get("name") == app
            ),
            None,
        )

    def sync(self, node_name: str) -> None:
        """Create missing and delete unwanted operator pods on a node, after its deploy labels changed."""
        node = self._store.find(NODES, "", node_name)
        if node is None:
            return
        wanted = {spec.name for spec in self.desired_specs(node)}
        for spec in DAEMONSET_SPECS:
            existing = self.pod_on(spec.name, node_name)
            if spec.name in wanted and existing is None:
                self._store.create(PODS, self.pod(spec, node))
            elif spec.name not in wanted and existing is not None:
                self._store.delete(PODS, OPERATOR_NAMESPACE, existing["metadata"]["name"])


class Workload:
    """User pods holding GPUs: Jobs in ml-training, ReplicaSets in inference, notebooks and Jobs in research."""

    def __init__(self, store: Store, seed: int):
        self._store = store
        self._seed = seed
        self._random = random.Random(f"{seed}:workload")
        self._serial = 0
        self._names: set[str] = set()

    def export_state(self) -> dict:
        """Where the seeded draws and the name serial stand: pods added after a restart are new ones."""
        return {"serial": self._serial, "random": self._random.getstate()}

    def restore(self, state: dict, pod_names: set[str]) -> None:
        version, internal, gauss = state["random"]
        self._random.setstate((version, tuple(internal), gauss))
        self._serial = state["serial"]
        self._names = set(pod_names)

    def free_resources(self, node: dict) -> dict[str, int]:
        allocatable = {k: int(v) for k, v in node["status"].get("allocatable", {}).items() if is_gpu_resource(k)}
        for pod in self._store.indexed(PODS, node["metadata"]["name"]):
            if holds_gpu(pod):
                for resource, count in gpu_requests(pod).items():
                    allocatable[resource] = allocatable.get(resource, 0) - count
        return {k: v for k, v in allocatable.items() if v > 0}

    def make_pod(
        self,
        node: dict,
        resource: str,
        count: int = 1,
        *,
        namespace: str | None = None,
        controller: str = "auto",
        protected: bool = False,
        age: timedelta = timedelta(0),
    ) -> dict:
        """A workload pod on `node` holding `count` of `resource`; `controller` is Job, ReplicaSet, none or auto."""
        rng = self._random
        namespace = namespace or rng.choice(WORKLOAD_NAMESPACES)
        if controller == "auto":
            bare = namespace == "research" and rng.random() < 0.3  # notebooks without a controller need --force
            controller = "none" if bare else "ReplicaSet" if namespace == "inference" else "Job"
        started = (datetime.now(UTC) - age).strftime("%Y-%m-%dT%H:%M:%SZ")
        name, labels, owner = self._identity(controller)
        if owner:
            owner.update(uid=self._store.new_uid(), controller=True, blockOwnerDeletion=True)
        if protected:
            labels[PROTECTED_LABEL] = "true"
        qos = rng.choice(("Guaranteed", "Guaranteed", "Burstable", "Burstable", "BestEffort"))
        # The pod's own draws (shape, tolerations) come from a generator of its name, so the fleet's sequence of
        # pods, nodes and IPs stays what it was before pods had them.
        shape = random.Random(f"{self._seed}:shape:{name}")
        image = "nvcr.io/nvidia/pytorch:25.01-py3" if controller == "Job" else "nvcr.io/nvidia/tritonserver:25.01-py3"
        containers, init_containers = _containers(qos, resource, count, image, shape)
        priority_class, priority = PRIORITY_CLASSES.get(namespace, (None, 0))
        if namespace == "research" and shape.random() < 0.4:
            priority_class, priority = RESEARCH_PRIORITY
        volumes = [{"name": "scratch", "emptyDir": {}}] if controller == "Job" else None
        host_ip = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
        return pod_object(
            name=name,
            namespace=namespace,
            node=node["metadata"]["name"],
            containers=containers,
            labels=labels,
            owner=owner,
            priority_class=priority_class,
            priority=priority,
            volumes=volumes,
            host_ip=host_ip,
            pod_ip=f"10.244.{rng.randint(0, 255)}.{rng.randint(2, 254)}",
            started=started,
            init_containers=init_containers,
            tolerations=_tolerations(namespace, shape),
        )

    def _identity(self, controller: str) -> tuple[str, dict[str, str], dict | None]:
        """A fresh pod name (never reused), its labels and owner, shaped as the owning controller names pods."""
        while True:
            self._serial += 1
            owner = None
            if controller == "Job":
                job = f"train-{suffix(self._seed, 'job', self._serial, length=6)}"
                name = f"{job}-{suffix(self._seed, 'pod', self._serial)}"
                labels = {"job-name": job, "batch.kubernetes.io/job-name": job}
                owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job}
            elif controller == "ReplicaSet":
                app = self._random.choice(("llm-serving", "embeddings", "vision-api", "asr"))
                template_hash = suffix(self._seed, app, length=10)
                name = f"{app}-{template_hash}-{suffix(self._seed, 'pod', self._serial)}"
                labels = {"app": app, "pod-template-hash": template_hash}
                owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{app}-{template_hash}"}
            else:
                name = f"notebook-{suffix(self._seed, 'nb', self._serial, length=6)}"
                labels = {"app": "notebook"}
            if name not in self._names:
                self._names.add(name)
                return name, labels, owner

    def place(self, count: int, nodes: list[dict]) -> list[dict]:
        """Up to `count` pods on random Ready nodes with free GPU resources (seeded choices)."""
        rng = self._random
        candidates = [n for n in nodes if _is_ready(n) and not n["spec"].get("unschedulable")]
        placed: list[dict] = []
        free = {n["metadata"]["name"]: self.free_resources(n) for n in candidates}
        attempts = 0
        while len(placed) < count and candidates and attempts < count * 4:
            attempts += 1
            node = rng.choice(candidates)
            available = free[node["metadata"]["name"]]
            if not available:
                continue
            resource = rng.choice(sorted(available))
            if resource.startswith("nvidia.com/mig-"):
                wanted = 1
            else:
                wanted = min(available[resource], rng.choice((1, 1, 2, 4, 8)))
            available[resource] -= wanted
            if available[resource] <= 0:
                del available[resource]
            placed.append(self.make_pod(node, resource, wanted, age=timedelta(minutes=rng.randint(1, 5000))))
        return placed

    def add(self, count: int) -> list[str]:
        pods = self.place(count, self._store.objects(NODES))
        for pod in pods:
            self._store.create(PODS, pod)
        return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods]

    def remove(self, count: int) -> list[str]:
        workload = [
            (p["metadata"]["namespace"], p["metadata"]["name"])
            for p in self._store.objects(PODS)
            if p["metadata"]["namespace"] in WORKLOAD_NAMESPACES
        ]
        chosen = self._random.sample(sorted(workload), min(count, len(workload)))
        for namespace, name in chosen:
            self._store.delete(PODS, namespace, name)
        return [f"{namespace}/{name}" for namespace, name in chosen]


def _containers(qos: str, resource: str, count: int, image: str, rng: random.Random) -> tuple[list, list]:
    """Containers and init containers of a workload pod of this QoS class, in the shapes real manifests take:
    Guaranteed with requests equal to limits (some written as limits only, some with a sidecar or an init container
    sized alike); Burstable with requests only, requests below limits, only a memory limit, or a Guaranteed main
    container whose init container has no resources; BestEffort with the GPU alone."""
    gpu = {resource: str(count)}
    cpu, memory = rng.choice(((str(8 * count), f"{64 * count}Gi"), (f"{7500 * count}m", f"{61440 * count}Mi")))
    main: dict = {"name": "main", "image": image}
    init: list[dict] = []
    variant = rng.random()
    if qos == "Guaranteed":
        sized = {"cpu": cpu, "memory": memory}
        main["resources"] = (
            {"limits": {**sized, **gpu}} if variant < 0.3 else {"requests": sized, "limits": {**sized, **gpu}}
        )
        containers = [main]
        if 0.5 <= variant < 0.75:
            small = {"cpu": "500m", "memory": "512Mi"}
            containers.append(
                {
                    "name": "metrics",
                    "image": "prom/statsd-exporter:v0.28.0",
                    "resources": {"requests": small, "limits": dict(small)},
                }
            )
        elif variant >= 0.75:
            fetch = {"cpu": "1", "memory": "4Gi"}
            init.append(
                {
                    "name": "fetch-weights",
                    "image": "busybox:1.36",
                    "resources": {"requests": fetch, "limits": dict(fetch)},
                }
            )
        return containers, init
    if qos == "Burstable":
        if variant < 0.4:
            main["resources"] = {"requests": {"cpu": cpu, "memory": memory}, "limits": dict(gpu)}
        elif variant < 0.65:
            main["resources"] = {
                "requests": {"cpu": str(4 * count), "memory": f"{32 * count}Gi"},
                "limits": {"cpu": cpu, "memory": memory, **gpu},
            }
        elif variant < 0.85:
            main["resources"] = {"limits": {"memory": memory, **gpu}}
        else:  # the main container is sized like a Guaranteed one, but the init container is not
            main["resources"] = {
                "requests": {"cpu": cpu, "memory": memory},
                "limits": {"cpu": cpu, "memory": memory, **gpu},
            }
            init.append({"name": "prepare", "image": "busybox:1.36"})
        return [main], init
    main["resources"] = {"limits": dict(gpu)}
    if variant < 0.2:
        init.append({"name": "prepare", "image": "busybox:1.36"})
    return [main], init


def _tolerations(namespace: str, rng: random.Random) -> list[dict]:
    """The default tolerations, and for some pods one of Tessera's pool taints (contracts §7.3 QoS policies)."""
    tolerations = list(DEFAULT_TOLERATIONS)
    draw = rng.random()
    pool = {"inference": "inference", "ml-training": "training"}.get(namespace)
    if pool and draw < 0.5:
        tolerations.append({"key": POOL_TAINT_KEY, "operator": "Equal", "value": pool, "effect": "NoSchedule"})
    elif namespace == "research" and draw < 0.3:
        tolerations.append({"key": POOL_TAINT_KEY, "operator": "Exists"})
    if rng.random() < 0.5:
        tolerations.append({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
    return tolerations


def check_eviction(pod: dict, refused_by_fault: bool) -> None:
    """Refuse like a PodDisruptionBudget would: 429 TooManyRequests with a DisruptionBudget cause."""
    protected = pod["metadata"].get("labels", {}).get(PROTECTED_LABEL) == "true"
    if protected or refused_by_fault:
        budget = f"{pod['metadata']['name']}-pdb"
        raise ApiError.too_many_requests(
            "Cannot evict pod as it would violate the pod's disruption budget.",
            [
                {
                    "reason": "DisruptionBudget",
                    "message": f"The disruption budget {budget} needs 1 healthy pods and has 1 currently",
                }
            ],
        )


def _is_ready(node: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))
