"""The MIG catalog against the facts in docs/nvidia-contracts.md §3.5, §4 and §4.1."""

import re

import pytest

from sharing.mig import PRODUCTS, UnknownProductError, get_product, mig_resources
from sharing.mig.catalog import gfd_product_name

MIG_PRODUCTS = [product for product in PRODUCTS.values() if product.mig_capable]

REQUIRED = [
    "NVIDIA-H100-80GB-HBM3",
    "NVIDIA-H100-PCIe",
    "NVIDIA-H100-NVL",
    "NVIDIA-H200",
    "NVIDIA-A100-SXM4-40GB",
    "NVIDIA-A100-SXM4-80GB",
    "NVIDIA-A100-80GB-PCIe",
    "NVIDIA-A30",
    "NVIDIA-B200",
    "NVIDIA-L4",
    "Tesla-T4",
    "NVIDIA-L40S",
    # issue 14: every GPU of the GPU Operator's default mig-parted config
    "NVIDIA-A100-PCIE-40GB",
    "NVIDIA-A800-40GB-Active",
    "NVIDIA-A800-SXM4-80GB",
    "NVIDIA-A800-80GB-PCIe",
    "NVIDIA-H800",
    "NVIDIA-H800-PCIe",
    "NVIDIA-H800-NVL",
    "NVIDIA-H100-96GB-HBM3",
    "NVIDIA-PG506-232",
    "NVIDIA-H20",
    "NVIDIA-H200-NVL",
    "NVIDIA-GH200-480GB",
    "NVIDIA-GH200-144G-HBM3e",
    "NVIDIA-GB200",
    "NVIDIA-B300-SXM6-AC",
    "NVIDIA-GB300",
    "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
]
FOUR_SLICE = {"NVIDIA-A30"} | {name for name in PRODUCTS if name.startswith("NVIDIA-RTX-PRO-6000")}


def test_catalog_has_the_fleet_products():
    assert set(REQUIRED) <= set(PRODUCTS)


@pytest.mark.parametrize(
    ("product", "names"),
    [
        # §4 table: 1g, 1g+me, 1g double memory, 2g, 3g, 4g, 7g
        ("NVIDIA-A100-SXM4-40GB", ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
        ("NVIDIA-A100-SXM4-80GB", ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
        ("NVIDIA-A100-80GB-PCIe", ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
        ("NVIDIA-H100-80GB-HBM3", ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
        ("NVIDIA-H100-PCIe", ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
        ("NVIDIA-H100-NVL", ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"]),
        ("NVIDIA-H200", ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]),
        ("NVIDIA-B200", ["1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"]),
        ("NVIDIA-A30", ["1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"]),
        ("NVIDIA-GH200-480GB", ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"]),
        ("NVIDIA-GH200-144G-HBM3e", ["1g.18gb", "1g.18gb+me", "1g.36gb", "2g.36gb", "3g.72gb", "4g.72gb", "7g.144gb"]),
        ("NVIDIA-GB200", ["1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"]),
        ("NVIDIA-B300-SXM6-AC", ["1g.34gb", "1g.34gb+me", "1g.67gb", "2g.67gb", "3g.135gb", "4g.135gb", "7g.269gb"]),
        ("NVIDIA-GB300", ["1g.35gb", "1g.35gb+me", "1g.70gb", "2g.70gb", "3g.139gb", "4g.139gb", "7g.278gb"]),
        (
            "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
            ["1g.24gb", "1g.24gb+me", "1g.24gb+gfx", "1g.24gb+me.all", "1g.24gb-me"]
            + ["2g.48gb", "2g.48gb+gfx", "2g.48gb+me.all", "2g.48gb-me", "4g.96gb", "4g.96gb+gfx"],
        ),
    ],
)
def test_profile_names_follow_the_mig_guide(product, names):
    assert [profile.name for profile in get_product(product).profiles] == names


@pytest.mark.parametrize("product", MIG_PRODUCTS, ids=lambda product: product.name)
def test_mig_profiles_are_consistent(product):
    assert (product.compute_slices, product.memory_slices) == ((4, 4) if product.name in FOUR_SLICE else (7, 8))
    for profile in product.profiles:
        assert profile.starts and all(
            0 <= start <= product.memory_slices - profile.memory_slices for start in profile.starts
        )
        assert profile.compute_slices <= product.compute_slices
        assert profile.multiprocessors <= product.multiprocessors
        assert profile.memory_mib < product.memory_mib
        assert profile.name.endswith(profile.attribute)
        if profile.media_extensions:
            assert profile.max_count == 1
        else:
            # §4.1: the max count is the number of non-overlapping starts.
            assert profile.max_count == len(profile.starts)
    media = 3 if product.name in FOUR_SLICE - {"NVIDIA-A30"} else 2 if product.name == "NVIDIA-A30" else 1
    assert sum(profile.media_extensions for profile in product.profiles) == media


@pytest.mark.parametrize(
    "product", [p for p in MIG_PRODUCTS if p.name not in FOUR_SLICE], ids=lambda product: product.name
)
def test_seven_slice_placements_and_ids(product):
    by_size = {(p.compute_slices, p.memory_slices, p.media_extensions): p for p in product.profiles}
    expected = {
        # (compute, memory, +me): (profile id, starts) — §4.1
        (1, 1, False): (19, (0, 1, 2, 3, 4, 5, 6)),
        (1, 1, True): (20, (0, 1, 2, 3, 4, 5, 6)),
        (1, 2, False): (15, (0, 2, 4, 6)),
        (2, 2, False): (14, (0, 2, 4)),
        (3, 4, False): (9, (0, 4)),
        (4, 4, False): (5, (0,)),
        (7, 8, False): (0, (0,)),
    }
    assert {key: (p.profile_id, p.starts) for key, p in by_size.items()} == expected


def test_h100_facts():
    h100 = get_product("NVIDIA-H100-80GB-HBM3")
    one = h100.mig_profile("1g.10gb")
    assert (one.memory_mib, one.multiprocessors, one.max_count) == (9984, 16, 7)  # §3.6 GFD labels
    assert h100.mig_profile("2g.20gb").multiprocessors == 32
    assert h100.mig_profile("3g.40gb").multiprocessors == 60
    # nvidia-smi mig -lgip: 19.62 and 79.25 GiB, not 2 and 8 times the 1g figure
    assert h100.mig_profile("1g.20gb").memory_mib == 20096
    assert h100.mig_profile("7g.80gb").memory_mib == 81152
    assert h100.mig_profile("7g.80gb").memory_slices == 8
    assert h100.mig_profile("1g.5gb") is None
    assert (h100.pci_device_ids, h100.architecture, h100.compute_capability) == (("0x233010DE",), "hopper", (9, 0))
    assert not h100.figures_estimated


@pytest.mark.parametrize(
    ("product", "profile", "mib"),
    [
        ("NVIDIA-A100-SXM4-40GB", "7g.40gb", 40192),  # go-nvml: not 8 × 4864
        ("NVIDIA-A100-SXM4-40GB", "3g.20gb", 19968),
        ("NVIDIA-A100-SXM4-80GB", "7g.80gb", 80384),
        ("NVIDIA-H100-NVL", "7g.94gb", 95360),  # 93.12 GiB
        ("NVIDIA-H200", "7g.141gb", 143104),  # 139.75 GiB
        ("NVIDIA-B200", "2g.45gb", 45312),  # 44.25 GiB
        ("NVIDIA-GB200", "1g.47gb", 46592),  # 45.50 GiB
    ],
)
def test_profile_memory_is_what_nvml_reports(product, profile, mib):
    found = get_product(product).mig_profile(profile)
    assert (found.memory_mib, found.memory_estimated) == (mib, False)


def test_estimates_are_marked_as_such():
    b200 = get_product("NVIDIA-B200")
    assert not b200.mig_profile("1g.23gb").memory_estimated
    assert b200.mig_profile("7g.180gb").memory_estimated and b200.mig_profile("7g.180gb").multiprocessors_estimated
    assert all(p.memory_estimated for p in get_product("NVIDIA-B300-SXM6-AC").profiles)
    assert all(p.memory_estimated for p in get_product("NVIDIA-A800-SXM4-80GB").profiles)  # the A100's figures
    assert get_product("NVIDIA-B300-SXM6-AC").figures_estimated and "estimated" in get_product("NVIDIA-GB300").source


def test_rtx_pro_6000_universal_mig_profiles():
    rtx = get_product("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition")
    assert (rtx.compute_slices, rtx.memory_slices, rtx.compute_capability) == (4, 4, (12, 0))
    attributes = {p.name: (p.attribute, p.profile_id, p.max_count) for p in rtx.profiles}
    assert attributes["1g.24gb+gfx"] == ("+gfx", 47, 4)
    assert attributes["1g.24gb+me.all"] == ("+me.all", 65, 1)
    assert attributes["2g.48gb-me"] == ("-me", 66, 2)
    assert rtx.mig_profile("1g.24gb+me.all").resource_name == "nvidia.com/mig-1g.24gb.me.all"
    assert rtx.mig_profile("1g.24gb-me").resource_name == "nvidia.com/mig-1g.24gb-me"


def test_a30_follows_its_own_table():
    a30 = get_product("NVIDIA-A30")
    starts = {profile.name: profile.starts for profile in a30.profiles}
    assert starts == {
        "1g.6gb": (0, 1, 2, 3),
        "1g.6gb+me": (0, 1, 2, 3),
        "2g.12gb": (0, 2),
        "2g.12gb+me": (0, 2),
        "4g.24gb": (0,),
    }
    assert a30.mig_profile("2g.12gb+me").max_count == 1


@pytest.mark.parametrize("name", ["NVIDIA-L4", "Tesla-T4", "NVIDIA-L40S"])
def test_non_mig_products_have_no_profiles(name):
    product = get_product(name)
    assert not product.mig_capable
    assert (product.compute_slices, product.memory_slices, product.profiles) == (0, 0, ())


@pytest.mark.parametrize("product", PRODUCTS.values(), ids=lambda product: product.name)
def test_product_identity_fields(product):
    assert gfd_product_name(product.display_name) == product.name  # GFD sanitises the NVML name (§3.6)
    assert product.pci_device_ids and all(re.fullmatch(r"0x[0-9A-F]{4}10DE", i) for i in product.pci_device_ids)
    assert product.architecture in {"turing", "ampere", "ada-lovelace", "hopper", "blackwell"}


def test_resource_names_replace_plus_with_dot():
    h100 = get_product("NVIDIA-H100-80GB-HBM3")
    assert h100.mig_profile("1g.10gb").resource_name == "nvidia.com/mig-1g.10gb"
    assert h100.mig_profile("1g.10gb+me").resource_name == "nvidia.com/mig-1g.10gb.me"


@pytest.mark.parametrize(
    "name",
    ["NVIDIA-H100-80GB-HBM3", "NVIDIA H100 80GB HBM3", " NVIDIA-H100-80GB-HBM3 ", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"],
)
def test_get_product_accepts_gfd_and_nvml_spellings(name):
    assert get_product(name) is PRODUCTS["NVIDIA-H100-80GB-HBM3"]


def test_get_product_sanitises_like_gfd():
    assert get_product("NVIDIA GH200 144G HBM3e") is PRODUCTS["NVIDIA-GH200-144G-HBM3e"]
    assert get_product("NVIDIA  B300 SXM6 AC") is PRODUCTS["NVIDIA-B300-SXM6-AC"]
    assert gfd_product_name("NVIDIA RTX PRO 6000 (Blackwell)") == "NVIDIA-RTX-PRO-6000-Blackwell"


def test_get_product_strips_the_shared_suffix():
    assert get_product("Tesla-T4-SHARED") is PRODUCTS["Tesla-T4"]


def test_unknown_product_lists_known_ones():
    with pytest.raises(UnknownProductError) as caught:
        get_product("NVIDIA-H100-80GB-HBM4")
    assert isinstance(caught.value, LookupError)
    assert caught.value.name == "NVIDIA-H100-80GB-HBM4"
    assert caught.value.known == sorted(PRODUCTS)
    assert "did you mean NVIDIA-H100-80GB-HBM3?" in str(caught.value)
    assert "NVIDIA-A30" in str(caught.value)


def test_mig_resources_for_a_mixed_strategy_preview():
    resources = mig_resources("NVIDIA-H100-80GB-HBM3", {"1g.10gb": 2, "1g.10gb+me": 1, "3g.40gb": 1, "2g.20gb": 0})
    assert resources == {"nvidia.com/mig-3g.40gb": 1, "nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-1g.10gb.me": 1}
    assert list(resources) == ["nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-1g.10gb.me"]


def test_mig_resources_refuses_foreign_profiles():
    with pytest.raises(ValueError, match="1g.5gb is not a profile of NVIDIA-H100-80GB-HBM3"):
        mig_resources(PRODUCTS["NVIDIA-H100-80GB-HBM3"], {"1g.5gb": 1})
