"""The mig-parted configs the GPU Operator ships and generates (contracts §1.4, schema §2.1)."""

from __future__ import annotations

import yaml

from sharing.mig import PRODUCTS, GpuProduct, MigProfile


def _base_profiles(product: GpuProduct) -> dict[int, MigProfile]:
    """Per compute size, the base (no attribute) profile with the highest max count, as the builder picks."""
    best: dict[int, MigProfile] = {}
    for profile in product.profiles:
        if profile.attribute:
            continue
        current = best.get(profile.compute_slices)
        if current is None or profile.max_count > current.max_count:
            best[profile.compute_slices] = profile
    return best


def balanced_layout(product: GpuProduct) -> dict[str, int]:
    """2×1g + 1×2g + 1×3g on 7-slice GPUs, 2×1g + 1×2g on 4-slice GPUs (mig-parted balanced.go, §1.4)."""
    base = _base_profiles(product)
    sizes = (1, 1, 2, 3) if product.compute_slices == 7 else (1, 1, 2)
    layout: dict[str, int] = {}
    for size in sizes:
        if size not in base:
            return {}
        layout[base[size].name] = layout.get(base[size].name, 0) + 1
    return layout


def config_name(profile: MigProfile) -> str:
    return "all-" + profile.name.replace("+", ".")


def _entries(product: GpuProduct, device_filter: bool) -> dict[str, dict]:
    def spec(enabled: bool, devices: dict[str, int] | None = None) -> dict:
        entry: dict = {"devices": "all"}
        if device_filter:
            entry["device-filter"] = list(product.pci_device_ids)
        entry["mig-enabled"] = enabled
        if enabled:
            entry["mig-devices"] = devices or {}
        return entry

    entries = {"all-disabled": spec(False), "all-enabled": spec(True)}
    if balanced := balanced_layout(product):
        entries["all-balanced"] = spec(True, balanced)
    for profile in product.profiles:
        entries[config_name(profile)] = spec(True, {profile.name: profile.max_count})
    return entries


def generated_config(product: GpuProduct) -> dict:
    """What mig-manager >= v0.14 generates from NVML for a node with one GPU model (no device-filter needed)."""
    return {"version": "v1", "mig-configs": {name: [entry] for name, entry in _entries(product, False).items()}}


def default_config() -> dict:
    """The static `default-mig-parted-config`: every catalog product, told apart by `device-filter`."""
    configs: dict[str, list[dict]] = {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
    }
    for product in PRODUCTS.values():
        if not product.mig_capable:
            continue
        for name, entry in _entries(product, True).items():
            entries = configs.setdefault(name, [])
            if name not in ("all-disabled", "all-enabled") and entry not in entries:
                entries.append(entry)  # models sharing a PCI ID (GH200 120GB / 480GB) share their entries
    return {"version": "v1", "mig-configs": configs}


def dump(config: dict) -> str:
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=None, width=200)
