"""The GPU Operator's side of a cluster: its ClusterPolicy and the two ConfigMaps Tessera writes configs into.

Contracts: MIG Manager reads the mig-parted file named by `spec.migManager.config.name` (§1.4; empty means the
per-node generated configs of GPU Operator >= v26.3, which Tessera cannot extend); the device plugin reads the
key named by a node's label from `spec.devicePlugin.config.name` and crashes on an unknown key (§3.4). So keys
are content-addressed and immutable, written with optimistic concurrency, and confirmed present by a re-read
before any node is labelled with them.
"""

import copy
import functools
import logging
from dataclasses import dataclass, field

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sharing.nvidia_import import ClusterConfigs, NodeLabels
from sharing.render import MigDeviceSpec, parse_device_plugin_config, parse_mig_parted_config, render_mig_parted_config
from worker.drivers.base import DriverError
from worker.drivers.kubernetes.api import MERGE_PATCH, call, error_text, is_transient, list_all, read_json
from worker.drivers.kubernetes.labels import (
    GPU_NODE_SELECTOR,
    MANAGED_BY,
    MANAGED_BY_TESSERA,
    MIG_CONFIG,
    PLUGIN_CONFIG,
    node_labels,
)

log = logging.getLogger(__name__)

POLICY = ("nvidia.com", "v1", "clusterpolicies")
MIG_FILE_KEY = "config.yaml"
OPERATOR_MIG_CONFIGMAP = "default-mig-parted-config"
GENERATED_COMPONENT = ("app.kubernetes.io/component", "nvidia-mig-manager")  # <node>-mig-config (§1.4)
SUGGESTED_MIG_CONFIGMAP = "tessera-mig-parted-config"
SUGGESTED_PLUGIN_CONFIGMAP = "tessera-device-plugin-config"
CONFIGMAP_LIMIT = 1_000_000  # bytes; the API server refuses objects over ~1 MiB
CONFLICT_ATTEMPTS = 6
# The operator's device-plugin DaemonSet and its plugin container (gpu-operator assets/state-device-plugin).
PLUGIN_DAEMONSET, PLUGIN_CONTAINER = "nvidia-device-plugin-daemonset", "nvidia-device-plugin"


@dataclass(frozen=True)
class Policy:
    """What Tessera needs from the ClusterPolicy. `mig_strategy` is spec.mig.strategy, which the operator sets as
    the device plugin's MIG_STRATEGY over any rendered flags.migStrategy ("": not set, the config decides; §1.2);
    `device_plugin_version` is spec.devicePlugin.version, the plugin's image tag ("" when the operator's own
    default image applies)."""

    name: str
    mig_configmap: str
    plugin_configmap: str
    raw: dict
    mig_strategy: str = ""
    device_plugin_version: str = ""


@dataclass
class HealthReport:
    """Named checks of a cluster, in order; `problem` is the first failure, phrased for an admin. With the
    ClusterPolicy read, `policy` and the device plugin's version (from the policy, else its DaemonSet)."""

    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    reachable: bool = False
    policy: Policy | None = None
    device_plugin_version: str = ""

    def add(self, name: str, ok: bool, message: str) -> bool:
        self.checks.append((name, ok, message))
        return ok

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.checks)

    @property
    def problem(self) -> str | None:
        return next((message for _, ok, message in self.checks if not ok), None)


class Operator:
    """ClusterPolicy and ConfigMaps of one cluster's GPU Operator namespace."""

    def __init__(self, api: client.ApiClient, namespace: str, cluster_name: str):
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.apps = client.AppsV1Api(api)
        self.version = client.VersionApi(api)
        self.namespace = namespace
        self.cluster_name = cluster_name

    # -- reading ----------------------------------------------------------------------------------------------------

    def policy(self) -> Policy:
        """The cluster's ClusterPolicy (the operator honours one; with several, the oldest is the one in charge)."""
        try:
            items, _ = list_all(self.custom.list_cluster_custom_object, *POLICY)
        except ApiException as exc:
            if exc.status != 404:
                raise
            items = []  # the CRD itself is missing
        if not items:
            raise DriverError(
                f"no ClusterPolicy (nvidia.com/v1) found in cluster {self.cluster_name}: is the GPU Operator installed?"
            )
        items.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
        raw = items[0]
        spec = raw.get("spec") or {}
        plugin = spec.get("devicePlugin") or {}
        return Policy(
            name=raw["metadata"]["name"],
            mig_configmap=((spec.get("migManager") or {}).get("config") or {}).get("name") or "",
            plugin_configmap=(plugin.get("config") or {}).get("name") or "",
            raw=raw,
            mig_strategy=str((spec.get("mig") or {}).get("strategy") or ""),
            device_plugin_version=str(plugin.get("version") or ""),
        )

    def device_plugin_version(self, policy: Policy) -> str:
        """The plugin's image tag: the ClusterPolicy's (what Helm installs set), else the tag the operator's
        DaemonSet runs (installs through OLM set images in the operator's environment instead); "" if neither."""
        if policy.device_plugin_version:
            return policy.device_plugin_version
        try:
            daemonset = read_json(self.apps.read_namespaced_daemon_set, PLUGIN_DAEMONSET, self.namespace)
        except ApiException as exc:
            if exc.status in (403, 404):
                return ""
            raise
        template = ((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {}
        containers = template.get("containers") or []
        image = next((c.get("image") or "" for c in containers if c.get("name") == PLUGIN_CONTAINER), "")
        return image_tag(image)

    def configmap(self, name: str) -> dict | None:
        try:
            return read_json(self.core.read_namespaced_config_map, name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def mig_problem(self, policy: Policy) -> str | None:
        """Why MIG configs cannot be written where MIG Manager reads them, or None."""
        name = policy.mig_configmap
        if not name:
            return (
                f"ClusterPolicy {policy.name} uses the GPU Operator's generated MIG configs; set "
                f"spec.migManager.config.name to a ConfigMap Tessera manages, e.g. {SUGGESTED_MIG_CONFIGMAP}"
            )
        return self._managed_problem(policy, name, "spec.migManager.config.name", SUGGESTED_MIG_CONFIGMAP)

    def plugin_problem(self, policy: Policy) -> str | None:
        name = policy.plugin_configmap
        if not name:
            return (
                f"ClusterPolicy {policy.name} sets no device-plugin ConfigMap; set spec.devicePlugin.config.name "
                f"to a ConfigMap Tessera manages, e.g. {SUGGESTED_PLUGIN_CONFIGMAP}"
            )
        return self._managed_problem(policy, name, "spec.devicePlugin.config.name", SUGGESTED_PLUGIN_CONFIGMAP)

    def _managed_problem(self, policy: Policy, name: str, field_path: str, suggestion: str) -> str | None:
        if name == OPERATOR_MIG_CONFIGMAP:
            return (
                f"ClusterPolicy {policy.name} {field_path} names the GPU Operator's own ConfigMap {name}, which the "
                f"operator rewrites; point it at a ConfigMap Tessera manages, e.g. {suggestion}"
            )
        configmap = self.configmap(name)
        if configmap is None:
            return None  # Tessera creates it (with its label) on first use
        labels = configmap["metadata"].get("labels") or {}
        if labels.get(MANAGED_BY) != MANAGED_BY_TESSERA:
            return (
                f"ConfigMap {self.namespace}/{name} (ClusterPolicy {policy.name} {field_path}) is not managed by "
                f"Tessera: label it {MANAGED_BY}={MANAGED_BY_TESSERA} to hand it over, or point {field_path} at "
                f"{suggestion}"
            )
        return None

    def nvidia_configs(self) -> ClusterConfigs:
        """Read only: the ClusterPolicy's choices, the mig-parted and device-plugin ConfigMaps it names, and every
        GPU node's two config labels — what sharing.nvidia_import judges (products come from the inventory)."""
        policy = self.policy()
        spec = policy.raw.get("spec") or {}
        mig_text = None
        if policy.mig_configmap:
            mig_text = ((self.configmap(policy.mig_configmap) or {}).get("data") or {}).get(MIG_FILE_KEY)
        plugin_data = {}
        if policy.plugin_configmap:
            plugin_data = dict((self.configmap(policy.plugin_configmap) or {}).get("data") or {})
        nodes, _ = list_all(self.core.list_node, label_selector=GPU_NODE_SELECTOR)
        return ClusterConfigs(
            cluster=self.cluster_name,
            policy=policy.name,
            mig_strategy=(spec.get("mig") or {}).get("strategy") or "",
            mig_configmap=policy.mig_configmap,
            mig_parted_text=mig_text,
            plugin_configmap=policy.plugin_configmap,
            plugin_default=((spec.get("devicePlugin") or {}).get("config") or {}).get("default") or "",
            plugin_configs=plugin_data,
            nodes=tuple(
                NodeLabels(
                    node["metadata"]["name"],
                    node_labels(node).get(MIG_CONFIG, ""),
                    node_labels(node).get(PLUGIN_CONFIG, ""),
                )
                for node in nodes
            ),
        )

    # -- writing configs ----------------------------------------------------------------------------------------------

    def ensure(self, *, mig_configs: dict[str, str], plugin_configs: dict[str, str]) -> None:
        """Add missing configs to the managed ConfigMaps and confirm they are there; refuse anything unsafe."""
        if not mig_configs and not plugin_configs:
            return
        policy = self.policy()
        problems = []
        if mig_configs:
            problems.append(self.mig_problem(policy))
        if plugin_configs:
            problems.append(self.plugin_problem(policy))
        problems = [p for p in problems if p]
        if problems:
            raise DriverError("; ".join(problems))
        if mig_configs:
            wanted = {}
            for name, text in mig_configs.items():
                parsed = _parse_mig(text, name)
                if name not in parsed or len(parsed) != 1:
                    raise DriverError(f"the rendered mig-parted config for {name} does not define exactly {name}")
                wanted[name] = parsed[name]
            self._add(policy.mig_configmap, lambda data: _merge_mig(data, wanted))
        if plugin_configs:
            for key, text in plugin_configs.items():
                try:
                    parse_device_plugin_config(text)
                except ValueError as exc:
                    raise DriverError(f"device-plugin config {key} is invalid: {exc}") from None
            self._add(policy.plugin_configmap, lambda data: _merge_plugin(data, plugin_configs))

    def _add(self, name: str, merge, *, create: bool = False) -> None:
        """Read, merge, replace with the read resourceVersion (409: read again); done when a read shows all keys.
        With `create`, a missing ConfigMap is created even when there is nothing to add."""
        written = None
        for _ in range(CONFLICT_ATTEMPTS):
            current = self.configmap(name)
            data = dict((current or {}).get("data") or {})
            if written is not None and data == written:
                return  # this read shows what was written, every wanted key in it: confirmed (no second parse)
            changed = merge(data)
            if changed is None and current is None and create:
                changed = data
            elif changed is None:
                return  # this read shows every key with the wanted content: confirmed
            if sum(len(k) + len(v) for k, v in changed.items()) > CONFIGMAP_LIMIT:
                raise DriverError(
                    f"ConfigMap {self.namespace}/{name} would exceed the API server's 1 MiB limit; remove configs "
                    "no node uses any more"
                )
            try:
                if current is None:
                    body = {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "metadata": {
                            "name": name,
                            "namespace": self.namespace,
                            "labels": {MANAGED_BY: MANAGED_BY_TESSERA},
                        },
                        "data": changed,
                    }
                    call(self.core.create_namespaced_config_map, self.namespace, body, retry_if=_retry_unless_conflict)
                else:
                    body = copy.deepcopy(current)  # the object just read, with its resourceVersion
                    body["data"] = changed
                    replace = self.core.replace_namespaced_config_map
                    call(replace, name, self.namespace, body, retry_if=_retry_unless_conflict)
                written = changed
            except ApiException as exc:
                if exc.status != 409:
                    raise
            # Either written or someone else wrote first: the next read decides (and confirms).
        raise DriverError(f"ConfigMap {self.namespace}/{name} kept changing under Tessera; try again", transient=True)

    # -- health and adoption ----------------------------------------------------------------------------------------

    def health(self) -> HealthReport:
        report = HealthReport()
        try:
            read_json(self.version.get_code)
        except Exception as exc:
            report.add("api_reachable", False, f"Kubernetes API of cluster {self.cluster_name}: {error_text(exc)}")
            return report
        report.reachable = True
        report.add("api_reachable", True, "API server answers")
        try:
            policy = self.policy()
        except DriverError as exc:
            report.add("cluster_policy", False, str(exc))
            return report
        except Exception as exc:
            report.add("cluster_policy", False, f"cannot read ClusterPolicies: {error_text(exc)}")
            return report
        report.add("cluster_policy", True, f"ClusterPolicy {policy.name}")
        report.policy = policy
        try:
            report.device_plugin_version = self.device_plugin_version(policy)
        except Exception as exc:  # the version only refines what the UI says; health goes on without it
            log.warning("reading the device plugin DaemonSet of %s failed: %s", self.cluster_name, error_text(exc))
        problem = self.mig_problem(policy)
        if problem and not policy.mig_configmap and self._generated_configs_exist():
            problem += " (GPU Operator >= v26.3 publishes per-node <node>-mig-config ConfigMaps; their config names "
            problem += "depend on each node's hardware)"
        report.add("mig_configmap", problem is None, problem or f"MIG configs in {policy.mig_configmap}")
        problem = self.plugin_problem(policy)
        report.add(
            "device_plugin_configmap", problem is None, problem or f"plugin configs in {policy.plugin_configmap}"
        )
        return report

    def _generated_configs_exist(self) -> bool:
        key, value = GENERATED_COMPONENT
        page = read_json(self.core.list_namespaced_config_map, self.namespace, label_selector=f"{key}={value}", limit=1)
        return bool(page.get("items"))

    def adopt(
        self,
        *,
        mig_configmap: str = SUGGESTED_MIG_CONFIGMAP,
        plugin_configmap: str = SUGGESTED_PLUGIN_CONFIGMAP,
        nodes: list[dict] | None = None,
    ) -> list[str]:
        """Point the ClusterPolicy at Tessera's ConfigMaps, seeded with every config nodes select today.

        MIG configs come from the operator's static `default-mig-parted-config` (all products, told apart by
        device-filter) and the file the policy names now; plugin keys from the plugin ConfigMap it names now.
        Refuses (changing nothing) when a node selects a name the seed lacks: re-pointing would fail that node.
        Returns what it did, for the caller to print.
        """
        policy = self.policy()
        done = []
        if not self.mig_problem(policy) and not self.plugin_problem(policy):
            return [f"ClusterPolicy {policy.name} already points at Tessera's ConfigMaps"]
        mig_seed: dict[str, list] = {}
        for source in (OPERATOR_MIG_CONFIGMAP, policy.mig_configmap):
            configmap = self.configmap(source) if source and source != mig_configmap else None
            text = ((configmap or {}).get("data") or {}).get(MIG_FILE_KEY)
            if text:
                mig_seed.update(_parse_mig(text, source))
        mig_seed.setdefault("all-disabled", [MigDeviceSpec("all", False)])  # what the operator labels new nodes
        plugin_seed = {}
        if policy.plugin_configmap and policy.plugin_configmap != plugin_configmap:
            plugin_seed = dict((self.configmap(policy.plugin_configmap) or {}).get("data") or {})
        if nodes is None:
            nodes, _ = list_all(self.core.list_node)
        missing = set()
        for node in nodes:
            labels = node["metadata"].get("labels") or {}
            if (
                labels.get(MIG_CONFIG)
                and labels[MIG_CONFIG] not in mig_seed
                and not labels[MIG_CONFIG].startswith("tessera-")
            ):
                missing.add(f"{MIG_CONFIG}={labels[MIG_CONFIG]}")
            if labels.get(PLUGIN_CONFIG) and labels[PLUGIN_CONFIG] not in plugin_seed:
                missing.add(f"{PLUGIN_CONFIG}={labels[PLUGIN_CONFIG]}")
        if missing:
            raise DriverError(
                "cannot re-point the ClusterPolicy: nodes select configs Tessera has no copy of ("
                + ", ".join(sorted(missing)[:10])
                + ")"
            )
        for name, seed, merge in (
            (mig_configmap, mig_seed, lambda data, seed=mig_seed: _merge_mig(data, seed, keep_existing=True)),
            (plugin_configmap, plugin_seed, lambda data, seed=plugin_seed: _merge_plugin(data, seed, True)),
        ):
            existing = self.configmap(name)
            if existing is not None and (existing["metadata"].get("labels") or {}).get(MANAGED_BY) != (
                MANAGED_BY_TESSERA
            ):
                raise DriverError(f"ConfigMap {self.namespace}/{name} exists and is not managed by Tessera")
            if seed or existing is None:
                self._add(name, merge, create=True)
                done.append(f"ConfigMap {self.namespace}/{name}: {len(seed)} config(s) carried over")
        patch = {
            "spec": {
                "migManager": {"config": {"name": mig_configmap}},
                "devicePlugin": {"config": {"name": plugin_configmap}},
            }
        }
        call(self.custom.patch_cluster_custom_object, *POLICY, policy.name, patch, _content_type=MERGE_PATCH)
        done.append(f"ClusterPolicy {policy.name} now points at {mig_configmap} and {plugin_configmap}")
        return done


def image_tag(image: str) -> str:
    """The tag or digest of an image reference ("nvcr.io/nvidia/k8s-device-plugin:v0.17.0" -> "v0.17.0")."""
    if "@" in image:
        return image.rsplit("@", 1)[1]
    name = image.rsplit("/", 1)[-1]
    return name.rsplit(":", 1)[1] if ":" in name else ""


def _retry_unless_conflict(exc: BaseException) -> bool:
    return is_transient(exc) and not (isinstance(exc, ApiException) and exc.status == 409)


# Parsed files by text: every step's ensure reads the same file (~0.1 s to parse at a few hundred configs); the
# result is shared, never modified.
_parse_mig_parted = functools.lru_cache(maxsize=16)(parse_mig_parted_config)


def _parse_mig(text: str, where: str) -> dict:
    try:
        return _parse_mig_parted(text)
    except ValueError as exc:
        raise DriverError(f"mig-parted config {where} cannot be read: {exc}") from None


def _merge_mig(data: dict, wanted: dict, keep_existing: bool = False) -> dict | None:
    """New data with `wanted` configs added, or None when all are there already. An existing name with other
    content is refused (keys are immutable), unless seeding (`keep_existing`), where the present one stays."""
    text = data.get(MIG_FILE_KEY) or ""
    existing = _parse_mig(text, MIG_FILE_KEY) if text.strip() else {}
    added = {}
    for name, specs in wanted.items():
        if name in existing:
            if existing[name] != list(specs) and not keep_existing:
                raise DriverError(f"MIG config {name} already exists with other content; config names are immutable")
            continue
        added[name] = specs
    if not added:
        return None
    return {**data, MIG_FILE_KEY: render_mig_parted_config({**existing, **added})}


def _merge_plugin(data: dict, wanted: dict[str, str], keep_existing: bool = False) -> dict | None:
    added = {}
    for key, text in wanted.items():
        if key in data:
            if data[key] != text and not keep_existing:
                raise DriverError(f"device-plugin config {key} already exists with other content; keys are immutable")
            continue
        added[key] = text
    if not added:
        return None
    return {**data, **added}
