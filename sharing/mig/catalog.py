"""MIG catalog: what each GPU model can be cut into, with where each figure comes from (docs/nvidia-contracts.md §4)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

# §4: <g>g.<mem>gb, optional <c>c. compute-instance prefix, optional attribute (+me, +me.all, +gfx, -me).
PROFILE_NAME_RE = re.compile(r"^(?:(?P<ci>\d+)c\.)?(?P<g>\d+)g\.(?P<mem>\d+)gb(?P<attr>\+me\.all|\+me|\+gfx|-me)?$")
MEDIA_ATTRIBUTES = ("+me", "+me.all")  # profiles that take the GPU's media engines (only one per GPU)


def profile_name_key(name: str) -> tuple:
    """Sort key for profile names, larger slices first, so every listing of a layout reads the same way."""
    match = PROFILE_NAME_RE.match(name)
    if match is None:
        return (1, 0, 0, "", name)
    return (0, -int(match["g"]), -int(match["mem"]), match["attr"] or "", name)


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of a product, with the memory-slice starts NVIDIA allows it (§4.1).

    `memory_mib` and `multiprocessors` are what NVML reports for the profile where a real `nvidia-smi mig -lgip`
    output or NVIDIA's go-nvml fixtures publish it; the `*_estimated` flags mark figures Tessera derived instead.
    """

    name: str
    profile_id: int
    compute_slices: int
    memory_slices: int
    memory_mib: int
    multiprocessors: int
    max_count: int
    starts: tuple[int, ...]
    attribute: str = ""  # "", "+me", "+me.all", "+gfx" or "-me" (§4)
    memory_estimated: bool = False
    multiprocessors_estimated: bool = False

    @property
    def media_extensions(self) -> bool:
        """Takes media engines only one instance per GPU may hold (+me, +me.all)."""
        return self.attribute in MEDIA_ATTRIBUTES

    @property
    def resource_name(self) -> str:
        """The resource the device plugin advertises under migStrategy mixed (§3.5: '+' becomes '.')."""
        return "nvidia.com/mig-" + self.name.replace("+", ".")


@dataclass(frozen=True)
class GpuProduct:
    """A GPU model as GPU Feature Discovery names it, the PCI device IDs it has, and its MIG profiles."""

    name: str
    display_name: str
    memory_mib: int
    architecture: str
    compute_capability: tuple[int, int]
    pci_device_ids: tuple[str, ...]  # as mig-parted's device-filter writes them: "0x20B010DE"
    multiprocessors: int
    mig_capable: bool
    compute_slices: int = 0
    memory_slices: int = 0
    profiles: tuple[MigProfile, ...] = ()
    source: str = ""  # where the profile figures come from, for the admin who doubts one
    # What a QoS policy may set on this board (§4.3): the power limit range NVML's
    # nvmlDeviceGetPowerManagementLimitConstraints gives, and the graphics clocks a lock may use.
    power_limit_w: tuple[int, int] | None = None
    graphics_clock_mhz: tuple[int, int] | None = None
    power_limit_estimated: bool = False
    graphics_clock_estimated: bool = False

    @property
    def pci_device_id(self) -> str:
        """The first PCI device ID of the model: the one a simulated GPU of this model reports."""
        return self.pci_device_ids[0]

    @property
    def figures_estimated(self) -> bool:
        return any(p.memory_estimated or p.multiprocessors_estimated for p in self.profiles)

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


# Sources of the figures below (docs/nvidia-contracts.md §4.2 has the links and commits):
#   [go-nvml]   NVIDIA/go-nvml pkg/nvml/mock/gpus/a100.go, a30.go: NVML GpuInstanceProfileInfo (MiB, SMs)
#   [lgip:X]    a real `nvidia-smi mig -lgip` output for X, GiB with two decimals, read back to MiB on the 128 MiB
#               grid every NVML figure seen lies on (9.75 GiB = 9984 MiB)
#   a "~" marks an estimate (the profile's *_estimated flag): a sibling's figure for the same die and memory, or
#   7g ≈ 99.5 % of the GPU and 3g/4g ≈ 49.7 % of 7g (the H200's ratios) where no output shows the row.
# Figures move between driver releases (a B200 1g.23gb is 22.00 GiB in one output and 20.50 in a later one).

# §4.1 placements on 7-compute / 8-memory-slice GPUs, as `nvidia-smi mig -lgipp` lists them (MIG user guide).
_STARTS_1G = (0, 1, 2, 3, 4, 5, 6)  # a 1g cannot start at 7
_STARTS_1G_DOUBLE = (0, 2, 4, 6)
_STARTS_2G = (0, 2, 4)
_STARTS_3G = (0, 4)
_FROM_0 = (0,)
# profile id, compute slices, memory slices, max count, starts — in the order of the names given to _seven_slice.
_SEVEN_SLICE_SHAPES = (
    (19, 1, 1, 7, _STARTS_1G),
    (15, 1, 2, 4, _STARTS_1G_DOUBLE),
    (14, 2, 2, 3, _STARTS_2G),
    (9, 3, 4, 2, _STARTS_3G),
    (5, 4, 4, 1, _FROM_0),
    (0, 7, 8, 1, _FROM_0),
)


def _figure(text: str) -> tuple[int, bool]:
    return int(text.lstrip("~")), text.startswith("~")


def _seven_slice(names: str, mib: str, sms: str) -> tuple[MigProfile, ...]:
    """Profiles of a 7/8-slice GPU: names, MiB and SMs of its 1g, 1g double-memory, 2g, 3g, 4g and 7g profiles.

    The 1g+me profile (id 20, one per GPU) has the 1g figures. A "~" before a figure marks it as an estimate.
    """
    profiles = []
    for name, memory, sm, (profile_id, compute, slices, most, starts) in zip(
        names.split(), mib.split(), sms.split(), _SEVEN_SLICE_SHAPES, strict=True
    ):
        (mem, mem_est), (count, sm_est) = _figure(memory), _figure(sm)
        profile = MigProfile(name, profile_id, compute, slices, mem, count, most, starts, "", mem_est, sm_est)
        profiles.append(profile)
        if profile_id == 19:
            profiles.append(replace(profile, name=name + "+me", profile_id=20, max_count=1, attribute="+me"))
    return tuple(profiles)


def _derived(profiles: tuple[MigProfile, ...]) -> tuple[MigProfile, ...]:
    """A sibling's figures for a model no published output shows: the same profiles, every figure an estimate."""
    return tuple(replace(p, memory_estimated=True, multiprocessors_estimated=True) for p in profiles)


def _four_slice(rows: str, estimated: frozenset[str] = frozenset()) -> tuple[MigProfile, ...]:
    """Profiles of a 4-slice GPU from "name id max MiB SMs" rows; 1g/2g/4g start where the MIG guide draws them."""
    starts = {1: (0, 1, 2, 3), 2: (0, 2), 4: (0,)}
    profiles = []
    for row in rows.strip().splitlines():
        name, profile_id, most, memory, sm = row.split()
        match = PROFILE_NAME_RE.match(name)
        g = int(match["g"])
        est = name in estimated
        attribute = match["attr"] or ""
        profiles.append(
            MigProfile(name, int(profile_id), g, g, int(memory), int(sm), int(most), starts[g], attribute, est, est)
        )
    return tuple(profiles)


# [go-nvml] a100.go: the A100 40GB and 80GB tables (also the MIG guide's A100 lgip example).
_A100_40GB = _seven_slice(
    "1g.5gb 1g.10gb 2g.10gb 3g.20gb 4g.20gb 7g.40gb", "4864 9856 9856 19968 19968 40192", "14 14 28 42 56 98"
)
_A100_80GB = _seven_slice(
    "1g.10gb 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb", "9856 19968 19968 40192 40192 80384", "14 14 28 42 56 98"
)
# [lgip:H100 80GB HBM3] 9.75 / 19.62 / 39.50 / 79.25 GiB; the PCIe board's SMs are estimates (114 SMs in all).
_H100_80GB = _seven_slice(
    "1g.10gb 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb", "9984 20096 20096 40448 40448 81152", "16 26 32 60 64 132"
)
_H100_PCIE = _seven_slice(
    "1g.10gb 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb",
    "~9984 ~20096 ~20096 ~40448 ~40448 ~81152",
    "~14 ~22 ~28 ~52 ~56 ~114",
)
# [lgip:H100 NVL] gpu-operator commit eee03d4b: 10.75 / 21.62 / 46.38 / 93.12 GiB.
_H100_94GB = _seven_slice(
    "1g.12gb 1g.24gb 2g.24gb 3g.47gb 4g.47gb 7g.94gb", "11008 22144 22144 47488 47488 95360", "16 26 32 60 64 132"
)
# No output published for the 96 GB parts: the H100 NVL's figures × 96/94; H20 (78 SMs) and PG506 (a GA100) SMs
# scaled from the H100 and the A100.
_H100_96GB_NAMES = "1g.12gb 1g.24gb 2g.24gb 3g.48gb 4g.48gb 7g.96gb"
_H100_96GB_MIB = "~11264 ~22656 ~22656 ~48512 ~48512 ~97408"
_H100_96GB = _seven_slice(_H100_96GB_NAMES, _H100_96GB_MIB, "~16 ~26 ~32 ~60 ~64 ~132")
_H20 = _seven_slice(_H100_96GB_NAMES, _H100_96GB_MIB, "~9 ~15 ~19 ~35 ~38 ~78")
_PG506_96GB = _seven_slice(_H100_96GB_NAMES, _H100_96GB_MIB, "~14 ~14 ~28 ~42 ~56 ~98")
# [lgip:H200] mig-parted issue #120: 16.00 / 32.25 / 69.50 / 139.75 GiB.
_H200 = _seven_slice(
    "1g.18gb 1g.35gb 2g.35gb 3g.71gb 4g.71gb 7g.141gb", "16384 33024 33024 71168 71168 143104", "16 26 32 60 64 132"
)
# [lgip:GH200 144G HBM3e] mig-parted PR #139: 17.50 / 35.25 GiB; the 3g/4g/7g rows are not in the published part.
_GH200_144GB = _seven_slice(
    "1g.18gb 1g.36gb 2g.36gb 3g.72gb 4g.72gb 7g.144gb", "17920 36096 36096 ~72704 ~72704 ~146048", "16 26 32 60 64 132"
)
# [lgip:B200] mig-parted PR #166: 22.00 / 44.25 GiB, SMs 18 / 30 / 36; the 3g/4g/7g rows are not shown.
_B200 = _seven_slice(
    "1g.23gb 1g.45gb 2g.45gb 3g.90gb 4g.90gb 7g.180gb",
    "22528 45312 45312 ~90752 ~90752 ~182400",
    "18 30 36 ~66 ~72 ~148",
)
# [lgip:GB200] mig-parted issue #227 (production boards): 22.00 / 45.50 GiB, SMs 18 / 32 / 38.
_GB200 = _seven_slice(
    "1g.23gb 1g.47gb 2g.47gb 3g.93gb 4g.93gb 7g.186gb",
    "22528 46592 46592 ~93696 ~93696 ~188416",
    "18 32 38 ~70 ~76 ~152",
)
# No output published for Blackwell Ultra: the B200's figures scaled by the profile names' GB (269/180, 278/180).
_B300 = _seven_slice(
    "1g.34gb 1g.67gb 2g.67gb 3g.135gb 4g.135gb 7g.269gb",
    "~33664 ~67712 ~67712 ~135680 ~135680 ~272640",
    "~20 ~32 ~40 ~72 ~78 ~160",
)
_GB300 = _seven_slice(
    "1g.35gb 1g.70gb 2g.70gb 3g.139gb 4g.139gb 7g.278gb",
    "~34816 ~70016 ~70016 ~140160 ~140160 ~281728",
    "~20 ~32 ~40 ~72 ~78 ~160",
)
# [go-nvml] a30.go; §4.1 placements 1g {0,1,2,3}:1, 2g {0,2}:2, 4g {0}:4; one +me instance per GPU.
_A30 = _four_slice("""
1g.6gb      14 4  5836 14
1g.6gb+me   21 1  5836 14
2g.12gb      5 2 11672 28
2g.12gb+me   6 1 11672 28
4g.24gb      0 1 23344 56
""")
# [lgip:RTX PRO 6000 Blackwell Server Edition] cubecos issue #312: ids, counts, SMs, 23.12 / 46.50 GiB; the 4g row
# is not in the published part (95.00 GiB in an unattributed lgip table). Placements as on the A30 (4 slices).
_RTX_PRO_6000 = _four_slice("""
1g.24gb        14 4 23680  46
1g.24gb+me     21 1 23680  46
1g.24gb+gfx    47 4 23680  46
1g.24gb+me.all 65 1 23680  46
1g.24gb-me     67 4 23680  46
2g.48gb         5 2 47616  94
2g.48gb+gfx    35 2 47616  94
2g.48gb+me.all 64 1 47616  94
2g.48gb-me     66 2 47616  94
4g.96gb         0 1 97280 188
4g.96gb+gfx    32 1 97280 188
""", estimated=frozenset({"4g.96gb", "4g.96gb+gfx"}))  # fmt: skip


_GFD_UNSAFE = re.compile(r"[^A-Za-z0-9\-_. ]")


def gfd_product_name(name: str) -> str:
    """The label GFD makes of an NVML name: characters outside [A-Za-z0-9-_. ] dropped, blanks as one '-'."""
    return "-".join(_GFD_UNSAFE.sub("", name).split())


# §4.3 GPU setting ranges: (min W, max W, max graphics MHz, which are estimates: "p" power, "c" clocks, "pc" both).
# The maximum power is the board's TDP from NVIDIA's product page or datasheet; the minimum is what NVML reports
# where a published nvidia-smi -q or Redfish output shows it, else estimated. Locked clocks start at 210 MHz (the
# lowest graphics clock NVML lists on these boards) and end at the board's maximum boost clock.
LOWEST_GRAPHICS_CLOCK_MHZ = 210
_LIMITS = {
    "NVIDIA A100-SXM4-40GB": (100, 400, 1410, ""),
    "NVIDIA A100-PCIE-40GB": (150, 250, 1410, "p"),
    "NVIDIA A800 40GB Active": (150, 240, 1410, "p"),
    "NVIDIA A100-SXM4-80GB": (100, 400, 1410, "p"),
    "NVIDIA A100 80GB PCIe": (150, 300, 1410, "p"),
    "NVIDIA A800-SXM4-80GB": (100, 400, 1410, "p"),
    "NVIDIA A800 80GB PCIe": (150, 300, 1410, "p"),
    "NVIDIA A800 80GB PCIe LC": (150, 300, 1410, "p"),
    "NVIDIA A30": (100, 165, 1440, "p"),
    "NVIDIA PG506-232": (100, 400, 1410, "pc"),
    "NVIDIA H100 80GB HBM3": (200, 700, 1980, "c"),
    "NVIDIA H800": (200, 700, 1980, "pc"),
    "NVIDIA H100 PCIe": (200, 350, 1755, "pc"),
    "NVIDIA H800 PCIe": (200, 350, 1755, "pc"),
    "NVIDIA H100 NVL": (200, 400, 1785, "pc"),
    "NVIDIA H800 NVL": (200, 400, 1785, "pc"),
    "NVIDIA H100 96GB HBM3": (200, 700, 1980, "pc"),
    "NVIDIA GH200 480GB": (200, 900, 1980, "pc"),
    "NVIDIA GH200 120GB": (200, 900, 1980, "pc"),
    "NVIDIA H20": (200, 400, 1980, "pc"),
    "NVIDIA H200": (200, 700, 1980, "pc"),
    "NVIDIA H200 NVL": (200, 600, 1785, "pc"),
    "NVIDIA GH200 144G HBM3e": (200, 900, 1980, "pc"),
    "NVIDIA B200": (200, 1000, 1965, "c"),
    "NVIDIA GB200": (200, 1200, 1965, "pc"),
    "NVIDIA B300 SXM6 AC": (200, 1100, 1965, "pc"),
    "NVIDIA GB300": (200, 1400, 1965, "pc"),
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": (300, 600, 2617, "pc"),
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": (150, 600, 2617, "pc"),
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition": (150, 300, 2617, "pc"),
    "NVIDIA L4": (40, 72, 2040, "pc"),
    "NVIDIA L40S": (100, 350, 2520, "pc"),
    "Tesla T4": (60, 70, 1590, "pc"),
}


def _with_limits(product: GpuProduct) -> GpuProduct:
    low, high, clock, estimated = _LIMITS[product.display_name]
    return replace(
        product,
        power_limit_w=(low, high),
        graphics_clock_mhz=(LOWEST_GRAPHICS_CLOCK_MHZ, clock),
        power_limit_estimated="p" in estimated,
        graphics_clock_estimated="c" in estimated,
    )


def _mig(nvml_name, memory, arch, cc, pci_ids, sms, profiles, source, slices=(7, 8)) -> GpuProduct:
    label = gfd_product_name(nvml_name)
    return _with_limits(GpuProduct(label, nvml_name, memory, arch, cc, pci_ids, sms, True, *slices, profiles, source))


def _whole(nvml_name, memory, arch, cc, pci_ids, sms) -> GpuProduct:
    return _with_limits(GpuProduct(gfd_product_name(nvml_name), nvml_name, memory, arch, cc, pci_ids, sms, False))


_AMPERE, _HOPPER, _BLACKWELL = ("ampere", (8, 0)), ("hopper", (9, 0)), ("blackwell", (10, 0))
_RTX_BLACKWELL = ("blackwell", (12, 0))
_MEASURED = "published NVML figures"
_PARTLY = "1g and 2g figures published; 3g, 4g and 7g estimated"
_SIBLING = "figures of a published sibling model; none published for this one"
_ESTIMATED = "estimated: no published figures"

# Every GPU the GPU Operator's default mig-parted config names (tests/sharing/data/), keyed by the GFD product
# label (the NVML name, spaces as '-'); NVML names and PCI IDs from NVIDIA's open-gpu-kernel-modules README.
# GPU memory totals are what nvidia-smi usually reports (approximate for Blackwell).
PRODUCTS: dict[str, GpuProduct] = {
    product.name: product
    for product in (
        _mig("NVIDIA A100-SXM4-40GB", 40960, *_AMPERE, ("0x20B010DE",), 108, _A100_40GB, _MEASURED),
        _mig("NVIDIA A100-PCIE-40GB", 40960, *_AMPERE, ("0x20F110DE", "0x20B110DE"), 108, _A100_40GB, _MEASURED),
        _mig("NVIDIA A800 40GB Active", 40960, *_AMPERE, ("0x20F610DE",), 108, _derived(_A100_40GB), _SIBLING),
        _mig("NVIDIA A100-SXM4-80GB", 81920, *_AMPERE, ("0x20B210DE",), 108, _A100_80GB, _MEASURED),
        _mig("NVIDIA A100 80GB PCIe", 81920, *_AMPERE, ("0x20B510DE",), 108, _A100_80GB, _MEASURED),
        _mig("NVIDIA A800-SXM4-80GB", 81920, *_AMPERE, ("0x20F310DE",), 108, _derived(_A100_80GB), _SIBLING),
        _mig("NVIDIA A800 80GB PCIe", 81920, *_AMPERE, ("0x20F510DE",), 108, _derived(_A100_80GB), _SIBLING),
        _mig("NVIDIA A800 80GB PCIe LC", 81920, *_AMPERE, ("0x20F510DE",), 108, _derived(_A100_80GB), _SIBLING),
        _mig("NVIDIA A30", 24576, *_AMPERE, ("0x20B710DE",), 56, _A30, _MEASURED, (4, 4)),
        _mig("NVIDIA PG506-232", 98304, *_AMPERE, ("0x20B610DE",), 108, _PG506_96GB, _ESTIMATED),
        _mig("NVIDIA H100 80GB HBM3", 81559, *_HOPPER, ("0x233010DE",), 132, _H100_80GB, _MEASURED),
        _mig("NVIDIA H800", 81559, *_HOPPER, ("0x232410DE",), 132, _derived(_H100_80GB), _SIBLING),
        _mig("NVIDIA H100 PCIe", 81559, *_HOPPER, ("0x233110DE",), 114, _H100_PCIE, _ESTIMATED),
        _mig("NVIDIA H800 PCIe", 81559, *_HOPPER, ("0x232210DE",), 114, _H100_PCIE, _ESTIMATED),
        _mig("NVIDIA H100 NVL", 95830, *_HOPPER, ("0x232110DE",), 132, _H100_94GB, _MEASURED),
        _mig("NVIDIA H800 NVL", 95830, *_HOPPER, ("0x233A10DE",), 132, _derived(_H100_94GB), _SIBLING),
        _mig("NVIDIA H100 96GB HBM3", 97871, *_HOPPER, ("0x233D10DE",), 132, _H100_96GB, _ESTIMATED),
        _mig("NVIDIA GH200 480GB", 97871, *_HOPPER, ("0x234210DE",), 132, _H100_96GB, _ESTIMATED),
        _mig("NVIDIA GH200 120GB", 97871, *_HOPPER, ("0x234210DE",), 132, _H100_96GB, _ESTIMATED),
        _mig("NVIDIA H20", 97871, *_HOPPER, ("0x232910DE",), 78, _H20, _ESTIMATED),
        _mig("NVIDIA H200", 143771, *_HOPPER, ("0x233510DE",), 132, _H200, _MEASURED),
        _mig("NVIDIA H200 NVL", 143771, *_HOPPER, ("0x233B10DE",), 132, _derived(_H200), _SIBLING),
        _mig("NVIDIA GH200 144G HBM3e", 146831, *_HOPPER, ("0x234810DE",), 132, _GH200_144GB, _PARTLY),
        _mig("NVIDIA B200", 183359, *_BLACKWELL, ("0x290110DE",), 148, _B200, _PARTLY),
        _mig("NVIDIA GB200", 189312, *_BLACKWELL, ("0x294110DE",), 152, _GB200, _PARTLY),
        _mig("NVIDIA B300 SXM6 AC", 273920, *_BLACKWELL, ("0x318210DE",), 160, _B300, _ESTIMATED),
        _mig("NVIDIA GB300", 283136, *_BLACKWELL, ("0x31C210DE",), 160, _GB300, _ESTIMATED),
        _mig("NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887, *_RTX_BLACKWELL, ("0x2BB510DE",), 188,
             _RTX_PRO_6000, "1g and 2g figures published; 4g estimated", (4, 4)),
        _mig("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 97887, *_RTX_BLACKWELL, ("0x2BB110DE",), 188,
             _derived(_RTX_PRO_6000), _SIBLING, (4, 4)),
        _mig("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", 97887, *_RTX_BLACKWELL, ("0x2BB410DE",), 188,
             _derived(_RTX_PRO_6000), _SIBLING, (4, 4)),
        _whole("NVIDIA L4", 23034, "ada-lovelace", (8, 9), ("0x27B810DE",), 58),
        _whole("NVIDIA L40S", 46068, "ada-lovelace", (8, 9), ("0x26B910DE",), 142),
        _whole("Tesla T4", 15360, "turing", (7, 5), ("0x1EB810DE",), 40),
    )
}  # fmt: skip


def get_product(name: str) -> GpuProduct:
    """Find a product by its GFD label or NVML name, failing loudly with the models the catalog knows."""
    # §3.6: GFD appends -MIG-<profile> (single strategy) or -SHARED to the model.
    key = re.sub(r"-MIG-.*$", "", gfd_product_name(name)).removesuffix("-SHARED")
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
