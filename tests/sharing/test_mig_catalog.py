"""The MIG catalog against the facts in nvidia-contracts.md §3.5, §4 and §4.1."""

import re

import pytest

from sharing.mig import PRODUCTS, UnknownProductError, get_product, mig_resources

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
]


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
    ],
)
def test_profile_names_follow_the_mig_guide(product, names):
    assert [profile.name for profile in get_product(product).profiles] == names


@pytest.mark.parametrize("product", MIG_PRODUCTS, ids=lambda product: product.name)
def test_mig_profiles_are_consistent(product):
    assert (product.compute_slices, product.memory_slices) == ((4, 4) if product.name == "NVIDIA-A30" else (7, 8))
    for profile in product.profiles:
        assert profile.starts and all(
            0 <= start <= product.memory_slices - profile.memory_slices for start in profile.starts
        )
        assert profile.compute_slices <= product.compute_slices
        assert profile.multiprocessors <= product.multiprocessors
        assert profile.memory_mib < product.memory_mib
        if profile.media_extensions:
            assert profile.name.endswith("+me") and profile.max_count == 1
        else:
            # §4.1: the max count is the number of non-overlapping starts.
            assert profile.max_count == len(profile.starts)
    assert sum(profile.media_extensions for profile in product.profiles) == (2 if product.name == "NVIDIA-A30" else 1)


@pytest.mark.parametrize(
    "product", [p for p in MIG_PRODUCTS if p.name != "NVIDIA-A30"], ids=lambda product: product.name
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
    assert h100.mig_profile("1g.20gb").memory_mib == 2 * 9984
    assert h100.mig_profile("7g.80gb").memory_slices == 8
    assert h100.mig_profile("1g.5gb") is None
    assert (h100.pci_device_id, h100.architecture, h100.compute_capability) == ("0x233010DE", "hopper", (9, 0))


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
    assert product.display_name.replace(" ", "-") == product.name  # GFD sanitises the NVML name (§3.6)
    assert re.fullmatch(r"0x[0-9A-F]{4}10DE", product.pci_device_id)
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
