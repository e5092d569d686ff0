"""Every layout of the GPU Operator's default mig-parted config fits every GPU it targets (issue 14, point 1).

mig-parted applies an entry to the GPUs its `device-filter` names, or to every GPU when it has none; an entry
without a filter can only work on the GPUs that have all its profiles, so those are the ones it targets.
"""

from pathlib import Path

import pytest
import yaml

from sharing.mig import PRODUCTS, validate_layout

CONFIG = yaml.safe_load((Path(__file__).parent / "data" / "gpu-operator-default-mig-parted-config.yaml").read_text())

# Names of pre-production GB200 HGX boards, which production boards renamed (NVIDIA/mig-parted ebab1f77,
# "Use the correct mig partition settings for the GB200"); the operator's config still carries them.
PRE_PRODUCTION_ONLY = {"all-3g.95gb", "all-4g.95gb", "all-7g.189gb"}


def _filter_ids(entry) -> list[str]:
    ids = entry.get("device-filter", [])
    return [ids] if isinstance(ids, str) else list(ids)


def _entries() -> list:
    return [
        pytest.param(name, entry, id=f"{name}[{position}]")
        for name, entries in CONFIG["mig-configs"].items()
        for position, entry in enumerate(entries)
        if entry.get("mig-enabled") and entry.get("mig-devices")
    ]


def _targets(entry):
    ids = _filter_ids(entry)
    if ids:
        return [p for p in PRODUCTS.values() if set(p.pci_device_ids) & set(ids)]
    wanted = set(entry["mig-devices"])
    return [p for p in PRODUCTS.values() if p.mig_capable and wanted <= {profile.name for profile in p.profiles}]


def test_the_copy_is_a_v1_config_with_every_entry_on_all_devices():
    assert CONFIG["version"] == "v1"
    assert all(entry["devices"] == "all" for entries in CONFIG["mig-configs"].values() for entry in entries)


def test_every_device_the_config_names_is_a_product():
    named = {i for entries in CONFIG["mig-configs"].values() for entry in entries for i in _filter_ids(entry)}
    known = {i for product in PRODUCTS.values() for i in product.pci_device_ids}
    assert named - known == set()


@pytest.mark.parametrize(("name", "entry"), _entries())
def test_layout_fits_every_gpu_it_targets(name, entry):
    targets = _targets(entry)
    if name in PRE_PRODUCTION_ONLY:
        assert targets == []
        return
    assert targets, f"{name}: no product in the catalog has {sorted(entry['mig-devices'])}"
    for product in targets:
        result = validate_layout(product, entry["mig-devices"])
        assert result.valid, f"{name} on {product.name}: {result.errors}"


def test_the_filtered_entries_name_the_products_by_their_pci_ids():
    balanced = {i: entry["mig-devices"] for entry in CONFIG["mig-configs"]["all-balanced"] for i in _filter_ids(entry)}
    assert balanced["0x318210DE"] == {"1g.34gb": 2, "2g.67gb": 1, "3g.135gb": 1}
    assert PRODUCTS["NVIDIA-B300-SXM6-AC"].pci_device_ids == ("0x318210DE",)
    assert "0x234210DE" in PRODUCTS["NVIDIA-GH200-480GB"].pci_device_ids
