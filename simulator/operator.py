"""NVIDIA's GPU Operator on every node: MIG Manager, device plugin (+ config-manager) and GPU Feature Discovery.

All controller logic runs on one thread, fed by store changes (in commit order) and timers, so it needs no
locks of its own. The sharp edges of the real components are kept on purpose; see contracts §1 and §3.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import asdict, dataclass, field

from sharing.mig import GpuProduct, LayoutResult, Placement, validate_layout
from sharing.nvidia_configs import device_filter_matches
from sharing.render import DevicePluginSpec, MigDeviceSpec, parse_device_plugin_config, parse_mig_parted_config
from simulator import labels as gfd
from simulator import migconfig
from simulator.controller import ControllerLoop
from simulator.faults import Faults
from simulator.fleet import MigDevice, SimNode
from simulator.nodes import DEPLOY_PREFIX, set_ready
from simulator.operator_objects import (
    CLUSTER_POLICY,
    DEFAULT_MIG_CONFIGMAP,
    DEVICE_PLUGIN_CONFIGMAP,
    DEVICE_PLUGIN_CONFIGS,
    backoff_event,
    config_manager_running,
    configmap,
    crash_container,
    generated_configmap_name,
)
from simulator.resources import CLUSTER_POLICIES, CONFIGMAPS, EVENTS, NODES, PODS
from simulator.store import Change, Store, now_timestamp
from simulator.workload import DAEMONSET_BY_APP, OPERATOR_NAMESPACE, DaemonSets, holds_gpu

MIG_CONFIG = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"
PLUGIN_CONFIG = "nvidia.com/device-plugin.config"
PAUSED = "paused-for-mig-change"
# Deploy labels MIG Manager pauses during a reconfiguration (contracts §1.1, reconfigure.go maybeSetPaused).
_PAUSED_COMPONENTS = ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "nvsm", "client")
MIG_MANAGER = "nvidia-mig-manager"
DEVICE_PLUGIN = "nvidia-device-plugin-daemonset"

Plan = dict[int, tuple[bool, dict[str, int]]]  # GPU index -> (MIG enabled, profile counts)


@dataclass
class MigManagerState:
    """One node's mig-manager: what it is doing and why it last failed."""

    busy: bool = False  # an apply is running (a timer is scheduled)
    resync: bool = False  # the label changed while busy: apply the latest value next (SyncableMigConfig)
    wedged: bool = False
    last_error: str | None = None
    seen: str | None = None  # the label value it last read: a different one is a change still to react to


@dataclass
class PluginState:
    """One node's device plugin: the config it runs, or why it refuses to."""

    spec: DevicePluginSpec = field(default_factory=DevicePluginSpec)
    config_error: str | None = None  # config-manager refused the selected config; resources drop to 0
    hardware_error: str | None = None  # the plugin refused the GPUs (e.g. `single` with mixed layouts)
    restarts: int = 0
    key: str | None = None  # the node's plugin-config label when the plugin last read its config


# Parsed configs and placements are pure functions of their text / layout; fleets repeat them thousands of times.
_parse_mig_parted = functools.lru_cache(maxsize=256)(parse_mig_parted_config)
_parse_device_plugin = functools.lru_cache(maxsize=256)(parse_device_plugin_config)


@functools.lru_cache(maxsize=4096)
def _validated(product: GpuProduct, layout: tuple[tuple[str, int], ...]) -> LayoutResult:
    return validate_layout(product, dict(layout))


def _gi_id(product: GpuProduct, placement: Placement) -> int:
    """GPU-instance ids as the driver hands them out (full GPU 0; 4g 1; 3g 1-2; 2-slice 3-6; 1g 7-13)."""
    compute = product.mig_profile(placement.profile).compute_slices
    if placement.size == product.memory_slices:
        return 0
    if compute == 4 or compute == 3:
        return 1 + placement.start // 4
    if placement.size == 2:
        return 3 + placement.start // 2
    return 7 + placement.start


class GpuOperator(ControllerLoop):
    """The operator's per-node controllers, driven by store changes and timers on one thread."""

    def __init__(self, store: Store, nodes: dict[str, SimNode], faults: Faults, daemonsets: DaemonSets):
        super().__init__("sim-gpu-operator")
        self._store = store
        self._nodes = nodes
        self._faults = faults
        self._daemonsets = daemonsets
        self._mig = {name: MigManagerState() for name in nodes}
        self._plugin = {name: PluginState() for name in nodes}
        self._event_serial = 0  # Event names: <pod>.<serial>, unique across restarts
        self._policy_seen: dict = {}  # the ClusterPolicy spec the operator last reacted to

    # -- start-up -------------------------------------------------------------------------------------------

    def bootstrap(self, node_objects: dict[str, dict], policy: dict) -> list[dict]:
        """Apply every node's initial MIG config and plugin config directly; returns the ConfigMaps to load."""
        self._policy_seen = policy["spec"]
        configmaps = [
            configmap(DEFAULT_MIG_CONFIGMAP, {"config.yaml": migconfig.dump(migconfig.default_config())}),
            configmap(DEVICE_PLUGIN_CONFIGMAP, dict(DEVICE_PLUGIN_CONFIGS)),
        ]
        generated: dict[str, tuple[str, dict[str, list[MigDeviceSpec]]]] = {}
        for name, node in self._nodes.items():
            obj = node_objects[name]
            labels = obj["metadata"]["labels"]
            if node.product.mig_capable:
                if node.product.name not in generated:
                    text = migconfig.dump(migconfig.generated_config(node.product))
                    generated[node.product.name] = (text, _parse_mig_parted(text))
                text, parsed = generated[node.product.name]
                configmaps.append(
                    configmap(
                        generated_configmap_name(name),
                        {"config.yaml": text},
                        {"app.kubernetes.io/component": "nvidia-mig-manager", "nvidia.com/node-name": name},
                    )
                )
                plan, _ = self._plan(node, parsed[node.initial_mig_config])
                self._apply_plan(node, plan)
                labels[MIG_CONFIG] = node.initial_mig_config
                labels[MIG_STATE] = "success"
                self._mig[name].seen = node.initial_mig_config
            if node.initial_plugin_config:
                labels[PLUGIN_CONFIG] = node.initial_plugin_config
            state = self._plugin[name]
            state.spec, state.config_error = self._plugin_config(labels, policy, configmaps)
            state.key = labels.get(PLUGIN_CONFIG)
            self._write_gpu_status(node, obj, policy)
        return configmaps

    # -- reacting to the store --------------------------------------------------------------------------------

    def on_change(self, change: Change) -> None:
        """Store listener (runs under the store lock): only decide what to react to, and enqueue it."""
        resource = change.resource
        new = change.entry.obj
        if resource is NODES and change.type == "MODIFIED":
            old_labels, new_labels = change.old["metadata"].get("labels", {}), new["metadata"].get("labels", {})
            name = new["metadata"]["name"]
            # MIG Manager reacts to a *change* of the label only (contracts §1.1): same value again is a no-op.
            if old_labels.get(MIG_CONFIG) != new_labels.get(MIG_CONFIG):
                self.submit(lambda: self._sync_mig(name))
            if old_labels.get(PLUGIN_CONFIG) != new_labels.get(PLUGIN_CONFIG):
                self.submit(lambda: self._reload_plugin(name))
        elif resource is PODS and change.type == "DELETED" and change.namespace == OPERATOR_NAMESPACE:
            app = new["metadata"].get("labels", {}).get("app")
            node = new["spec"].get("nodeName")
            if app in DAEMONSET_BY_APP and node in self._nodes:
                self.submit(lambda: self._on_daemon_pod_deleted(node, app))
        elif resource is CLUSTER_POLICIES and change.type == "MODIFIED":
            old_spec, new_spec = change.old.get("spec", {}), new.get("spec", {})
            self.submit(lambda: self._on_policy_change(old_spec, new_spec))

    # -- MIG Manager ----------------------------------------------------------------------------------------

    def _sync_mig(self, name: str) -> None:
        state = self._mig[name]
        if not self._nodes[name].product.mig_capable:
            return
        if state.busy:
            state.resync = True
            return
        self._start_apply(name)

    def _start_apply(self, name: str) -> None:
        node = self._nodes[name]
        obj = self._store.find(NODES, "", name)
        if obj is None:
            return
        state = self._mig[name]
        state.wedged = False
        value = state.seen = obj["metadata"].get("labels", {}).get(MIG_CONFIG)
        policy = self._policy()
        if not value:
            if policy["spec"]["migManager"]["config"].get("default") == "all-disabled":
                self._set_labels(name, {MIG_CONFIG: "all-disabled"})  # the operator's node labeller, §1.1
            return
        configs, error = self._mig_parted_config(name, policy)
        if error is None and value not in configs:
            error = f'selected mig-config "{value}" not present in config file'
        if error is not None:
            self._fail(name, error)  # assert --valid-config fails before anything starts (§1.2 step 2)
            return
        plan, plan_error = self._plan(node, configs[value])
        if plan_error is None and self._is_applied(node, plan):
            state.last_error = None
            self._set_labels(name, {MIG_STATE: "success"})
            return
        mode_change = any(node.gpus[i].mig_enabled != enabled for i, (enabled, _) in plan.items())
        self._set_labels(name, {MIG_STATE: "pending"})
        self._pause(name)
        if self._faults.take_wedge(name):
            # mig-parted #485: the pod-shutdown wait times out without setState; pending until a label change
            # or a restart of the mig-manager pod (contracts §1.2).
            state.wedged = True
            return
        state.busy = True
        self._later(self._faults.apply_delay, lambda: self._finish_apply(name, plan, plan_error, mode_change))

    def _finish_apply(self, name: str, plan: Plan, plan_error: str | None, mode_change: bool) -> None:
        node = self._nodes[name]
        error = plan_error
        if error is None and self._faults.is_failing(name):
            error = "nvidia-mig-parted apply failed: error setting MIG mode (injected node failure)"
        if error is None:
            holders = [p for p in self._store.indexed(PODS, name) if holds_gpu(p)]
            if holders:
                # MIG Manager never drains user pods; NVML reports the GPUs in use (contracts §1.2).
                pods = ", ".join(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in holders[:5])
                error = f"nvidia-mig-parted apply failed: GPUs in use (In use by another client) by pods {pods}"
        if error is not None:
            self._fail(name, error)
            self._resume(name)
            self._apply_done(name)
            return
        if mode_change and self._faults.needs_reboot(name):
            # WITH_REBOOT=true: the mode change did not take effect without a reset, so the node reboots (§1.3).
            self._set_labels(name, {MIG_STATE: "rebooting"})
            node.ready = False
            self._store.mutate(NODES, "", name, lambda obj: set_ready(obj, False))
            self._later(self._faults.apply_delay, lambda: self._after_reboot(name, plan))
            return
        self._complete(node, plan)

    def _after_reboot(self, name: str, plan: Plan) -> None:
        self._nodes[name].ready = True
        self._store.mutate(NODES, "", name, lambda obj: set_ready(obj, True))
        for pod in list(self._store.indexed(PODS, name)):
            if pod["metadata"]["namespace"] == OPERATOR_NAMESPACE:
                self._store.delete(PODS, OPERATOR_NAMESPACE, pod["metadata"]["name"])
        self._complete(self._nodes[name], plan)

    def _complete(self, node: SimNode, plan: Plan) -> None:
        self._apply_plan(node, plan)
        self._mig[node.name].last_error = None
        self._resume(node.name)
        self._set_labels(node.name, {MIG_STATE: "success"})
        self._apply_done(node.name)

    def _apply_done(self, name: str) -> None:
        state = self._mig[name]
        state.busy = False
        if state.resync:
            state.resync = False
            self._start_apply(name)

    def _fail(self, name: str, error: str) -> None:
        self._mig[name].last_error = error
        self._set_labels(name, {MIG_STATE: "failed"})

    def _pause(self, name: str) -> None:
        def change(obj: dict) -> None:
            labels = obj["metadata"]["labels"]
            for component in _PAUSED_COMPONENTS:
                if labels.get(DEPLOY_PREFIX + component) == "true":  # a `false` is preserved
                    labels[DEPLOY_PREFIX + component] = PAUSED
            for kind in ("capacity", "allocatable"):  # the plugin is gone, so the kubelet reports 0
                for resource in obj["status"][kind]:
                    if gfd.is_gpu_resource(resource):
                        obj["status"][kind][resource] = "0"

        self._store.mutate(NODES, "", name, change)
        self._daemonsets.sync(name)

    def _resume(self, name: str) -> None:
        def change(obj: dict) -> None:
            labels = obj["metadata"]["labels"]
            for key, value in labels.items():
                if key.startswith(DEPLOY_PREFIX) and value == PAUSED:
                    labels[key] = "true"

        self._store.mutate(NODES, "", name, change)
        self._daemonsets.sync(name)
        self._reload_plugin(name)  # the plugin pod starts again and re-reads its config (edits included)

    def _mig_parted_config(self, name: str, policy: dict) -> tuple[dict[str, list[MigDeviceSpec]], str | None]:
        """The file MIG Manager reads: the ClusterPolicy's ConfigMap, else the node's generated one (§1.4)."""
        configmap = policy["spec"]["migManager"]["config"].get("name") or generated_configmap_name(name)
        obj = self._store.find(CONFIGMAPS, OPERATOR_NAMESPACE, configmap)
        if obj is None:
            return {}, f"ConfigMap {OPERATOR_NAMESPACE}/{configmap} not found"
        text = (obj.get("data") or {}).get("config.yaml")
        if text is None:
            return {}, f"ConfigMap {OPERATOR_NAMESPACE}/{configmap} has no key config.yaml"
        try:
            return _parse_mig_parted(text), None
        except ValueError as error:
            return {}, f"invalid mig-parted config: {error}"

    @staticmethod
    def _plan(node: SimNode, specs: list[MigDeviceSpec]) -> tuple[Plan, str | None]:
        """Per GPU, what the selected config asks for; an error names the first GPU it cannot be done on."""
        plan: Plan = {}
        pci_id = int(node.product.pci_device_id, 16)
        for spec in specs:
            if not device_filter_matches(spec.device_filter, pci_id):
                continue
            indices = range(len(node.gpus)) if spec.devices == "all" else spec.devices
            for index in indices:
                if index >= len(node.gpus):
                    return plan, f"invalid device index {index}: the node has {len(node.gpus)} GPUs"
                plan[index] = (spec.mig_enabled, {k: v for k, v in spec.mig_devices.items() if v})
        for index, (enabled, devices) in sorted(plan.items()):
            if enabled and devices:
                result = _validated(node.product, tuple(sorted(devices.items())))
                if not result.valid:
                    return plan, f"GPU {index}: " + "; ".join(result.errors)
        return plan, None

    @staticmethod
    def _is_applied(node: SimNode, plan: Plan) -> bool:
        for index, (enabled, devices) in plan.items():
            gpu = node.gpus[index]
            if gpu.mig_enabled != enabled:
                return False
            if enabled and Counter(d.profile for d in gpu.mig_devices) != Counter(devices):
                return False
        return True

    def _apply_plan(self, node: SimNode, plan: Plan) -> None:
        node.mig_applies += 1
        for index, (enabled, devices) in plan.items():
            gpu = node.gpus[index]
            gpu.mig_enabled = enabled
            gpu.mig_devices = []
            if not enabled or not devices:
                continue
            for placement in _validated(node.product, tuple(sorted(devices.items()))).placements:
                gpu.mig_devices.append(
                    MigDevice(
                        profile=placement.profile,
                        start=placement.start,
                        size=placement.size,
                        gi_id=_gi_id(node.product, placement),
                        parent_uuid=gpu.uuid,
                        generation=node.mig_applies,
                    )
                )

    # -- device plugin, config-manager and GFD ---------------------------------------------------------------

    def _plugin_config(
        self, labels: dict[str, str], policy: dict, configmaps: list[dict] | None = None
    ) -> tuple[DevicePluginSpec, str | None]:
        """The config-manager's choice (contracts §3.4): label, else ClusterPolicy default, else built-in defaults."""
        config = policy["spec"].get("devicePlugin", {}).get("config", {})
        name, key = config.get("name"), labels.get(PLUGIN_CONFIG) or config.get("default")
        if not name or not key:
            return DevicePluginSpec(), None  # the operator's FALLBACK_STRATEGIES=empty
        if configmaps is None:
            obj = self._store.find(CONFIGMAPS, OPERATOR_NAMESPACE, name)
        else:
            obj = next((c for c in configmaps if c["metadata"]["name"] == name), None)
        if obj is None:
            return DevicePluginSpec(), f'error getting ConfigMap "{OPERATOR_NAMESPACE}/{name}": not found'
        data = obj.get("data") or {}
        if key not in data:
            # README says "skip", but the code ends the config-manager loop (contracts §3.4).
            return DevicePluginSpec(), f"specified config {key} does not exist"
        try:
            return _parse_device_plugin(data[key]), None
        except ValueError as error:
            return DevicePluginSpec(), f"unable to load config {key}: {error}"

    def _reload_plugin(self, name: str) -> None:
        obj = self._store.find(NODES, "", name)
        if obj is None:
            return
        state = self._plugin[name]
        labels = obj["metadata"].get("labels", {})
        state.key = labels.get(PLUGIN_CONFIG)
        spec, error = self._plugin_config(labels, self._policy())
        was_broken = state.config_error or state.hardware_error
        if error is None:
            state.spec = spec
        state.config_error = error
        self._store.mutate(NODES, "", name, lambda o: self._write_gpu_status(self._nodes[name], o, self._policy()))
        if state.config_error:
            self._report_plugin_crash(name, state.config_error, "config-manager")
        elif state.hardware_error:  # the plugin itself exits at start-up (§3.1)
            self._report_plugin_crash(name, state.hardware_error, "nvidia-device-plugin")
        elif was_broken:
            self._set_plugin_pod_running(name)

    def _write_gpu_status(self, node: SimNode, obj: dict, policy: dict) -> None:
        """GFD labels and the GPU resources of capacity/allocatable, from the node's GPUs and plugin state."""
        state = self._plugin[node.name]
        # The operator's MIG_STRATEGY beats the config's flags.migStrategy; unset, the config decides (§1.2).
        strategy = policy["spec"].get("mig", {}).get("strategy") or state.spec.mig_strategy
        advertised = gfd.advertised(node, state.spec, strategy)
        state.hardware_error = advertised.error
        status = obj["status"]
        previous = {k for k in status["allocatable"] if gfd.is_gpu_resource(k)}
        if state.config_error is None:  # with a bad key GFD's config-manager fails too: its labels go stale (§3.4)
            labels = obj["metadata"]["labels"]
            for key in [k for k in labels if gfd.is_gfd_label(k)]:
                del labels[key]
            labels.update(gfd.gfd_labels(node, state.spec, strategy, advertised))
        resources = {} if state.config_error or advertised.error else advertised.resources
        if obj["metadata"]["labels"].get(DEPLOY_PREFIX + "device-plugin") == "false":
            previous, resources = set(), {}  # never ran here (a DRA node): the kubelet knows no GPU resource
        for kind in ("capacity", "allocatable"):
            for key in previous:
                status[kind].pop(key, None)
            for key in sorted(previous | set(resources)):
                status[kind][key] = str(resources.get(key, 0))

    def _report_plugin_crash(self, name: str, error: str, container: str) -> None:
        """CrashLoopBackOff on the container that failed (config-manager for a bad config key, the plugin for
        what it refuses at start-up), and a Warning Event naming the error."""
        pod = self._daemonsets.pod_on(DEVICE_PLUGIN, name)
        if pod is None:
            return
        state = self._plugin[name]
        state.restarts += 1
        crash = functools.partial(crash_container, container=container, restarts=state.restarts, error=error)
        self._store.mutate(PODS, OPERATOR_NAMESPACE, pod["metadata"]["name"], crash)
        self._event_serial += 1
        self._store.create(EVENTS, backoff_event(pod, name, error, self._event_serial, now_timestamp(), container))

    def _set_plugin_pod_running(self, name: str) -> None:
        pod = self._daemonsets.pod_on(DEVICE_PLUGIN, name)
        if pod is None:
            return
        heal = functools.partial(config_manager_running, started=now_timestamp())
        self._store.mutate(PODS, OPERATOR_NAMESPACE, pod["metadata"]["name"], heal)

    # -- restarts and the ClusterPolicy -----------------------------------------------------------------------

    def _on_daemon_pod_deleted(self, node: str, app: str) -> None:
        """A deleted operator pod is recreated by its DaemonSet; a restarted component re-reads its inputs."""
        obj = self._store.find(NODES, "", node)
        if obj is None or DAEMONSET_BY_APP[app] not in self._daemonsets.desired_specs(obj):
            return  # removed on purpose (paused for a MIG change)
        self._daemonsets.sync(node)
        if app == MIG_MANAGER:
            self._sync_mig(node)  # the Add event at start-up re-reads the label (contracts §1.1)
        elif app == DEVICE_PLUGIN:
            self._plugin[node].restarts = 0
            self._reload_plugin(node)

    def restart(self, node: str, app: str) -> None:
        """Delete the node's pod of this DaemonSet (what `kubectl delete pod` does); the rest follows."""
        pod = self._daemonsets.pod_on(app, node)
        if pod is not None:
            self._store.delete(PODS, OPERATOR_NAMESPACE, pod["metadata"]["name"])

    def _on_policy_change(self, old: dict, new: dict) -> None:
        """The operator rolls the DaemonSets whose configuration changed: their pods restart on every node."""
        self._policy_seen = new
        if old.get("migManager") != new.get("migManager"):
            for name, node in self._nodes.items():
                if node.product.mig_capable:
                    self.restart(name, MIG_MANAGER)
        if old.get("devicePlugin") != new.get("devicePlugin") or old.get("mig") != new.get("mig"):
            for name in self._nodes:
                self.restart(name, DEVICE_PLUGIN)

    # -- restarts of the simulator ---------------------------------------------------------------------------

    def export_state(self) -> dict:
        """What the operator and the node-side components hold in memory: the inputs each last read (a change after
        the snapshot's cut may still be queued), why a MIG apply last failed, the config each device plugin runs
        (it re-reads its ConfigMap only on a key change or a restart of its pod)."""
        return {
            "events": self._event_serial,
            "policy_seen": self._policy_seen,
            "mig": {name: {"seen": m.seen, "last_error": m.last_error} for name, m in self._mig.items()},
            "plugins": {name: asdict(plugin) for name, plugin in self._plugin.items()},  # the spec as a dict too
        }

    def import_state(self, state: dict) -> None:
        self._event_serial, self._policy_seen = state["events"], state["policy_seen"]
        for name, saved in state["mig"].items():
            self._mig[name].seen, self._mig[name].last_error = saved["seen"], saved["last_error"]
        for name, saved in state["plugins"].items():
            self._plugin[name] = PluginState(**dict(saved, spec=DevicePluginSpec(**saved["spec"])))

    def resume(self) -> list[str]:
        """After a restart from saved state: react to what the components had not yet (a ClusterPolicy or label
        change, a deleted operator pod), and run again the MIG applies that were in flight, as MIG Manager does when
        its pod restarts (a node caught `rebooting` comes back up first). Returns the nodes whose apply runs."""
        policy = self._policy()["spec"]
        if policy != self._policy_seen:
            self.submit(functools.partial(self._on_policy_change, self._policy_seen, policy))
        applying = []
        for obj in self._store.objects(NODES):
            name, labels = obj["metadata"]["name"], obj["metadata"].get("labels", {})
            if name not in self._nodes:
                continue
            for spec in self._daemonsets.desired_specs(obj):
                if self._daemonsets.pod_on(spec.name, name) is None:
                    self.submit(functools.partial(self._on_daemon_pod_deleted, name, spec.name))
            if labels.get(PLUGIN_CONFIG) != self._plugin[name].key:
                self.submit(functools.partial(self._reload_plugin, name))
            state = labels.get(MIG_STATE)
            if self._nodes[name].product.mig_capable and (
                state in ("pending", "rebooting") or labels.get(MIG_CONFIG) != self._mig[name].seen
            ):
                applying.append(name)
                self.submit(functools.partial(self._rerun_apply, name, state == "rebooting"))
        return sorted(applying)

    def _rerun_apply(self, name: str, rebooted: bool) -> None:
        if rebooted:
            self._nodes[name].ready = True
            self._store.mutate(NODES, "", name, lambda obj: set_ready(obj, True))
        self._start_apply(name)
        state, labels = self._mig[name], self._store.find(NODES, "", name)["metadata"]["labels"]
        if not (state.busy or state.wedged) and PAUSED in labels.values():
            self._resume(name)  # nothing left to apply (or refused at once): the paused components come back

    # -- helpers ---------------------------------------------------------------------------------------------

    def _policy(self) -> dict:
        return self._store.find(CLUSTER_POLICIES, "", CLUSTER_POLICY)

    def _set_labels(self, name: str, values: dict[str, str]) -> None:
        self._store.mutate(NODES, "", name, lambda obj: obj["metadata"].setdefault("labels", {}).update(values))

    def describe(self, name: str) -> dict:
        """The operator's private view of one node, for `GET /_sim/state`."""
        node, mig, plugin = self._nodes[name], self._mig[name], self._plugin[name]
        return {
            "product": node.product.name,
            "ready": node.ready,
            "mig_manager": {"busy": mig.busy, "wedged": mig.wedged, "last_error": mig.last_error},
            "device_plugin": {
                "sharing": plugin.spec.sharing,
                "replicas": plugin.spec.replicas,
                "rename_by_default": plugin.spec.rename_by_default,
                "error": plugin.config_error or plugin.hardware_error,
            },
            "gpus": [
                {
                    "index": gpu.index,
                    "uuid": gpu.uuid,
                    "pci_bus_id": gpu.pci_bus_id,
                    "mig_enabled": gpu.mig_enabled,
                    "mig_devices": [device.describe() for device in gpu.mig_devices],
                    "xid": gpu.xid,
                    "ecc_dbe": gpu.ecc_dbe,
                }
                for gpu in node.gpus
            ],
        }
