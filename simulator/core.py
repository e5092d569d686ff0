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
from simulator.dra import PLUGIN_NAMESPACE, Dra
from simulator.errors import ApiError
from simulator.faults import Faults
from simulator.fleet import SimNode, generate_node
from simulator.kueue import Kueue
from simulator.operator import DEVICE_PLUGIN, MIG_MANAGER, GpuOperator
from simulator.operator_objects import DEFAULT_MIG_CONFIGMAP, cluster_policy
from simulator.persist import Persister, Snapshot, Start, StateFile, log
from simulator.resources import (
    ALL,
    CLUSTER_POLICIES,
    CONFIGMAPS,
    DAEMONSETS,
    NAMESPACES,
    NODES,
    PODS,
    SERVICES,
    VALIDATING_ADMISSION_POLICIES,
    VALIDATING_ADMISSION_POLICY_BINDINGS,
)
from simulator.server import ApiServer
from simulator.serviceaccounts import ServiceAccountTokens
from simulator.store import Store
from simulator.workload import EXPORTER, OPERATOR_NAMESPACE, WORKLOAD_NAMESPACES, DaemonSets, Workload, exporter_service

NAMESPACE_NAMES = ("default", "kube-system", "kube-public", OPERATOR_NAMESPACE, *WORKLOAD_NAMESPACES)


@dataclass
class SimulatorConfig:
    nodes: int = 20
    seed: int = 1
    host: str = "127.0.0.1"
    port: int = 0  # 0 = any free port
    kubeconfig_path: str | None = None  # default: <state dir>/kubeconfig
    # Certificate, kubeconfig, token and the cluster's saved state (simulator.persist); default: a temporary
    # directory removed on stop, and nothing is kept.
    state_dir: str | None = None
    fresh: bool = False  # ignore (and replace) the state saved in state_dir
    save_interval: float = 1.0  # seconds between a change and the state file's rewrite; 0: keep nothing
    token: str | None = None  # default: random
    apply_delay: float = 1.0
    latency_ms: float = 0.0
    error_rate: float = 0.0
    write_error_rate: float = 0.0
    workload_pods: int | None = None  # default: half the node count
    mig_strategy: str = "mixed"
    mig_config_source: str = "generated"  # or "static": ClusterPolicy names default-mig-parted-config
    # Nodes whose GPUs NVIDIA's DRA driver serves (its Helm chart beside the ClusterPolicy, device plugin off there):
    # none, mixed (every other node) or all (simulator/dra.py).
    dra_nodes: str = "none"
    watch_history: int = 10000
    log_requests: bool = False
    faults: dict = field(default_factory=dict)  # any other knob, as in `POST /_sim/faults`
    # dcgm-exporter: its host label (`hostname`; `Hostname` before the rename, contracts §10) and the counters a
    # custom CSV enables beyond the operator's default (e.g. DCGM_FI_DEV_ROW_REMAP_PENDING).
    dcgm_host_label: str = "hostname"
    dcgm_counters: list[str] = field(default_factory=list)


class Simulator:
    """An emulated Kubernetes API server over HTTPS, with NVIDIA's GPU Operator running on a seeded fleet."""

    def __init__(self, config: SimulatorConfig | None = None, **overrides):
        self.config = config or SimulatorConfig(**overrides)
        if config is not None and overrides:
            raise TypeError("pass either a SimulatorConfig or keyword overrides, not both")
        cfg = self.config
        if cfg.mig_strategy not in ("none", "single", "mixed"):
            raise ValueError(f"mig strategy must be none, single or mixed, not {cfg.mig_strategy!r}")
        if cfg.mig_config_source not in ("generated", "static"):
            raise ValueError(f"mig config source must be generated or static, not {cfg.mig_config_source!r}")
        if cfg.dra_nodes not in ("none", "mixed", "all"):
            raise ValueError(f"dra nodes must be none, mixed or all, not {cfg.dra_nodes!r}")
        if cfg.dcgm_host_label not in ("hostname", "Hostname"):
            raise ValueError(f"dcgm-exporter's host label is hostname or Hostname, not {cfg.dcgm_host_label!r}")
        unknown = set(cfg.dcgm_counters) - metrics.OPTIONAL_COUNTERS
        if unknown:
            raise ValueError(f"unknown dcgm counters {sorted(unknown)}; optional: {sorted(metrics.OPTIONAL_COUNTERS)}")
        self.dcgm_counters = metrics.DEFAULT_COUNTERS | set(cfg.dcgm_counters)
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
        self.kueue = Kueue(self.store)
        self.dra: Dra | None = None
        self.url = ""
        self.kubeconfig_path = ""
        self.ca_path = ""
        self.startup_seconds = 0.0
        self._server: ApiServer | None = None
        self._server_thread: threading.Thread | None = None
        self._temp_dir: str | None = None
        self._state_file: StateFile | None = None
        self._persister: Persister | None = None
        self.restored = False  # the cluster came from the state directory, not from the seed

    # -- lifecycle ------------------------------------------------------------------------------------------

    def start(self) -> Simulator:
        started = time.perf_counter()
        cfg = self.config
        state_dir = Path(cfg.state_dir or tempfile.mkdtemp(prefix="tessera-sim-"))
        if cfg.state_dir is None:
            self._temp_dir = str(state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        begin = None
        if cfg.state_dir is not None:
            self.token = cfg.token or tls.saved_token(state_dir, self.token)
            if cfg.save_interval > 0:
                self._state_file = StateFile(state_dir, self._fleet())
                begin = self._state_file.open(fresh=cfg.fresh)
        self._populate(begin)
        cert, key = tls.certificate(state_dir, cfg.host)
        self._server = ApiServer((cfg.host, cfg.port), self, tls.server_context(cert, key))
        port = self._server.server_address[1]
        self.url = f"https://{cfg.host}:{port}"
        self.ca_path = str(cert)
        self.kubeconfig_path = cfg.kubeconfig_path or str(state_dir / "kubeconfig")
        tls.write_kubeconfig(Path(self.kubeconfig_path), self.url, cert, self.token)
        self.operator.start()
        self.kueue.start()
        self.dra.start()
        if self.restored:
            self._report_restored(begin)
        if self._state_file is not None:
            self._persister = Persister(
                self._state_file, lambda: self.operator.call(self._collect, 60), cfg.save_interval
            )
            self.store.add_listener(self._persister.touch)
            self._persister.start()
            if not self.restored:
                self._persister.touch()  # a fresh fleet replaces whatever the directory held
        self._server_thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="sim-api", daemon=True
        )
        self._server_thread.start()
        self.startup_seconds = time.perf_counter() - started
        return self

    def stop(self) -> None:
        """Stop serving and the controllers (an apply in flight stays `pending`: it runs again at the next start), then
        write the state a last time, marked as a clean stop."""
        persister, self._persister = self._persister, None
        if persister is not None:
            persister.stop()
        if self._server is not None:
            self.store.close()
            self._server.shutdown()
            self._server.close_all()
            self._server.server_close()
            self._server = None
        if self.operator is not None:
            self.operator.stop()
        self.kueue.stop()
        if self.dra is not None:
            self.dra.stop()
        if persister is not None:
            self._state_file.write(self._collect(final=True), clean=True)
        if self._temp_dir:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None

    def __enter__(self) -> Simulator:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _populate(self, begin: Start | None) -> None:
        """Build the fleet with the cyclic collector off: it would rescan ~10^6 young objects many times over."""
        gc.disable()
        try:
            cfg = self.config
            self.nodes = {node.name: node for node in (generate_node(cfg.seed, i) for i in range(cfg.nodes))}
            self.operator = GpuOperator(self.store, self.nodes, self.faults, self.daemonsets)
            self.dra = Dra(self.store, self.nodes, self._dra_node_names(), cfg.seed)
            store = self.store
            self.dra.install()
            store.add_index(PODS, lambda pod: pod["spec"].get("nodeName"))
            store.set_normalizer(NODES, nodes.normalize)
            store.set_normalizer(CONFIGMAPS, _immutable_configmap)
            store.set_normalizer(VALIDATING_ADMISSION_POLICIES, admission.normalize_policy)
            store.set_normalizer(VALIDATING_ADMISSION_POLICY_BINDINGS, admission.normalize_binding)
            if begin is not None and begin.document is not None:
                self._restore(begin)
            else:
                store.start_at(begin.resource_version if begin else 0)
                self._seed_fleet()
            self.dra.resume()
            store.add_listener(self.operator.on_change)
            store.add_listener(self.kueue.on_change)
            store.add_listener(self.dra.on_change)
        finally:
            gc.enable()

    def _seed_fleet(self) -> None:
        """The cluster as the seed makes it: nodes, the operator's objects and pods, a workload."""
        cfg = self.config
        now = datetime.now(UTC)
        mig_configmap = DEFAULT_MIG_CONFIGMAP if cfg.mig_config_source == "static" else ""
        policy = cluster_policy(mig_configmap, cfg.mig_strategy)
        node_objects = {}
        for name, node in self.nodes.items():
            obj = nodes.node_object(node, now)
            if name in self.dra.dra_nodes:  # the DRA GPU plugin must not share a node with the device plugin
                obj["metadata"]["labels"][nodes.DEPLOY_PREFIX + "device-plugin"] = "false"
            if node.cordoned:
                obj["spec"]["unschedulable"] = True
                nodes.normalize(None, obj)
            if not node.ready:
                nodes.set_ready(obj, False)
            node_objects[name] = obj
        configmaps = self.operator.bootstrap(node_objects, policy)
        store = self.store
        store.load(NAMESPACES, [{"metadata": {"name": n}, "status": {"phase": "Active"}} for n in NAMESPACE_NAMES])
        store.load(CLUSTER_POLICIES, [policy])
        store.load(CONFIGMAPS, configmaps)
        store.load(NODES, list(node_objects.values()))
        mig_nodes = sum(1 for node in self.nodes.values() if node.product.mig_capable)
        store.load(DAEMONSETS, self.daemonsets.objects(len(self.nodes), mig_nodes))
        store.load(SERVICES, [exporter_service()])
        store.load(
            PODS,
            [
                self.daemonsets.pod(spec, obj)
                for obj in node_objects.values()
                for spec in self.daemonsets.desired_specs(obj)
            ],
        )
        store.load(PODS, self.workload.place(self._fleet()["workload_pods"], store.objects(NODES)))
        self.dra.bootstrap()

    def _dra_node_names(self) -> set[str]:
        names = sorted(self.nodes)
        if self.config.dra_nodes == "all":
            return set(names)
        if self.config.dra_nodes == "mixed":
            return set(names[1::2])
        return set()

    # -- the state directory (simulator.persist) --------------------------------------------------------------

    def _fleet(self) -> dict:
        """What shapes the seeded cluster: a saved state is used only by a simulator started with the same."""
        cfg = self.config
        return {
            "seed": cfg.seed,
            "nodes": cfg.nodes,
            "workload_pods": cfg.workload_pods if cfg.workload_pods is not None else cfg.nodes // 2,
            "mig_strategy": cfg.mig_strategy,
            "mig_config_source": cfg.mig_config_source,
            "dra_nodes": cfg.dra_nodes,
        }

    def _collect(self, *, final: bool = False) -> Snapshot:
        """The state to save; run on the operator's thread (or after it stopped), so no controller step is half done."""
        return Snapshot(
            self.store.snapshot(final=final),
            {
                "hardware": {name: node.state() for name, node in self.nodes.items()},
                "operator": self.operator.export_state(),
                "daemonsets": self.daemonsets.export_state(),
                "workload": self.workload.export_state(),
            },
        )

    def _restore(self, begin: Start) -> None:
        document = begin.document
        for name, node in self.nodes.items():
            node.restore(document["hardware"][name])
        self.operator.import_state(document["operator"])
        by_plural = {resource.plural: resource for resource in ALL}
        objects = {by_plural[plural]: objs for plural, objs in document["objects"].items()}
        self.store.restore(begin.resource_version, document["uids"], objects)
        pod_names = {pod["metadata"]["name"] for pod in self.store.objects(PODS)}
        self.daemonsets.restore(document["daemonsets"], pod_names)
        self.workload.restore(document["workload"], pod_names)
        self.restored = True

    def _report_restored(self, begin: Start) -> None:
        """One line on stderr; the operator takes up what it had not finished or not yet seen."""
        how = (
            "stopped cleanly: watches go on from it"
            if begin.clean
            else f"not stopped cleanly: changes after {begin.document['saved_at']} are lost; older versions: 410"
        )
        log(f"restored the cluster from {self._state_file.path} at resourceVersion {begin.resource_version} ({how})")
        applying = self.operator.resume()
        if applying:
            log(f"MIG configs caught in flight apply again on {', '.join(applying)}")

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
                system = (OPERATOR_NAMESPACE, PLUGIN_NAMESPACE)
                busy = any(p["metadata"]["namespace"] not in system for p in self.store.indexed(PODS, name))
                if busy == idle:
                    continue
            found.append(name)
        return found

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until the operator and Kueue have nothing queued or scheduled (wedged nodes count as settled)."""
        return self.operator.settle(timeout) and self.kueue.settle(timeout) and self.dra.settle(timeout)

    def restart_mig_manager(self, node: str) -> None:
        self._require_node(node)
        self.operator.restart(node, MIG_MANAGER)

    def restart_device_plugin(self, node: str) -> None:
        self._require_node(node)
        self.operator.restart(node, DEVICE_PLUGIN)

    def restart_dra_plugin(self, node: str) -> None:
        """Delete the node's gpu.nvidia.com kubelet-plugin pod: the new one discovers the GPUs again (§13.1)."""
        if node not in self.dra.dra_nodes:
            raise ApiError.bad_request(f"node {node} does not run the DRA driver")
        self.dra.restart_plugin(node)

    def add_dra_pod(self, namespace: str, name: str, **options) -> dict:
        """A pod the allocator places on a DRA node (simulator.dra.Dra.add_pod)."""
        return self.dra.add_pod(namespace, name, **options)

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
        if self._persister is not None:
            self._persister.touch()  # hardware state only: no store change marks it
        return dict(sim_node.kubelet)

    def add_pod(self, node: str, resource: str = "nvidia.com/gpu", count: int = 1, **options) -> dict:
        """Place one workload pod on `node` (options: namespace, controller, protected) regardless of capacity."""
        return self.store.create(PODS, self.workload.make_pod(self.node(node), resource, count, **options))

    def add_workload(self, count: int) -> list[str]:
        return self.workload.add(count)

    def remove_workload(self, count: int) -> list[str]:
        return self.workload.remove(count)

    def metrics_text(self, node: str | None = None) -> str:
        """dcgm-exporter output for one node or all nodes whose exporter pod is running (as a central endpoint that
        gathers every exporter would serve it)."""
        names = [node] if node else list(self.nodes)
        strategy = self.store.find(CLUSTER_POLICIES, "", "cluster-policy")["spec"]["mig"]["strategy"]
        now = time.time()
        samples = []
        for name in names:
            sim_node = self._require_node(name)
            pods = self.store.indexed(PODS, name)
            if not sim_node.ready or self.daemonsets.pod_on(EXPORTER, name) is None:
                continue  # no exporter is running there (NotReady, or paused for a MIG change)
            xid = {gpu.index: self.faults.injected_xid(name, gpu.index) for gpu in sim_node.gpus}
            samples += metrics.node_samples(
                sim_node, pods, strategy, self.config.seed, now, xid, self.config.dcgm_host_label
            )
        return "".join(metrics.render(samples, self.dcgm_counters))

    def exporter_metrics(self, namespace: str, pod_name: str, port: str) -> str:
        """What `GET /api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy/metrics` answers: the exporter pod's own node,
        or 503 as kube-apiserver says when nothing listens at the pod's address and port."""
        pod = self.store.get(PODS, namespace, pod_name).obj
        node = pod["spec"].get("nodeName", "")
        ip = pod["status"].get("podIP", "")
        owners = pod["metadata"].get("ownerReferences") or [{}]
        listening = owners[0].get("name") == EXPORTER and port == "9400"  # the exporter's pods, however labelled
        if not listening or not self._require_node(node).ready:
            raise ApiError(
                503,
                "ServiceUnavailable",
                f"error trying to reach service: dial tcp {ip}:{port}: connect: connection refused",
            )
        return self.metrics_text(node)

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
            "state_file": str(self._state_file.path) if self._state_file else None,
            "restored": self.restored,
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
