"""MIG catalog: what each GPU model can be cut into (nvidia-contracts.md §4, §4.1)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass

# §2.1: <g>g.<mem>gb, optional <c>c. compute-instance prefix, optional attribute.
PROFILE_NAME_RE = re.compile(r"^(?:(?P<ci>\d+)c\.)?(?P<g>\d+)g\.(?P<mem>\d+)gb(?P<attr>\+me\.all|\+me|\+gfx|-me)?$")


def profile_name_key(name: str) -> tuple:
    """Sort key for profile names, larger slices first, so every listing of a layout reads the same way."""
    match = PROFILE_NAME_RE.match(name)
    if match is None:
        return (1, 0, 0, "", name)
    return (0, -int(match["g"]), -int(match["mem"]), match["attr"] or "", name)


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of a product, with the memory-slice starts NVIDIA allows it (§4, §4.1)."""

    name: str
    profile_id: int
    compute_slices: int
    memory_slices: int
    memory_mib: int
    multiprocessors: int
    max_count: int
    starts: tuple[int, ...]
    media_extensions: bool = False

    @property
    def resource_name(self) -> str:
        """The resource the device plugin advertises under migStrategy mixed (§3.5: '+' becomes '.')."""
        return "nvidia.com/mig-" + self.name.replace("+", ".")


@dataclass(frozen=True)
class GpuProduct:
    """A GPU model as GPU Feature Discovery names it, with its MIG profiles when it has any."""

    name: str
    display_name: str
    memory_mib: int
    architecture: str
    compute_capability: tuple[int, int]
    pci_device_id: str
    multiprocessors: int
    mig_capable: bool
    compute_slices: int = 0
    memory_slices: int = 0
    profiles: tuple[MigProfile, ...] = ()

    def mig_profile(self, name: str) -> MigProfile | None:
        """The profile called `name` on this product, or None: names differ per model (§4)."""
        return next((profile for profile in self.profiles if profile.name == name), None)


class UnknownProductError(LookupError):
    """A GPU model the catalog does not describe; says which models it does."""

    def __init__(self, name: str, known: list[str]):
        self.name = name
        self.known = known
        close = difflib.get_close_matches(str(name), known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        super().__init__(f"Unknown GPU product {name!r}{hint}; known products: {', '.join(known)}")


# §4.1 placements on 7-compute / 8-memory-slice GPUs; the guide shows H100-80GB, H200 and B200 only as
# diagrams, so they reuse the A100 / H100 NVL table (UNVERIFIED there, per §4.1).
_STARTS_1G = (0, 1, 2, 3, 4, 5, 6)  # a 1g cannot start at 7
_STARTS_1G_DOUBLE = (0, 2, 4, 6)
_STARTS_2G = (0, 2, 4)
_STARTS_3G = (0, 4)
_STARTS_FULL_FROM_0 = (0,)


def _seven_slice_profiles(
    memory_gb: tuple[int, int, int, int, int], mib_per_slice: int, sms: tuple[int, int, int, int, int, int]
) -> tuple[MigProfile, ...]:
    """Profiles of a 7/8-slice GPU from the names' GB (1g, 1g double, 2g, 3g/4g, 7g) and SMs per profile."""
    gb_1g, gb_1g_double, gb_2g, gb_4g, gb_7g = memory_gb
    sm_1g, sm_1g_double, sm_2g, sm_3g, sm_4g, sm_7g = sms
    rows = (
        # name, profile id (§4.1), compute slices, memory slices, SMs, max count, starts, +me
        (f"1g.{gb_1g}gb", 19, 1, 1, sm_1g, 7, _STARTS_1G, False),
        (f"1g.{gb_1g}gb+me", 20, 1, 1, sm_1g, 1, _STARTS_1G, True),
        (f"1g.{gb_1g_double}gb", 15, 1, 2, sm_1g_double, 4, _STARTS_1G_DOUBLE, False),
        (f"2g.{gb_2g}gb", 14, 2, 2, sm_2g, 3, _STARTS_2G, False),
        (f"3g.{gb_4g}gb", 9, 3, 4, sm_3g, 2, _STARTS_3G, False),
        (f"4g.{gb_4g}gb", 5, 4, 4, sm_4g, 1, _STARTS_FULL_FROM_0, False),
        (f"7g.{gb_7g}gb", 0, 7, 8, sm_7g, 1, _STARTS_FULL_FROM_0, False),
    )
    return tuple(
        MigProfile(name, profile_id, compute, memory, memory * mib_per_slice, sm, max_count, starts, me)
        for name, profile_id, compute, memory, sm, max_count, starts, me in rows
    )


# Profile memory is proportional to memory slices, from the 1g size: 9984 MiB (H100-80GB, GFD label in §3.6),
# 4864 / 9856 / 5836 (A100-40GB / A100-80GB / A30, NVIDIA's go-nvml fixtures), 16384 (H200, a real 1g.18gb);
# H100 NVL and B200 are estimates. SMs: A100 and Hopper 132-SM parts from §4 / §3.6; H100 PCIe and B200 are
# estimates. GPU totals are what nvidia-smi usually reports. Profile IDs of the A30 are not in the contracts
# (§4.1 lists A100 / H100 NVL only); 14/21/5/6/0 are from nvidia-smi on an A30 (UNVERIFIED).
_A100_40GB_PROFILES = _seven_slice_profiles((5, 10, 10, 20, 40), 4864, (14, 14, 28, 42, 56, 98))
_A100_80GB_PROFILES = _seven_slice_profiles((10, 20, 20, 40, 80), 9856, (14, 14, 28, 42, 56, 98))
_H100_80GB_PROFILES = _seven_slice_profiles((10, 20, 20, 40, 80), 9984, (16, 26, 32, 60, 64, 132))
_H100_PCIE_PROFILES = _seven_slice_profiles((10, 20, 20, 40, 80), 9984, (14, 22, 28, 52, 56, 114))
_H100_94GB_PROFILES = _seven_slice_profiles((12, 24, 24, 47, 94), 11520, (16, 26, 32, 60, 64, 132))
_H200_PROFILES = _seven_slice_profiles((18, 35, 35, 71, 141), 16384, (16, 26, 32, 60, 64, 132))
_B200_PROFILES = _seven_slice_profiles((23, 45, 45, 90, 180), 22528, (18, 28, 36, 66, 72, 148))
# §4.1: A30 placements 1g {0,1,2,3}:1, 2g {0,2}:2, 4g {0}:4; §4: one +me instance per GPU.
_A30_PROFILES = (
    MigProfile("1g.6gb", 14, 1, 1, 5836, 14, 4, (0, 1, 2, 3)),
    MigProfile("1g.6gb+me", 21, 1, 1, 5836, 14, 1, (0, 1, 2, 3), media_extensions=True),
    MigProfile("2g.12gb", 5, 2, 2, 11672, 28, 2, (0, 2)),
    MigProfile("2g.12gb+me", 6, 2, 2, 11672, 28, 1, (0, 2), media_extensions=True),
    MigProfile("4g.24gb", 0, 4, 4, 23344, 56, 1, (0,)),
)


def _mig(name, display, memory, arch, cc, pci, sms, profiles, compute_slices=7, memory_slices=8) -> GpuProduct:
    return GpuProduct(name, display, memory, arch, cc, pci, sms, True, compute_slices, memory_slices, profiles)


def _whole(name, display, memory, arch, cc, pci, sms) -> GpuProduct:
    return GpuProduct(name, display, memory, arch, cc, pci, sms, False)


# PCI IDs of MIG GPUs are the device-filter values of the GPU Operator's default mig-parted config (§1.4);
# those of L4, T4 and L40S are the well-known NVML values.
PRODUCTS: dict[str, GpuProduct] = {
    product.name: product
    for product in (
        _mig("NVIDIA-A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", 40960, "ampere", (8, 0), "0x20B010DE", 108,
             _A100_40GB_PROFILES),
        _mig("NVIDIA-A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", 81920, "ampere", (8, 0), "0x20B210DE", 108,
             _A100_80GB_PROFILES),
        _mig("NVIDIA-A100-80GB-PCIe", "NVIDIA A100 80GB PCIe", 81920, "ampere", (8, 0), "0x20B510DE", 108,
             _A100_80GB_PROFILES),
        _mig("NVIDIA-A30", "NVIDIA A30", 24576, "ampere", (8, 0), "0x20B710DE", 56, _A30_PROFILES, 4, 4),
        _mig("NVIDIA-H100-80GB-HBM3", "NVIDIA H100 80GB HBM3", 81559, "hopper", (9, 0), "0x233010DE", 132,
             _H100_80GB_PROFILES),
        _mig("NVIDIA-H100-PCIe", "NVIDIA H100 PCIe", 81559, "hopper", (9, 0), "0x233110DE", 114,
             _H100_PCIE_PROFILES),
        _mig("NVIDIA-H100-NVL", "NVIDIA H100 NVL", 95830, "hopper", (9, 0), "0x232110DE", 132,
             _H100_94GB_PROFILES),
        _mig("NVIDIA-H200", "NVIDIA H200", 143771, "hopper", (9, 0), "0x233510DE", 132, _H200_PROFILES),
        _mig("NVIDIA-B200", "NVIDIA B200", 183359, "blackwell", (10, 0), "0x290110DE", 148, _B200_PROFILES),
        _whole("NVIDIA-L4", "NVIDIA L4", 23034, "ada-lovelace", (8, 9), "0x27B810DE", 58),
        _whole("NVIDIA-L40S", "NVIDIA L40S", 46068, "ada-lovelace", (8, 9), "0x26B910DE", 142),
        _whole("Tesla-T4", "Tesla T4", 15360, "turing", (7, 5), "0x1EB810DE", 40),
    )
}  # fmt: skip


def get_product(name: str) -> GpuProduct:
    """Find a product by its GFD label or NVML name, failing loudly with the models the catalog knows."""
    # §3.6: GFD replaces spaces with '-' and appends -MIG-<profile> (single strategy) or -SHARED.
    key = re.sub(r"-MIG-.*$", "", name.strip().replace(" ", "-")).removesuffix("-SHARED")
    try:
        return PRODUCTS[key]
    except KeyError:
        raise UnknownProductError(name, sorted(PRODUCTS)) from None


def mig_resources(product: GpuProduct | str, devices: Mapping[str, int]) -> dict[str, int]:
    """Allocatable MIG resources a layout gives a node under migStrategy mixed, for previews (§3.5)."""
    product = get_product(product) if isinstance(product, str) else product
    resources: dict[str, int] = {}
    for name in sorted(devices, key=profile_name_key):
        profile = product.mig_profile(name)
        if profile is None:
            raise ValueError(f"{name} is not a profile of {product.name}")
        if devices[name]:
            resources[profile.resource_name] = devices[name]
    return resources
