"""A sharing profile as plain values: NVIDIA's rules for it, what it renders to on a node, and what it yields.

Pure (no Django, no I/O): the server validates and previews with it, the agent and the simulator may reuse it.
Rules from docs/nvidia-contracts.md: §1.2 the cluster's MIG strategy, §3.2 time-slicing, §3.3 MPS, §3.5 resource
names, §1.3 reset on MIG mode change. A GPU outside the MIG catalog can still be passed through, time-sliced or
shared with MPS: the device plugin shares any GPU; only MIG needs Tessera to know the model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from sharing.mig import GpuProduct, UnknownProductError, get_product, mig_resources, validate_layout
from sharing.render import (
    GPU_RESOURCE,
    DevicePluginSpec,
    MigDeviceSpec,
    content_name,
    render_device_plugin_config,
    render_mig_parted_config,
)

MODES = ("passthrough", "mig", "mps", "time_slicing")
TIME_SLICE_INTERVALS = ("default", "short", "medium", "long")  # §5: nvidia-smi --set-timeslice 0..3
MPS_MAX_REPLICAS, MPS_MAX_REPLICAS_BEFORE_TURING = 48, 16  # §3.3, keyed on compute capability 7.5
ALL_GPUS = "all"
MIG_CONFIG_PREFIX, DEVICE_PLUGIN_PREFIX = "tessera-mig-", "tessera-dp-"
MIG_STRATEGIES = ("none", "single", "mixed")  # ClusterPolicy spec.mig.strategy (§1.2)
# The first device plugin that honours an explicit MPS failRequestsGreaterThanOne: false (§3.3, f14d3d12).
MPS_FAIL_FALSE_SINCE = (0, 20, 0)
_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+].*)?$")


@dataclass(frozen=True)
class KeptConfigs:
    """Configs a cluster had when a profile was imported from them (sharing.nvidia_import), kept with their names.

    Nodes labelled with those names run the profile already: it renders to them, not to content-addressed names,
    so the reconcile loop finds those nodes in sync and never re-rolls them. Only the import sets this, and any
    change to what the profile means drops it (the names would then lie about the content)."""

    mig_config: str | None  # a mig-parted config name; None: Tessera renders its own MIG config
    mig_entries: tuple[MigDeviceSpec, ...]
    device_plugin_key: str  # "": no label, the device plugin runs the ClusterPolicy's default config
    device_plugin_text: str

    def to_json(self) -> dict:
        entries = [
            {
                "devices": e.devices if e.devices == ALL_GPUS else list(e.devices),
                "device_filter": list(e.device_filter),
                "mig_enabled": e.mig_enabled,
                "mig_devices": dict(e.mig_devices),
            }
            for e in self.mig_entries
        ]
        return {
            "mig_config": self.mig_config,
            "mig_entries": entries,
            "device_plugin_config": self.device_plugin_key,
            "device_plugin": self.device_plugin_text,
        }

    @classmethod
    def from_json(cls, data: Mapping) -> KeptConfigs | None:
        """The kept configs stored on a profile (`SharingProfile.imported`), or None when it has none."""
        if not data:
            return None
        entries = tuple(
            MigDeviceSpec(e["devices"], e["mig_enabled"], e["mig_devices"], tuple(e["device_filter"]))
            for e in data.get("mig_entries", ())
        )
        return cls(data.get("mig_config"), entries, data["device_plugin_config"], data["device_plugin"])


@dataclass(frozen=True)
class ProfileSpec:
    """How a node's GPUs should be shared. `mig_layouts` maps "all" or a GPU index to a layout, or None (MIG off)."""

    mode: str
    target_products: tuple[str, ...] = ()
    mig_layouts: Mapping[str, Mapping[str, int] | None] = field(default_factory=dict)
    mig_strategy: str = "mixed"
    replicas: int = 1
    mps_active_thread_percentage: int | None = None
    mps_pinned_memory_limit_mib: int | None = None
    rename_shared: bool = False
    fail_requests_greater_than_one: bool = False
    time_slice_interval: str = "default"
    kept: KeptConfigs | None = None  # imported from a cluster's own configs: render to their names

    def layout_for(self, index: int) -> Mapping[str, int] | None:
        """A GPU's layout: its own entry, else the "all" entry, else MIG disabled."""
        if str(index) in self.mig_layouts:
            return self.mig_layouts[str(index)]
        return self.mig_layouts.get(ALL_GPUS)


@dataclass(frozen=True)
class NodeConfig:
    """What a profile means for one node: the NVIDIA configs to write and the names that select them."""

    mig_config_name: str | None  # None: the node has no MIG-capable GPU, leave nvidia.com/mig.config alone
    mig_entries: tuple[MigDeviceSpec, ...]
    mig_parted_text: str  # the file defining just `mig_config_name` ("" without one)
    device_plugin_key: str  # "" (kept configs only): no label, the ClusterPolicy's default config
    device_plugin_text: str
    config_id: str  # one name for the whole node config (what the agent compares)


def catalog_product(name: str) -> GpuProduct | None:
    """The MIG catalog's product for a GFD label, or None for a GPU Tessera does not know (shared whole only)."""
    try:
        return get_product(name)
    except UnknownProductError:
        return None


def _add(errors: dict[str, list[str]], key: str, message: str) -> None:
    errors.setdefault(key, []).append(message)


def validate_spec(spec: ProfileSpec) -> dict[str, list[str]]:
    """Every reason NVIDIA's stack would refuse this profile on its target products, keyed by field."""
    errors: dict[str, list[str]] = {}
    if spec.mode not in MODES:
        _add(errors, "mode", f"Mode must be one of {', '.join(MODES)}.")
        return errors
    products = []
    if not spec.target_products:
        _add(errors, "target_products", "Name at least one GPU product this profile is for.")
    for name in spec.target_products:
        product = catalog_product(name)
        if product is not None:
            products.append(product)
        elif spec.mode == "mig":
            _add(errors, "target_products", f"{name} is not in Tessera's MIG catalog: MIG needs a known GPU model.")
    _validate_sharing_fields(spec, products, errors)
    if spec.mode == "mig":
        _validate_mig(spec, products, errors)
    elif spec.mig_layouts:
        _add(errors, "mig_layouts", "MIG layouts apply only to MIG profiles.")
    return errors


def _validate_sharing_fields(spec: ProfileSpec, products: list[GpuProduct], errors) -> None:
    if spec.mode in ("mps", "time_slicing", "mig") and spec.replicas < 1:
        _add(errors, "replicas", "Replicas must be at least 1.")
    if spec.mode == "time_slicing" and spec.replicas < 2:
        _add(errors, "replicas", "Time-slicing needs at least 2 replicas per GPU.")
    if spec.mode == "mig" and spec.replicas == 1 and (spec.rename_shared or spec.fail_requests_greater_than_one):
        _add(errors, "replicas", "Renaming and failing large requests need time-slicing replicas (≥ 2) on MIG.")
    if spec.mode == "mps":
        cap = MPS_MAX_REPLICAS
        old = [p.name for p in products if p.compute_capability < (7, 5)]
        if old:
            cap = MPS_MAX_REPLICAS_BEFORE_TURING
        if spec.replicas < 2:
            _add(errors, "replicas", "MPS needs at least 2 replicas per GPU.")
        elif spec.replicas > cap:
            reason = f" ({', '.join(old)} is below compute capability 7.5)" if old else ""
            _add(errors, "replicas", f"MPS allows at most {cap} replicas per GPU{reason}.")
        pct = spec.mps_active_thread_percentage
        if pct is not None and not 1 <= pct <= 100:
            _add(errors, "mps_active_thread_percentage", "The active thread percentage must be between 1 and 100.")
        limit = spec.mps_pinned_memory_limit_mib
        if limit is not None:
            smallest = min((p.memory_mib for p in products), default=None)
            if limit < 1:
                _add(errors, "mps_pinned_memory_limit_mib", "The pinned memory limit must be at least 1 MiB.")
            elif smallest is not None and limit > smallest:
                _add(errors, "mps_pinned_memory_limit_mib", f"{limit} MiB is more than a GPU has ({smallest} MiB).")
    else:
        for name in ("mps_active_thread_percentage", "mps_pinned_memory_limit_mib"):
            if getattr(spec, name) is not None:
                _add(errors, name, "MPS limits apply only to MPS profiles.")
    if spec.mode == "passthrough" and (spec.rename_shared or spec.fail_requests_greater_than_one):
        _add(errors, "rename_shared", "Renaming and request limits apply only to shared GPUs.")
    if spec.mode == "passthrough" and spec.replicas != 1:
        _add(errors, "replicas", "A passthrough GPU has exactly one replica.")
    if spec.time_slice_interval not in TIME_SLICE_INTERVALS:
        _add(errors, "time_slice_interval", f"Time-slice length must be one of {', '.join(TIME_SLICE_INTERVALS)}.")


def _validate_mig(spec: ProfileSpec, products: list[GpuProduct], errors) -> None:
    if not spec.mig_layouts:
        _add(errors, "mig_layouts", "A MIG profile needs a layout for all GPUs or for each GPU index.")
        return
    for key in spec.mig_layouts:
        if key != ALL_GPUS and not (key.isdigit() and int(key) < 64):
            _add(errors, "mig_layouts", f"'{key}' is neither 'all' nor a GPU index.")
    for product in products:
        if not product.mig_capable:
            _add(errors, "target_products", f"{product.name} does not support MIG.")
            continue
        for key, layout in spec.mig_layouts.items():
            if layout is None:
                continue
            where = "every GPU" if key == ALL_GPUS else f"GPU {key}"
            for message in validate_layout(product, layout).errors:
                _add(errors, f"mig_layouts.{key}", f"{where}: {message}")
    if spec.mig_strategy not in ("single", "mixed"):
        _add(errors, "mig_strategy", "The MIG strategy must be single or mixed.")
    elif spec.mig_strategy == "single":
        problem = single_strategy_problem(list(spec.mig_layouts.values()))
        if problem:
            _add(errors, "mig_strategy", f"Under the single strategy {problem}; use the mixed strategy.")


def single_strategy_problem(layouts: Sequence[Mapping[str, int] | None]) -> str | None:
    """What the device plugin refuses under `single` in these per-GPU layouts (None: MIG off), or None.

    Its rule (k8s-device-plugin internal/rm/device_map.go, `assertAllMigDevicesAreValid` with uniform devices):
    MIG on for every GPU or none, at least one MIG device on each MIG GPU, and all MIG devices of one profile.
    Counts may differ between GPUs. Refused, the plugin advertises no GPU and GFD labels the node -MIG-INVALID."""
    if any(layout is None for layout in layouts):
        return "MIG must be on for every GPU of a node"
    if any(not any((layout or {}).values()) for layout in layouts):
        return "every MIG-enabled GPU needs at least one MIG device"
    profiles = sorted({name for layout in layouts for name, n in (layout or {}).items() if n})
    if len(profiles) > 1:
        return f"all MIG devices of a node must be of one profile, not {', '.join(profiles)}"
    return None


def strategy_problems(spec: ProfileSpec, strategy: str, gpu_indices: Sequence[int] = ()) -> list[str]:
    """Why the device plugin cannot run this profile under a cluster's MIG strategy, or [] (texts to read after
    "under which").

    The GPU Operator sets the plugin's MIG_STRATEGY from ClusterPolicy spec.mig.strategy, and it beats
    flags.migStrategy in any config Tessera renders (§1.2); "" (not set) leaves the rendered config in charge, so
    it has no rule. With a node's GPU indices, GPUs without a layout entry count as MIG off."""
    if spec.mode == "mps" and strategy == "mixed":
        return ["the device plugin refuses MPS (it exits at start-up: the node advertises no GPU)"]
    if spec.mode != "mig":
        return []
    if strategy == "none":
        return ["the device plugin advertises MIG-enabled GPUs whole, never their MIG devices"]
    if strategy == "single":
        layouts = [spec.layout_for(i) for i in gpu_indices] if gpu_indices else list(spec.mig_layouts.values())
        problem = single_strategy_problem(layouts)
        if problem:
            return [f"{problem}, or the device plugin advertises no GPU"]
    return []


def cluster_strategy_problems(
    spec: ProfileSpec, cluster: str, strategy: str, gpu_indices: Sequence[int] = ()
) -> list[str]:
    """`strategy_problems` phrased for an admin: the cluster, the setting that decides, and the rule."""
    return [
        f"cluster {cluster}'s ClusterPolicy sets spec.mig.strategy={strategy}, under which {problem}"
        for problem in strategy_problems(spec, strategy, gpu_indices)
    ]


def under_cluster_strategy(spec: ProfileSpec, strategy: str) -> ProfileSpec:
    """The profile as a cluster runs it: a ClusterPolicy strategy replaces the profile's MIG strategy, which then
    only decides where the ClusterPolicy sets none (§1.2) — rendered resources and allocatable follow it."""
    if spec.mode == "mig" and strategy in ("single", "mixed") and strategy != spec.mig_strategy:
        return replace(spec, mig_strategy=strategy)
    return spec


def plugin_version(text: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a device-plugin image tag ("v0.17.0"), None for a digest or anything else."""
    match = _VERSION_RE.match(text.strip())
    return (int(match[1]), int(match[2]), int(match[3] or 0)) if match else None


def mps_honours_fail_false(version: str) -> bool | None:
    """Whether this device-plugin version lets MPS clients ask for more than one replica when the config says
    failRequestsGreaterThanOne: false (v0.20.0+, §3.3); older plugins always refuse them. None: unknown version."""
    parsed = plugin_version(version)
    return None if parsed is None else parsed >= MPS_FAIL_FALSE_SINCE


def node_validation_errors(spec: ProfileSpec, gpus: Sequence[tuple[int, str]]) -> list[str]:
    """Why this profile cannot apply to a node with these (index, product) GPUs; empty when it can."""
    problems = []
    indices = {index for index, _ in gpus}
    if spec.target_products:
        others = sorted({product for _, product in gpus} - set(spec.target_products))
        if others:
            problems.append(f"the profile targets {', '.join(spec.target_products)}; the node has {', '.join(others)}")
    if spec.mode == "mig":
        missing = sorted(int(k) for k in spec.mig_layouts if k != ALL_GPUS and int(k) not in indices)
        if missing:
            problems.append(f"the node has no GPU {', '.join(map(str, missing))}")
        for index, product in gpus:
            layout = spec.layout_for(index)
            if layout is None:
                continue
            known = catalog_product(product)
            if known is None:
                problems.append(f"GPU {index}: {product} is not in Tessera's MIG catalog: MIG needs a known GPU model")
                continue
            problems.extend(f"GPU {index}: {message}" for message in validate_layout(known, layout).errors)
    return problems


def _mig_entries(spec: ProfileSpec, gpus: Sequence[tuple[int, GpuProduct]]) -> tuple[MigDeviceSpec, ...]:
    """Group the node's MIG-capable GPUs by (product, layout); one entry for all when they all agree."""
    groups: dict[tuple, list[int]] = {}
    for index, product in gpus:
        layout = spec.layout_for(index) if spec.mode == "mig" else None
        key = (product.pci_device_id, tuple(sorted((layout or {}).items())), layout is not None)
        groups.setdefault(key, []).append(index)
    mixed_products = len({key[0] for key in groups}) > 1
    entries = []
    for (pci_id, items, enabled), indices in sorted(groups.items(), key=lambda kv: kv[1]):
        entries.append(
            MigDeviceSpec(
                devices=ALL_GPUS if len(groups) == 1 else tuple(indices),
                mig_enabled=enabled,
                mig_devices=dict(items) if enabled else {},
                device_filter=(pci_id,) if mixed_products else (),
            )
        )
    return tuple(entries)


def _device_plugin(spec: ProfileSpec, gpus: Sequence[tuple[int, GpuProduct | None]]) -> DevicePluginSpec:
    if spec.mode in ("mps", "time_slicing"):
        # MPS: an absent value means true (v0.20.0+) or is ignored (older), so false is written out (§3.3).
        # Time-slicing: absent means false in every version (§3.2); kept absent so existing configs keep their names.
        explicit = spec.mode == "mps" or spec.fail_requests_greater_than_one
        return DevicePluginSpec(
            sharing=spec.mode,
            replicas=spec.replicas,
            rename_by_default=spec.rename_shared,
            fail_requests_greater_than_one=spec.fail_requests_greater_than_one if explicit else None,
        )
    if spec.mode == "mig":
        strategy = spec.mig_strategy
        if spec.replicas > 1:
            resources = sorted({r for r in _mig_allocatable(spec, gpus)})
            return DevicePluginSpec(
                mig_strategy=strategy,
                sharing="time_slicing",
                replicas=spec.replicas,
                rename_by_default=spec.rename_shared,
                fail_requests_greater_than_one=spec.fail_requests_greater_than_one or None,
                resources=tuple(resources) if strategy == "mixed" else (GPU_RESOURCE,),
            )
        return DevicePluginSpec(mig_strategy=strategy)
    return DevicePluginSpec()


def node_config(spec: ProfileSpec, gpus: Sequence[tuple[int, str]]) -> NodeConfig:
    """Render the profile for one node's GPUs into content-addressed NVIDIA configs (same content, same names);
    an imported profile renders to the names and contents it was imported from (`ProfileSpec.kept`)."""
    resolved = [(index, catalog_product(product)) for index, product in sorted(gpus)]
    mig_capable = [(index, product) for index, product in resolved if product is not None and product.mig_capable]
    kept = spec.kept
    if kept is not None and kept.mig_config and mig_capable:
        entries, mig_name = kept.mig_entries, kept.mig_config
    else:
        entries = _mig_entries(spec, mig_capable) if mig_capable else ()
        mig_name = content_name(MIG_CONFIG_PREFIX, render_mig_parted_config({"x": entries})) if entries else None
    if kept is not None:
        plugin_key, plugin_text = kept.device_plugin_key, kept.device_plugin_text
    else:
        plugin_text = render_device_plugin_config(_device_plugin(spec, resolved))
        plugin_key = content_name(DEVICE_PLUGIN_PREFIX, plugin_text)
    return NodeConfig(
        mig_config_name=mig_name,
        mig_entries=entries,
        mig_parted_text=render_mig_parted_config({mig_name: entries}) if mig_name else "",
        device_plugin_key=plugin_key,
        device_plugin_text=plugin_text,
        config_id=content_name("tessera-", f"{mig_name or ''}\n{plugin_key}"),
    )


def _mig_allocatable(spec: ProfileSpec, gpus: Sequence[tuple[int, GpuProduct | None]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for index, product in gpus:
        layout = spec.layout_for(index) if product is not None and product.mig_capable else None
        if layout is None:
            totals[GPU_RESOURCE] = totals.get(GPU_RESOURCE, 0) + 1
            continue
        for resource, count in mig_resources(product, layout).items():
            totals[resource] = totals.get(resource, 0) + count
    return totals


def allocatable(spec: ProfileSpec, gpus: Sequence[tuple[int, str]]) -> dict[str, int]:
    """The GPU resources a node advertises under this profile (device plugin rules, §3.2, §3.5)."""
    resolved = [(index, catalog_product(product)) for index, product in gpus]
    count = len(resolved)
    suffix = ".shared" if spec.rename_shared else ""
    if spec.mode in ("mps", "time_slicing"):
        return {GPU_RESOURCE + suffix: count * spec.replicas} if count else {}
    if spec.mode == "passthrough":
        return {GPU_RESOURCE: count} if count else {}
    totals = _mig_allocatable(spec, resolved)
    if spec.mig_strategy == "single":
        totals = {GPU_RESOURCE: sum(totals.values())}
    if spec.replicas > 1:
        totals = {name + suffix: n * spec.replicas for name, n in totals.items()}
    return dict(sorted(totals.items()))


def mig_mode_changes(spec: ProfileSpec, gpus: Sequence[tuple[int, str, bool]]) -> list[int]:
    """Indices of GPUs whose MIG mode flips (a GPU reset or a node reboot, §1.3) for (index, product, enabled)."""
    flips = []
    for index, product, enabled in gpus:
        known = catalog_product(product)
        if known is None or not known.mig_capable:
            continue
        wanted = spec.mode == "mig" and spec.layout_for(index) is not None
        if wanted != enabled:
            flips.append(index)
    return flips
