"""The Kubernetes driver: node labels and ConfigMaps read by NVIDIA's GPU Operator (ARCHITECTURE §4).

Every method takes a batch and fans the HTTP calls out over a small thread pool (no ORM in those threads);
per-node failures come back as texts, a batch-wide failure as DriverError. Writes are JSON merge patches of
exactly the fields Tessera owns, retried with backoff on 409/429/5xx and broken connections.
"""

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fleet.services import cluster_record_contact
from sharing.dra import DRIVER as DRA_DRIVER
from sharing.dra import HELM_PLUGIN_SELECTOR, OPERATOR_PLUGIN_SELECTOR, newest_complete, pool_resources
from sharing.nvidia_import import ClusterConfigs
from worker.drivers.base import BusyPod, DriverError, NodeState, NodeTarget
from worker.drivers.kubernetes.api import (
    MERGE_PATCH,
    api_client,
    call,
    error_text,
    is_transient,
    list_all,
    parallel,
    read_json,
    status_message,
)
from worker.drivers.kubernetes.labels import (
    GPU_NODE_SELECTOR,
    MANAGED,
    MIG_CONFIG,
    MIG_STATE,
    MIG_STATES,
    PLUGIN_CONFIG,
    gpu_allocatable,
    holds_gpu,
    instant,
    node_labels,
    pod_gpu_resources,
)
from worker.drivers.kubernetes.operator import HealthReport, Operator

log = logging.getLogger(__name__)

MIG_MANAGER_APP = "nvidia-mig-manager"
# Above this many nodes one paginated list beats a GET per node (measured: bench/b3_rollout.py, README).
LIST_THRESHOLD = 200
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


class KubernetesDriver:
    """One cluster's API server, through the official `kubernetes` client."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.api = api_client(cluster)
        self.core = client.CoreV1Api(self.api)
        self.namespace = cluster.operator_namespace
        self.operator = Operator(self.api, self.namespace, cluster.name)

    # -- configs ------------------------------------------------------------------------------------------------------

    def ensure_configs(self, *, mig_configs: Mapping[str, str], device_plugin_configs: Mapping[str, str]) -> None:
        """Write missing content-addressed configs into Tessera's ConfigMaps and confirm them before returning."""
        try:
            self.operator.ensure(mig_configs=dict(mig_configs), plugin_configs=dict(device_plugin_configs))
        except DriverError as exc:
            cluster_record_contact(self.cluster, str(exc), reached=True)
            raise
        except Exception as exc:
            text = f"{self.cluster.name}: {error_text(exc)}"
            cluster_record_contact(self.cluster, text, reached=False)
            raise DriverError(text, transient=is_transient(exc)) from None
        if self.cluster.connection_state != "ok":
            # Configs written: whatever was wrong may be fixed; the full check decides (a problem of the other
            # ConfigMap, not needed here, must not be cleared by this success).
            report = self.operator.health()
            cluster_record_contact(self.cluster, report.problem, reached=report.reachable)

    def health(self) -> HealthReport:
        return self.operator.health()

    def nvidia_configs(self) -> ClusterConfigs:
        """Read only: the GPU Operator's own configs and the nodes' labels, for an import (see Operator)."""
        try:
            return self.operator.nvidia_configs()
        except DriverError:
            raise
        except Exception as exc:
            raise DriverError(f"{self.cluster.name}: {error_text(exc)}", transient=is_transient(exc)) from None

    def adopt_operator_configs(self, **names) -> list[str]:
        """Point the ClusterPolicy at Tessera-managed ConfigMaps (seeded with what nodes use now); see Operator."""
        return self.operator.adopt(**names)

    # -- pods ---------------------------------------------------------------------------------------------------------

    def _pods_by_node(self, node_names: Sequence[str]) -> dict[str, list[dict]]:
        """Live pods per node that may hold GPUs: one `spec.nodeName` list per node for a few nodes (as kubectl
        drain does), the cluster-wide candidate lists for many."""
        wanted = {name: [] for name in node_names}
        if len(wanted) > LIST_THRESHOLD:
            for pod in candidate_pods(self.core, self.namespace):
                node = (pod.get("spec") or {}).get("nodeName")
                if node in wanted:
                    wanted[node].append(pod)
            return wanted
        for node, page, error in parallel(
            lambda n: read_json(self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={n},{LIVE_PODS}"),
            list(wanted),
        ):
            if error is not None:
                raise DriverError(f"listing pods on {node}: {error_text(error)}", transient=is_transient(error))
            wanted[node] = page.get("items") or []
        return wanted

    def busy_pods(self, node_names: Sequence[str]) -> dict[str, list[BusyPod]]:
        """Live pods holding nvidia.com/gpu* or nvidia.com/mig-*, or devices through ResourceClaims allocated to them
        (a DRA node; any driver's claims count, to be safe); the operator's own DaemonSet pods excluded."""
        busy = {}
        for node, pods in self._pods_by_node(node_names).items():
            holding = [
                BusyPod(p["metadata"]["namespace"], p["metadata"]["name"], pod_gpu_resources(p))
                for p in pods
                if holds_gpu(p, self.namespace) or _holds_claims(p)
            ]
            if holding:
                busy[node] = sorted(holding, key=lambda b: (b.namespace, b.name))
        return busy

    def evict(self, pods: Mapping[str, Sequence[BusyPod]]) -> dict[str, list[str]]:
        """POST an Eviction per pod; a PodDisruptionBudget's 429 is reported for the next step to retry."""
        work = [(node, pod) for node, node_pods in pods.items() for pod in node_pods]

        def evict_one(item):
            _, pod = item
            body = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": pod.name, "namespace": pod.namespace},
            }
            call(
                self.core.create_namespaced_pod_eviction,
                pod.name,
                pod.namespace,
                body,
                retry_if=lambda exc: is_transient(exc) and getattr(exc, "status", None) != 429,
            )

        refused: dict[str, list[str]] = {}
        for (node, pod), _, error in parallel(evict_one, work):
            if error is None or getattr(error, "status", None) == 404:
                continue  # evicted, or already gone
            key = f"{pod.namespace}/{pod.name}"
            if getattr(error, "status", None) == 429:
                why = "PodDisruptionBudget" if "disruption budget" in status_message(error).lower() else "throttled"
                text = f"eviction of {key} refused ({why}), retrying"
            else:
                text = f"eviction of {key} failed: {error_text(error)}"
            refused.setdefault(node, []).append(text)
        return refused

    # -- nodes --------------------------------------------------------------------------------------------------------

    def _patch_nodes(self, bodies: Mapping[str, dict]) -> dict[str, str]:
        """One JSON merge patch per node, concurrently; node -> error text for the ones that failed."""

        def patch(node):
            call(self.core.patch_node, node, bodies[node], _content_type=MERGE_PATCH)

        errors = {}
        for node, _, error in parallel(patch, list(bodies)):
            if error is not None:
                errors[node] = "node not found" if getattr(error, "status", None) == 404 else error_text(error)
        return errors

    def set_cordon(self, node_names: Sequence[str], cordoned: bool) -> dict[str, str]:
        """`spec.unschedulable` as kubectl cordon/uncordon leave it (uncordon removes the field)."""
        body = {"spec": {"unschedulable": True if cordoned else None}}
        return self._patch_nodes({name: body for name in node_names})

    def apply(self, targets: Sequence[NodeTarget]) -> dict[str, str]:
        """Select the configs by label; an empty plugin key removes the label (the ClusterPolicy default applies)."""
        bodies = {}
        for target in targets:
            labels = {PLUGIN_CONFIG: target.device_plugin_config or None, MANAGED: "true"}
            if target.mig_config:
                labels[MIG_CONFIG] = target.mig_config
            bodies[target.node_name] = {"metadata": {"labels": labels}}
        return self._patch_nodes(bodies)

    def read(self, node_names: Sequence[str]) -> dict[str, NodeState]:
        """Labels, allocatable and cordon of each node; a missing node reads as exists=False.

        Many nodes: one list of the nodes Tessera labelled (`tessera.io/managed=true`, what verification reads),
        then a GET for any name that list lacks. Few: a GET each."""
        names = list(dict.fromkeys(node_names))
        objects: dict[str, dict | None] = {}
        if len(names) > LIST_THRESHOLD:
            nodes, _ = list_all(self.core.list_node, label_selector=f"{GPU_NODE_SELECTOR},{MANAGED}=true", limit=1000)
            wanted = set(names)
            objects = {n["metadata"]["name"]: n for n in nodes if n["metadata"]["name"] in wanted}

        def get(name):
            try:
                return read_json(self.core.read_node, name)
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise

        for name, node, error in parallel(get, [n for n in names if n not in objects]):
            if error is not None:
                raise DriverError(f"reading node {name}: {error_text(error)}", transient=is_transient(error))
            objects[name] = node
        states = {name: node_state(name, objects[name]) for name in names}
        # A node advertising no GPU resource may be a DRA node: its pool says what it has (docs/nvidia-contracts §13).
        bare = [n for n, st in states.items() if st.exists and not any(int(v) for v in st.allocatable.values())]
        for name, found, error in parallel(self._dra_state, bare):
            if error is not None:
                raise DriverError(f"reading {name}'s DRA pool: {error_text(error)}", transient=is_transient(error))
            if found is not None:
                hardware = gfd_resources(node_labels(objects[name]))
                states[name] = replace(
                    states[name], allocatable=found[0], dra_plugin_started_at=found[1], dra_hardware=hardware
                )
        return states

    def _dra_state(self, node_name: str) -> tuple[dict[str, int], object] | None:
        """(the pool's devices as resources, when its kubelet plugin started) of a DRA node; None for another node."""
        pods = self._dra_plugin_pods(node_name)
        try:
            page = read_json(
                client.ResourceV1Api(self.core.api_client).list_resource_slice,
                field_selector=f"spec.nodeName={node_name},spec.driver={DRA_DRIVER}",
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            page = {}
        pool = next(iter(newest_complete(page.get("items") or []).values()), [])
        if not pool and not pods:
            return None
        started = max(filter(None, (instant((p.get("status") or {}).get("startTime")) for p in pods)), default=None)
        return pool_resources(pool), started

    def _dra_plugin_pods(self, node_name: str) -> list[dict]:
        pods = []
        for selector in (HELM_PLUGIN_SELECTOR, OPERATOR_PLUGIN_SELECTOR):
            page = read_json(
                self.core.list_pod_for_all_namespaces,
                label_selector=selector,
                field_selector=f"spec.nodeName={node_name}",
            )
            pods += page.get("items") or []
        return pods

    def restart_dra_plugin(self, node_name: str) -> None:
        """Delete the node's gpu.nvidia.com kubelet-plugin pod; its DaemonSet starts a new one, which discovers the
        GPUs' MIG devices again and republishes the pool (§13.1, 13.2)."""
        pods = self._dra_plugin_pods(node_name)
        if not pods:
            raise DriverError(f"no gpu.nvidia.com kubelet-plugin pod runs on {node_name}")
        for pod in pods:
            meta = pod["metadata"]
            try:
                call(self.core.delete_namespaced_pod, meta["name"], meta["namespace"])
            except ApiException as exc:
                if exc.status != 404:
                    raise DriverError(f"restarting the DRA plugin on {node_name}: {error_text(exc)}") from None

    def restart_config_manager(self, node_name: str) -> None:
        """Delete the node's mig-manager pod; its DaemonSet recreates it and the new pod re-reads the label."""
        page = read_json(
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=f"app={MIG_MANAGER_APP}",
            field_selector=f"spec.nodeName={node_name}",
        )
        pods = page.get("items") or []
        if not pods:
            raise DriverError(f"no {MIG_MANAGER_APP} pod runs on {node_name} (namespace {self.namespace})")
        for pod in pods:
            try:
                call(self.core.delete_namespaced_pod, pod["metadata"]["name"], self.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise DriverError(f"restarting {MIG_MANAGER_APP} on {node_name}: {error_text(exc)}") from None


def _holds_claims(pod: dict) -> bool:
    """A live pod the scheduler gave ResourceClaims (from templates, named claims or the extended-resource path)."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return False
    return bool(status.get("resourceClaimStatuses") or status.get("extendedResourceClaimStatus"))


def gfd_resources(labels: Mapping[str, str]) -> dict[str, int]:
    """GFD's counts as resources: `nvidia.com/mig-<profile>.count` per MIG profile, else `nvidia.com/gpu.count`
    (contracts §3.6)."""
    counts = {
        key.removesuffix(".count"): int(value)
        for key, value in labels.items()
        if key.startswith("nvidia.com/mig-") and key.endswith(".count") and value.isdigit() and int(value)
    }
    if counts:
        return counts
    whole = labels.get("nvidia.com/gpu.count", "")
    return {"nvidia.com/gpu": int(whole)} if whole.isdigit() and int(whole) else {}


def candidate_pods(core: client.CoreV1Api, namespace: str) -> list[dict]:
    """Every live pod of the cluster that could hold a GPU, leaving out server-side what never counts: the GPU
    Operator's DaemonSet pods, most pods of a GPU cluster. Two lists: pods outside the operator's namespace, and
    pods inside it that no DaemonSet (or StatefulSet) controls (no `controller-revision-hash` label)."""
    outside, _ = list_all(
        core.list_pod_for_all_namespaces, limit=2000, field_selector=f"metadata.namespace!={namespace},{LIVE_PODS}"
    )
    not_daemon_pods = "!controller-revision-hash"
    inside, _ = list_all(
        core.list_namespaced_pod, namespace, limit=2000, label_selector=not_daemon_pods, field_selector=LIVE_PODS
    )
    return outside + inside


def node_state(name: str, node: dict | None) -> NodeState:
    """NodeState from a Node object (raw JSON)."""
    if node is None:
        return NodeState(node_name=name, exists=False)
    labels = node_labels(node)
    state = labels.get(MIG_STATE, "unknown")
    return NodeState(
        node_name=name,
        mig_config=labels.get(MIG_CONFIG, ""),
        mig_state=state if state in MIG_STATES else "unknown",
        device_plugin_config=labels.get(PLUGIN_CONFIG, ""),
        allocatable=gpu_allocatable(node),
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
    )
