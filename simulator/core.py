"""The simulator as one object: fleet, store, operator, workload and the HTTPS server, started and stopped together."""

from __future__ import annotations

import gc
import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from simulator import admission, metrics, nodes, tls
from simulator.errors import ApiError
from simulator.faults import Faults
from simulator.fleet import SimNode, generate_node
from simulator.operator import DEFAULT_MIG_CONFIGMAP, DEVICE_PLUGIN, MIG_MANAGER, GpuOperator, cluster_policy
from simulator.resources import (
    CLUSTER_POLICIES,
    CONFIGMAPS,
    DAEMONSETS,
    NAMESPACES,
    NODES,
    PODS,
    VALIDATING_ADMISSION_POLICIES,
    VALIDATING_ADMISSION_POLICY_BINDINGS,
)
from simulator.server import ApiServer
from simulator.serviceaccounts import ServiceAccountTokens
from simulator.store import Store
from simulator.workload import OPERATOR_NAMESPACE, WORKLOAD_NAMESPACES, DaemonSets, Workload

NAMESPACE_NAMES = ("default", "kube-system", "kube-public", OPERATOR_NAMESPACE, *WORKLOAD_NAMESPACES)


@dataclass
class SimulatorConfig:
    nodes: int = 20
    seed: int = 1
    host: str = "127.0.0.1"
    port: int = 0  # 0 = any free port
    kubeconfig_path: str | None = None  # default: <state dir>/kubeconfig
    state_dir: str | None = None  # certificate and kubeconfig; default: a temporary directory removed on stop
    token: str | None = None  # default: random
    apply_delay: float = 1.0
    latency_ms: float = 0.0
    error_rate: float = 0.0
    write_error_rate: float = 0.0
    workload_pods: int | None = None  # default: half the node count
    mig_strategy: str = "mixed"
    mig_config_source: str = "generated"  # or "static": ClusterPolicy names default-mig-parted-config
    watch_history: int = 10000
    log_requests: bool = False
    faults: dict = field(default_factory=dict)  # any other knob, as in `POST /_sim/faults`


class Simulator:
    """An emulated Kubernetes API server over HTTPS, with NVIDIA's GPU Operator running on a seeded fleet."""

    def __init__(self, config: SimulatorConfig | None = None, **overrides):
        self.config = config or SimulatorConfig(**overrides)
        if config is not None and overrides:
            raise TypeError("pass either a SimulatorConfig or keyword overrides, not both")
        cfg = self.config
        if cfg.mig_strategy not in ("single", "mixed"):
            raise ValueError(f"mig strategy must be single or mixed, not {cfg.mig_strategy!r}")
        if cfg.mig_config_source not in ("generated", "static"):
            raise ValueError(f"mig config source must be generated or static, not {cfg.mig_config_source!r}")
        self.token = cfg.token or secrets.token_urlsafe(24)
        self.faults = Faults(
            latency_ms=float(cfg.latency_ms),
            error_rate=float(cfg.error_rate),
            write_error_rate=float(cfg.write_error_rate),
            apply_delay=float(cfg.apply_delay),
        )
        self.faults.seed(cfg.seed)
        self.faults.update(cfg.faults)
        self.store = Store(seed=cfg.seed, history_size=cfg.watch_history)
        self.nodes: dict[str, SimNode] = {}
        self.daemonsets = DaemonSets(self.store, cfg.seed)
        self.workload = Workload(self.store, cfg.seed)
        self.service_account_tokens = ServiceAccountTokens()
        self.operator: GpuOperator | None = None
        self.url = ""
        self.kubeconfig_path = ""
        self.ca_path = ""
        self.startup_seconds = 0.0
        self._server: ApiServer | None = None
        self._server_thread: threading.Thread | None = None
        self._temp_dir: str | None = None

    # -- lifecycle ------------------------------------------------------------------------------------------

    def start(self) -> Simulator:
        started = time.perf_counter()
        self._populate()
        cfg = self.config
        state_dir = Path(cfg.state_dir or tempfile.mkdtemp(prefix="tessera-sim-"))
        if cfg.state_dir is None:
            self._temp_dir = str(state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        cert, key = tls.create_certificate(state_dir, cfg.host)
        self._server = ApiServer((cfg.host, cfg.port), self, tls.server_context(cert, key))
        port = self._server.server_address[1]
        self.url = f"https://{cfg.host}:{port}"
        self.ca_path = str(cert)
        self.kubeconfig_path = cfg.kubeconfig_path or str(state_dir / "kubeconfig")
        tls.write_kubeconfig(Path(self.kubeconfig_path), self.url, cert, self.token)
        self.operator.start()
        self._server_thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="sim-api", daemon=True
        )
        self._server_thread.start()
        self.startup_seconds = time.perf_counter() - started
        return self

    def stop(self) -> None:
        if self._server is not None:
            self.store.close()
            self._server.shutdown()
            self._server.close_all()
            self._server.server_close()
            self._server = None
        if self.operator is not None:
            self.operator.stop()
        if self._temp_dir:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None

    def __enter__(self) -> Simulator:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _populate(self) -> None:
        """Build the fleet with the cyclic collector off: it would rescan ~10^6 young objects many times over."""
        gc.disable()
        try:
            self._build()
        finally:
            gc.enable()

    def _build(self) -> None:
        cfg = self.config
        now = datetime.now(UTC)
        self.nodes = {node.name: node for node in (generate_node(cfg.seed, i) for i in range(cfg.nodes))}
        self.operator = GpuOperator(self.store, self.nodes, self.faults, self.daemonsets)
        mig_configmap = DEFAULT_MIG_CONFIGMAP if cfg.mig_config_source == "static" else ""
        policy = cluster_policy(mig_configmap, cfg.mig_strategy)
        node_objects = {}
        for name, node in self.nodes.items():
            obj = nodes.node_object(node, now)
            if node.cordoned:
                obj["spec"]["unschedulable"] = True
                nodes.normalize(None, obj)
            if not node.ready:
                nodes.set_ready(obj, False)
            node_objects[name] = obj
        configmaps = self.operator.bootstrap(node_objects, policy)

        store = self.store
        store.add_index(PODS, lambda pod: pod["spec"].get("nodeName"))
        store.set_normalizer(NODES, nodes.normalize)
        store.set_normalizer(CONFIGMAPS, _immutable_configmap)
        store.set_normalizer(VALIDATING_ADMISSION_POLICIES, admission.normalize_policy)
        store.set_normalizer(VALIDATING_ADMISSION_POLICY_BINDINGS, admission.normalize_binding)
        store.load(NAMESPACES, [{"metadata": {"name": n}, "status": {"phase": "Active"}} for n in NAMESPACE_NAMES])
        store.load(CLUSTER_POLICIES, [policy])
        store.load(CONFIGMAPS, configmaps)
        store.load(NODES, list(node_objects.values()))
        mig_nodes = sum(1 for node in self.nodes.values() if node.product.mig_capable)
        store.load(DAEMONSETS, self.daemonsets.objects(len(self.nodes), mig_nodes))
        store.load(
            PODS,
            [
                self.daemonsets.pod(spec, obj)
                for obj in node_objects.values()
                for spec in self.daemonsets.desired_specs(obj)
            ],
        )
        count = cfg.workload_pods if cfg.workload_pods is not None else cfg.nodes // 2
        store.load(PODS, self.workload.place(count, store.objects(NODES)))
        store.add_listener(self.operator.on_change)

    # -- Python API (tests, benchmarks, the control endpoint) ------------------------------------------------

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def node(self, name: str) -> dict:
        return self.store.get(NODES, "", name).obj

    def find_nodes(self, *, mig_capable: bool | None = None, idle: bool | None = None, ready: bool = True) -> list[str]:
        """Node names by capability and by whether any user pod is on them (for tests picking a node)."""
        found = []
        for name, node in self.nodes.items():
            if mig_capable is not None and node.product.mig_capable != mig_capable:
                continue
            if ready and (not node.ready or self.node(name)["spec"].get("unschedulable")):
                continue
            if idle is not None:
                busy = any(p["metadata"]["namespace"] != OPERATOR_NAMESPACE for p in self.store.indexed(PODS, name))
                if busy == idle:
                    continue
            found.append(name)
        return found

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until the operator has nothing queued or scheduled (wedged nodes count as settled)."""
        return self.operator.settle(timeout)

    def restart_mig_manager(self, node: str) -> None:
        self._require_node(node)
        self.operator.restart(node, MIG_MANAGER)

    def restart_device_plugin(self, node: str) -> None:
        self._require_node(node)
        self.operator.restart(node, DEVICE_PLUGIN)

    def set_ready(self, node: str, ready: bool) -> None:
        self._require_node(node)
        self.nodes[node].ready = ready
        self.store.mutate(NODES, "", node, lambda obj: nodes.set_ready(obj, ready))

    def kubelet_configz(self, node: str) -> dict:
        """The node's kubelet configuration as `/api/v1/nodes/<node>/proxy/configz` serves it; 503 when NotReady."""
        sim_node = self._require_node(node)
        if not sim_node.ready:
            raise ApiError(
                503,
                "ServiceUnavailable",
                f"error trying to reach service: dial tcp {sim_node.internal_ip}:10250: connect: connection refused",
            )
        return nodes.kubelet_configz(sim_node)

    def set_kubelet_config(self, node: str, **changes: str) -> dict[str, str]:
        """Change what a node's kubelet runs (topologyManagerPolicy, topologyManagerScope, cpuManagerPolicy,
        memoryManagerPolicy), as an admin editing its config and restarting it would; returns the new settings."""
        sim_node = self._require_node(node)
        sim_node.kubelet = {**sim_node.kubelet, **nodes.check_kubelet_settings(changes)}
        return dict(sim_node.kubelet)

    def add_pod(self, node: str, resource: str = "nvidia.com/gpu", count: int = 1, **options) -> dict:
        """Place one workload pod on `node` (options: namespace, controller, protected) regardless of capacity."""
        return self.store.create(PODS, self.workload.make_pod(self.node(node), resource, count, **options))

    def add_workload(self, count: int) -> list[str]:
        return self.workload.add(count)

    def remove_workload(self, count: int) -> list[str]:
        return self.workload.remove(count)

    def metrics_text(self, node: str | None = None) -> str:
        """dcgm-exporter output for one node or all nodes whose exporter pod is running."""
        names = [node] if node else list(self.nodes)
        strategy = self.store.find(CLUSTER_POLICIES, "", "cluster-policy")["spec"]["mig"]["strategy"]
        now = time.time()
        samples = []
        for name in names:
            sim_node = self._require_node(name)
            pods = self.store.indexed(PODS, name)
            if not sim_node.ready or self.daemonsets.pod_on("nvidia-dcgm-exporter", name) is None:
                continue  # no exporter is running there (NotReady, or paused for a MIG change)
            xid = {gpu.index: self.faults.injected_xid(name, gpu.index) for gpu in sim_node.gpus}
            samples += metrics.node_samples(sim_node, pods, strategy, self.config.seed, now, xid)
        return "".join(metrics.render(samples))

    def state(self, node: str | None = None) -> dict:
        if node:
            self._require_node(node)
            return {"node": node, **self.operator.describe(node)}
        states: dict[str, int] = {}
        for obj in self.store.objects(NODES):
            value = obj["metadata"].get("labels", {}).get("nvidia.com/mig.config.state", "none")
            states[value] = states.get(value, 0) + 1
        return {
            "url": self.url,
            "nodes": len(self.nodes),
            "gpus": sum(len(n.gpus) for n in self.nodes.values()),
            "pods": len(self.store.objects(PODS)),
            "resource_version": self.store.resource_version,
            "mig_config_states": states,
            "faults": self.faults.as_dict(),
            "startup_seconds": round(self.startup_seconds, 3),
        }

    def _require_node(self, name: str) -> SimNode:
        if name not in self.nodes:
            raise ApiError.not_found("nodes", name)
        return self.nodes[name]


def _immutable_configmap(old: dict | None, new: dict) -> None:
    """`immutable: true` ConfigMaps refuse data changes, as the real API server validates."""
    if old is None or not old.get("immutable"):
        return
    if any(old.get(field) != new.get(field) for field in ("data", "binaryData", "immutable")):
        raise ApiError.invalid(
            "configmaps", old["metadata"]["name"], "data: Forbidden: field is immutable when `immutable` is set"
        )
