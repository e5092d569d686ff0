"""What a cluster's own NVIDIA configs become in Tessera: a sharing profile per configuration its nodes run.

Pure (no Django, no I/O). In: the ClusterPolicy's choices, the texts of the mig-parted and device-plugin ConfigMaps it
names, the GPU nodes' two labels and their GPUs (Tessera's inventory). Out: a verdict per config name — refused with
the tool's own reason and rule (sharing.nvidia_configs), or accepted — and the profiles an import would create.

A node runs a pair of configs: its `nvidia.com/mig.config` (a mig-parted config) and `nvidia.com/device-plugin.config`
(a key of the plugin ConfigMap; no label means the ClusterPolicy's default key). So a profile is made per pair some
node runs, and per config no node runs (alone). Each profile keeps the pair's names (sharing.spec.KeptConfigs): once
it is the default of the pool of the nodes that run it, the reconcile loop finds them in sync and re-rolls nothing —
the same names, so neither MIG Manager nor the device plugin sees a change. Where a mig-parted config gives GPU
products different layouts (device-filter entries), the pair yields one profile per group of products.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sharing.mig import UnknownProductError, get_product, mig_resources
from sharing.nvidia_configs import (
    RULE_MPS_MIG,
    RULE_SELECTED,
    RULE_SELECTED_KEY,
    PluginConfig,
    Rejected,
    device_filter_matches,
    plugin_start_error,
    read_device_plugin,
    read_mig_parted,
)
from sharing.render import GPU_RESOURCE, MigDeviceSpec
from sharing.spec import KeptConfigs, ProfileSpec, validate_spec

MIG_PARTED, DEVICE_PLUGIN = "mig-parted", "device-plugin"
RULE_TESSERA = "Tessera (sharing.spec.validate_spec: what a profile can say)"
TESSERA_PREFIX = "tessera-"  # configs Tessera wrote itself: nothing to import
NAME_LIMIT = 100  # SharingProfile.name


@dataclass(frozen=True)
class NodeLabels:
    """A GPU node's two config labels ("" when absent) and its GPUs as (index, product) from the inventory."""

    name: str
    mig_config: str = ""
    device_plugin_config: str = ""
    gpus: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True)
class ClusterConfigs:
    """What a cluster's GPU Operator runs: the ClusterPolicy's choices and the ConfigMaps' contents."""

    cluster: str
    policy: str
    mig_strategy: str = ""  # spec.mig.strategy: beats flags.migStrategy (contracts §1.2)
    mig_configmap: str = ""  # spec.migManager.config.name
    mig_parted_text: str | None = None  # its config.yaml; None: no such ConfigMap or key
    plugin_configmap: str = ""  # spec.devicePlugin.config.name
    plugin_default: str = ""  # spec.devicePlugin.config.default
    plugin_configs: Mapping[str, str] = field(default_factory=dict)  # its data; empty: none
    nodes: tuple[NodeLabels, ...] = ()
    products: tuple[str, ...] = ()  # GPU products the inventory knows in this cluster


@dataclass(frozen=True)
class ConfigVerdict:
    """One named config: accepted, or refused with the component's reason and rule; the nodes that select it."""

    kind: str  # MIG_PARTED or DEVICE_PLUGIN
    name: str
    refusal: str = ""
    rule: str = ""
    nodes: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    profiles: tuple[str, ...] = ()  # names of the profiles made from it

    @property
    def accepted(self) -> bool:
        return not self.refusal


@dataclass(frozen=True)
class ProposedProfile:
    """A profile the import would create (`spec`), or why it cannot (`refusal`), for a pair of config names."""

    name: str
    mig_config: str | None
    device_plugin_config: str  # "": no label (the ClusterPolicy's default)
    products: tuple[str, ...]
    nodes: tuple[str, ...]
    spec: ProfileSpec | None = None
    refusal: str = ""
    rule: str = ""
    notes: tuple[str, ...] = ()

    @property
    def accepted(self) -> bool:
        return self.spec is not None


@dataclass(frozen=True)
class ImportPlan:
    cluster: str
    policy: str
    configs: tuple[ConfigVerdict, ...]
    profiles: tuple[ProposedProfile, ...]
    problems: tuple[str, ...] = ()  # about the ConfigMaps as a whole


@dataclass(frozen=True)
class _Read:
    """Everything read from the two ConfigMaps, per name: entries or plugin config, or a refusal."""

    mig: dict[str, list[dict[str, Any]] | Rejected]
    plugin: dict[str, tuple[PluginConfig, str] | Rejected]
    notes: dict[tuple[str, str], tuple[str, ...]]
    problems: tuple[str, ...]


def _imported(name: str) -> bool:
    return bool(name) and not name.startswith(TESSERA_PREFIX)


def _read_mig(configs: ClusterConfigs, problems: list[str]) -> tuple[dict[str, Any], Rejected | None]:
    """The named mig-parted configs, or why none can be read (then every name is refused with it)."""
    if not configs.mig_configmap:
        problems.append(
            f"ClusterPolicy {configs.policy} names no mig-parted ConfigMap (spec.migManager.config.name): MIG Manager "
            "generates its configs per node, so there is no file to import MIG configs from"
        )
        return {}, Rejected("no mig-parted ConfigMap to read", "ClusterPolicy spec.migManager.config.name")
    if configs.mig_parted_text is None:
        problems.append(f"ConfigMap {configs.mig_configmap} is missing or has no key config.yaml")
        return {}, Rejected(f"ConfigMap {configs.mig_configmap} has no config.yaml", "contracts §1.4")
    try:
        return read_mig_parted(configs.mig_parted_text), None
    except Rejected as error:
        problems.append(f"mig-parted refuses ConfigMap {configs.mig_configmap}: {error}")
        return {}, error


def _read(configs: ClusterConfigs) -> _Read:
    problems: list[str] = []
    parsed, file_error = _read_mig(configs, problems)
    mig_names = set(parsed) | {n.mig_config for n in configs.nodes}
    mig: dict[str, Any] = {}
    notes: dict[tuple[str, str], tuple[str, ...]] = {}
    for name in sorted(n for n in mig_names if _imported(n)):
        if file_error is not None:
            mig[name] = file_error
        elif name not in parsed:
            mig[name] = Rejected(f"selected mig-config not present: {name}", RULE_SELECTED)
        else:
            mig[name] = parsed[name]
            empty = [str(i) for i, entry in enumerate(parsed[name]) if entry["devices"] == ()]
            if empty:
                notes[MIG_PARTED, name] = (f"entries {', '.join(empty)} match no GPU (devices: [])",)
    if not configs.plugin_configmap:
        problems.append(f"ClusterPolicy {configs.policy} names no device-plugin ConfigMap (spec.devicePlugin.config)")
    keys = set(configs.plugin_configs) | {n.device_plugin_config for n in configs.nodes} | {configs.plugin_default}
    plugin: dict[str, Any] = {}
    for key in sorted(k for k in keys if _imported(k)):
        if key not in configs.plugin_configs:
            plugin[key] = Rejected(f"specified config {key} does not exist", RULE_SELECTED_KEY)
            continue
        text = configs.plugin_configs[key]
        try:
            config = read_device_plugin(text)
        except Rejected as error:
            plugin[key] = error
            continue
        plugin[key] = plugin_start_error(config, configs.mig_strategy) or (config, text)
        notes[DEVICE_PLUGIN, key] = config.notes
    return _Read(mig, plugin, notes, tuple(problems))


def _pairs(configs: ClusterConfigs, read: _Read) -> dict[tuple[str | None, str], list[NodeLabels]]:
    """Pairs (mig config or None, plugin key or "") nodes run, then each config no node runs, alone."""
    pairs: dict[tuple[str | None, str], list[NodeLabels]] = {}
    for node in configs.nodes:
        if node.mig_config.startswith(TESSERA_PREFIX) or node.device_plugin_config.startswith(TESSERA_PREFIX):
            continue  # Tessera runs this node already
        pairs.setdefault((node.mig_config or None, node.device_plugin_config), []).append(node)
    used_mig = {mig for mig, _ in pairs}
    used_keys = {key or configs.plugin_default for _, key in pairs}
    for name, value in read.mig.items():
        if name not in used_mig and not isinstance(value, Rejected):
            pairs[name, ""] = []
    for key, value in read.plugin.items():
        if key not in used_keys and not isinstance(value, Rejected):
            pairs[None, key] = []
    return pairs


def _layouts(entries: list[dict[str, Any]], product) -> dict[str, Any]:
    """Per GPU ("all" or an index) the layout mig-parted gives a GPU of `product` (None: MIG off); entries apply
    in order, so a later one wins for the GPUs it names. Empty: no entry is for this product."""
    ids = [int(pci, 16) for pci in product.pci_device_ids]
    layouts: dict[str, Any] = {}
    for entry in entries:
        if not any(device_filter_matches(entry["device_filter"], pci) for pci in ids):
            continue
        layout = dict(entry["mig_devices"]) if entry["mig_enabled"] else None
        if entry["devices"] == "all":
            layouts = {"all": layout}
        else:
            layouts.update({str(index): layout for index in entry["devices"]})
    return layouts


def _sharing_fields(plugin: PluginConfig, mig_on: bool, expected: set[str]) -> tuple[dict, str, str]:
    """The profile fields the device plugin's config decides, or (_, refusal, rule)."""
    block, sharing = plugin.replicated, plugin.sharing
    if block is None:
        return {"mode": "mig" if mig_on else "passthrough"}, "", ""
    if mig_on and sharing == "mps":
        return {}, "sharing using MPS is not supported for MIG devices", RULE_MPS_MIG
    shared = {resource.name: resource.replicas for resource in block.resources}
    wanted = expected if mig_on else {GPU_RESOURCE}
    if not mig_on and GPU_RESOURCE not in shared:
        return {"mode": "passthrough"}, "", ""  # it shares no whole GPU: they are advertised unshared
    replicas = {shared.get(name) for name in wanted}
    if None in replicas or len(replicas) != 1:
        missing = ", ".join(sorted(name for name in wanted if name not in shared)) or "some of them"
        reason = f"Tessera shares every GPU resource of a node alike, with one replica count; here not ({missing})"
        return {}, reason, RULE_TESSERA
    fail = block.fail_requests_greater_than_one
    return (
        {
            "mode": "mig" if mig_on else sharing,
            "replicas": replicas.pop(),
            "rename_shared": block.rename_by_default,
            "fail_requests_greater_than_one": (sharing == "mps") if fail is None else fail,  # contracts §3.2, §3.3
        },
        "",
        "",
    )


def _spec(layouts: dict[str, Any], plugin: PluginConfig, strategy: str, products: tuple[str, ...]):
    """A ProfileSpec for these products, or (None, refusal, rule)."""
    mig_on = any(layout is not None for layout in layouts.values())
    if mig_on and strategy not in ("single", "mixed"):
        return (
            None,
            f"MIG is on but the device plugin's MIG strategy is {strategy}: nothing advertises MIG devices",
            RULE_TESSERA,
        )
    if mig_on:  # the layouts first: what the plugin shares is read against MIG devices that exist
        errors = validate_spec(ProfileSpec("mig", products, layouts, strategy))
        if errors:
            return None, _joined(errors), RULE_TESSERA
    expected = {GPU_RESOURCE} if strategy == "single" else set()
    if strategy == "mixed":
        for name in products:
            for layout in layouts.values():
                expected |= set(mig_resources(get_product(name), layout)) if layout is not None else {GPU_RESOURCE}
    fields, refusal, rule = _sharing_fields(plugin, mig_on, expected)
    if refusal:
        return None, refusal, rule
    spec = ProfileSpec(
        target_products=products,
        mig_layouts=layouts if mig_on else {},
        mig_strategy=strategy if mig_on else "mixed",
        **fields,
    )
    errors = validate_spec(spec)
    if errors:
        return None, _joined(errors), RULE_TESSERA
    return spec, "", ""


def _joined(errors: dict[str, list[str]]) -> str:
    return "; ".join(message for messages in errors.values() for message in messages)


def _pair_name(mig: str | None, key: str) -> str:
    if mig is None:
        return key
    return mig if not key else f"{mig} + {key}"


def _products(configs: ClusterConfigs, nodes: list[NodeLabels], *, mig_only: bool) -> tuple[list, list[str]]:
    """The catalog products to target — those of the pair's nodes, else the cluster's (MIG-capable ones for a MIG
    config no node runs) — and the names the catalog does not know."""
    names = sorted({product for node in nodes for _, product in node.gpus}) or sorted(configs.products)
    known, unknown = [], []
    for name in names:
        try:
            product = get_product(name)
        except UnknownProductError:
            unknown.append(name)
            continue
        if product.mig_capable or not mig_only:
            known.append(product)
    return known, unknown


def _candidates(configs: ClusterConfigs, read: _Read, pair, nodes: list[NodeLabels]) -> list[ProposedProfile]:
    """The profiles one pair of config names makes: one per group of products that get the same layouts."""
    mig, key = pair
    base = ProposedProfile(_pair_name(mig, key), mig, key, (), tuple(sorted(n.name for n in nodes)))
    entries = read.mig.get(mig) if mig is not None else None
    effective = key or configs.plugin_default
    plugin = read.plugin.get(effective, (PluginConfig(), "")) if effective else (PluginConfig(), "")
    for refused in (entries, plugin):
        if isinstance(refused, Rejected):
            return [replace(base, refusal=str(refused), rule=refused.rule)]
    products, unknown = _products(configs, nodes, mig_only=mig is not None and not nodes)
    notes = tuple(f"{name}: not in Tessera's MIG catalog, left out" for name in unknown)
    if not products:
        reason = "no GPU product to target: Tessera's inventory has no GPU of this cluster (sync it first)"
        return [replace(base, refusal=reason, rule=RULE_TESSERA, notes=notes)]
    groups: dict[object, tuple[dict | str, list[str]]] = {}  # layouts (or a refusal) -> products
    for product in products:
        layouts = _layouts(entries, product) if entries is not None and product.mig_capable else {}
        if entries is not None and product.mig_capable and not layouts:
            layouts = f"mig-parted config {mig} has no entry for {product.name}: its GPUs would be left as they are"
        groups.setdefault(repr(layouts), (layouts, []))[1].append(product.name)
    strategy = configs.mig_strategy or plugin[0].mig_strategy or "none"
    kept = KeptConfigs(
        mig_config=mig,
        mig_entries=tuple(
            MigDeviceSpec(e["devices"], e["mig_enabled"], e["mig_devices"], e["device_filter"]) for e in entries or ()
        ),
        device_plugin_key=key,
        device_plugin_text=plugin[1],
    )
    result = []
    for layouts, names in groups.values():
        name = base.name if len(groups) == 1 else f"{base.name} ({', '.join(names)})"
        group_nodes = tuple(sorted(n.name for n in nodes if not n.gpus or {p for _, p in n.gpus} & set(names)))
        proposed = replace(base, name=name[:NAME_LIMIT], products=tuple(names), nodes=group_nodes, notes=notes)
        if isinstance(layouts, str):
            result.append(replace(proposed, refusal=layouts, rule=RULE_TESSERA))
            continue
        spec, refusal, rule = _spec(layouts, plugin[0], strategy, tuple(names))
        if spec is None:
            result.append(replace(proposed, refusal=refusal, rule=rule))
        else:
            result.append(replace(proposed, spec=replace(spec, kept=kept)))
    return result


def plan_import(configs: ClusterConfigs) -> ImportPlan:
    """The verdict on every config name the cluster has or its nodes select, and the profiles an import makes."""
    read = _read(configs)
    profiles = []
    for pair, nodes in sorted(_pairs(configs, read).items(), key=lambda item: (item[0][0] or "", item[0][1])):
        profiles += _candidates(configs, read, pair, nodes)
    verdicts = []
    for kind, values in ((MIG_PARTED, read.mig), (DEVICE_PLUGIN, read.plugin)):
        for name, value in values.items():
            if kind == MIG_PARTED:
                selecting = [n.name for n in configs.nodes if n.mig_config == name]
                made = [p.name for p in profiles if p.mig_config == name]
            else:
                selecting = [
                    n.name for n in configs.nodes if (n.device_plugin_config or configs.plugin_default) == name
                ]
                made = [p.name for p in profiles if (p.device_plugin_config or configs.plugin_default) == name]
            refused = value if isinstance(value, Rejected) else None
            verdicts.append(
                ConfigVerdict(
                    kind=kind,
                    name=name,
                    refusal=str(refused) if refused else "",
                    rule=refused.rule if refused else "",
                    nodes=tuple(sorted(selecting)),
                    notes=read.notes.get((kind, name), ()),
                    profiles=tuple(made),
                )
            )
    return ImportPlan(configs.cluster, configs.policy, tuple(verdicts), tuple(profiles), read.problems)
