"""Layout validation and placement, against §4.1 and against a plain brute-force search."""

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharing.mig import (
    PRODUCTS,
    GpuProduct,
    MigProfile,
    Placement,
    UnknownProductError,
    format_layout,
    maximal_layouts,
    parse_layout,
    validate_layout,
)

H100 = PRODUCTS["NVIDIA-H100-80GB-HBM3"]
A30 = PRODUCTS["NVIDIA-A30"]
MIG_PRODUCTS = [product for product in PRODUCTS.values() if product.mig_capable]


def brute_force_fits(product, devices):
    """Independent check: ≤ 1 +me instance, only -me ones beside a +me.all, enough compute slices, and some choice
    of allowed starts that share no memory slice. Tries every start for every instance, in the order given."""
    instances = [product.mig_profile(name) for name, count in devices.items() for _ in range(count)]
    if sum(profile.media_extensions for profile in instances) > 1:
        return False
    attributes = Counter(profile.attribute for profile in instances)
    if attributes["+me.all"] and sum(attributes.values()) > attributes["+me.all"] + attributes["-me"]:
        return False
    if sum(profile.compute_slices for profile in instances) > product.compute_slices:
        return False

    def search(index, used):
        if index == len(instances):
            return True
        profile = instances[index]
        for start in profile.starts:
            slices = set(range(start, start + profile.memory_slices))
            if max(slices) < product.memory_slices and not slices & used and search(index + 1, used | slices):
                return True
        return False

    return search(0, frozenset())


# --- known facts -------------------------------------------------------------------------------------------------


def test_seven_small_slices_fit_an_h100():
    result = validate_layout(H100, {"1g.10gb": 7})
    assert result.valid and result.errors == ()
    assert result.placements == tuple(Placement("1g.10gb", start, 1) for start in range(7))
    assert (result.compute_slices_used, result.memory_slices_used) == (7, 7)


def test_eight_small_slices_do_not():
    result = validate_layout("NVIDIA-H100-80GB-HBM3", {"1g.10gb": 8})
    assert not result.valid and result.placements == ()
    assert "NVIDIA-H100-80GB-HBM3 has 7 compute slices; 1g.10gb × 8 needs 8" in result.errors
    assert result.compute_slices_used == 8


def test_two_halves_leave_no_room_for_a_small_slice():
    result = validate_layout(H100, {"3g.40gb": 2, "1g.10gb": 1})
    assert not result.valid
    assert result.errors == ("3g.40gb × 2 takes all 8 memory slices; no room for 1g.10gb",)
    assert (result.compute_slices_used, result.memory_slices_used) == (7, 9)


def test_4g_plus_3g_is_valid():
    result = validate_layout(H100, {"3g.40gb": 1, "4g.40gb": 1})
    assert result.valid
    assert result.placements == (Placement("4g.40gb", 0, 4), Placement("3g.40gb", 4, 4))


def test_3g_plus_3g_uses_six_compute_slices_and_all_memory():
    result = validate_layout(H100, {"3g.40gb": 2})
    assert result.valid
    assert result.placements == (Placement("3g.40gb", 0, 4), Placement("3g.40gb", 4, 4))
    assert (result.compute_slices_used, result.memory_slices_used) == (6, 8)


def test_2g_cannot_start_at_6_so_the_3g_moves_up():
    result = validate_layout(H100, {"3g.40gb": 1, "2g.20gb": 2})
    assert result.placements == (Placement("2g.20gb", 0, 2), Placement("2g.20gb", 2, 2), Placement("3g.40gb", 4, 4))


def test_a_1g_cannot_take_slice_7():
    # 1g.20gb × 3 + 1g.10gb × 2 fills 8 memory slices only if a 1g.20gb takes 6–7.
    result = validate_layout(H100, {"1g.20gb": 3, "1g.10gb": 2})
    assert result.valid
    assert Placement("1g.20gb", 6, 2) in result.placements
    assert all(p.start != 7 for p in result.placements)


def test_placement_does_not_depend_on_mapping_order():
    assert validate_layout(H100, {"1g.10gb": 2, "4g.40gb": 1}) == validate_layout(H100, {"4g.40gb": 1, "1g.10gb": 2})


def test_empty_layout_is_mig_on_with_no_devices():
    result = validate_layout(H100, {})
    assert result.valid and result.placements == () and result.errors == ()
    assert validate_layout(H100, {"1g.10gb": 0}).valid


@pytest.mark.parametrize(
    "devices",
    [{"1g.6gb": 4}, {"2g.12gb": 2}, {"2g.12gb": 1, "1g.6gb": 2}, {"4g.24gb": 1}, {"2g.12gb+me": 1, "2g.12gb": 1}],
)
def test_a30_valid_layouts(devices):
    assert validate_layout(A30, devices).valid


def test_a30_runs_out_of_compute():
    result = validate_layout(A30, {"4g.24gb": 1, "1g.6gb": 1})
    assert result.errors == ("NVIDIA-A30 has 4 compute slices; 4g.24gb × 1 + 1g.6gb × 1 needs 5",)


def test_a30_allows_one_media_extension_instance_across_profiles():
    result = validate_layout(A30, {"1g.6gb+me": 1, "2g.12gb+me": 1})
    assert not result.valid
    assert result.errors == (
        "only one +me instance fits on a GPU (it owns all media engines); 2g.12gb+me × 1 + 1g.6gb+me × 1 asks for 2",
    )


def test_media_extensions_max_one_per_gpu():
    assert validate_layout(H100, {"1g.10gb+me": 1, "1g.10gb": 6}).valid
    result = validate_layout(H100, {"1g.10gb+me": 2})
    assert result.errors == (
        "only one +me instance fits on a GPU (it owns all media engines); 1g.10gb+me × 2 asks for 2",
    )


RTX_PRO = PRODUCTS["NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"]


def test_rtx_pro_6000_mixes_graphics_and_compute_slices():
    result = validate_layout(RTX_PRO, {"2g.48gb": 1, "1g.24gb+gfx": 1, "1g.24gb": 1})
    assert result.valid and result.placements == (
        Placement("2g.48gb", 0, 2),
        Placement("1g.24gb", 2, 1),
        Placement("1g.24gb+gfx", 3, 1),
    )
    assert not validate_layout(RTX_PRO, {"2g.48gb": 1, "1g.24gb": 3}).valid  # 4 compute slices in all


def test_me_all_leaves_only_me_less_slices_beside_it():
    assert validate_layout(RTX_PRO, {"2g.48gb+me.all": 1, "1g.24gb-me": 2}).valid
    result = validate_layout(RTX_PRO, {"1g.24gb+me.all": 1, "1g.24gb": 1, "1g.24gb-me": 2})
    assert result.errors == (
        "1g.24gb+me.all takes all media engines; 1g.24gb × 1 beside it would need some (use -me profiles)",
    )
    assert not validate_layout(RTX_PRO, {"1g.24gb+me.all": 1, "1g.24gb+me": 1}).valid


def test_per_profile_maximum():
    result = validate_layout(H100, {"1g.20gb": 5})
    assert "NVIDIA-H100-80GB-HBM3 fits at most 4 × 1g.20gb; 1g.20gb × 5 asks for more" in result.errors


def test_non_mig_product():
    result = validate_layout("NVIDIA-L4", {"1g.10gb": 1})
    assert result == validate_layout(PRODUCTS["NVIDIA-L4"], {})
    assert not result.valid and result.errors == ("NVIDIA-L4 does not support MIG",)


def test_unknown_product_name_raises():
    with pytest.raises(UnknownProductError):
        validate_layout("NVIDIA-X9000", {})


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("1g.5gb", "1g.5gb is not a profile of NVIDIA-H100-80GB-HBM3 — did you mean 1g.10gb?"),
        ("3g.20gb", "3g.20gb is not a profile of NVIDIA-H100-80GB-HBM3 — did you mean 3g.40gb?"),
        ("7g.79gb", "7g.79gb is not a profile of NVIDIA-H100-80GB-HBM3 — did you mean 7g.80gb?"),
        ("1g.10gb.me", "1g.10gb.me is not a profile of NVIDIA-H100-80GB-HBM3 — did you mean 1g.10gb+me?"),
        ("lg.10gb", "lg.10gb is not a profile of NVIDIA-H100-80GB-HBM3 — did you mean 1g.10gb?"),
    ],
)
def test_typo_suggestions(name, message):
    result = validate_layout(H100, {name: 1, "1g.10gb": 1})
    assert not result.valid and result.errors == (message,)


@pytest.mark.parametrize("name", ["1g.24gb.me.all", "1g.24gb.gfx"])
def test_config_name_spelling_of_attributes_is_recognised(name):
    result = validate_layout(RTX_PRO, {name: 1})
    message = f"{name} is not a profile of {RTX_PRO.name} — did you mean {name[:7]}+{name[8:]}?"
    assert result.errors == (message,)
    assert not result.valid and result.errors == (message,)


def test_no_suggestion_lists_the_profiles():
    (error,) = validate_layout(A30, {"banana": 1}).errors
    assert (
        error
        == "banana is not a profile of NVIDIA-A30; its profiles are 1g.6gb, 1g.6gb+me, 2g.12gb, 2g.12gb+me, 4g.24gb"
    )


@pytest.mark.parametrize("count", [-1, "3", 1.5, True, None])
def test_counts_must_be_whole_numbers(count):
    result = validate_layout(H100, {"1g.10gb": count})
    assert not result.valid
    assert result.errors == (f"the count of 1g.10gb must be a whole number ≥ 0, not {count!r}",)


# --- maximal layouts ---------------------------------------------------------------------------------------------

# §4.1, the 12 maximal A100/H100-class geometries of base profiles.
SECTION_4_1_GEOMETRIES = [
    {"7g.80gb": 1},
    {"4g.40gb": 1, "3g.40gb": 1},
    {"4g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1},
    {"4g.40gb": 1, "1g.10gb": 3},
    {"3g.40gb": 1, "2g.20gb": 2},
    {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2},
    {"3g.40gb": 1, "1g.10gb": 4},
    {"3g.40gb": 2},
    {"2g.20gb": 3, "1g.10gb": 1},
    {"2g.20gb": 2, "1g.10gb": 3},
    {"2g.20gb": 1, "1g.10gb": 5},
    {"1g.10gb": 7},
]


def test_h100_maximal_layouts_of_base_profiles_match_section_4_1():
    base = {"1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}
    found = [layout for layout in maximal_layouts(H100) if set(layout) <= base]
    assert sorted(map(sorted, (layout.items() for layout in found))) == sorted(
        map(sorted, (layout.items() for layout in SECTION_4_1_GEOMETRIES))
    )
    assert len(found) == 12


def test_a30_maximal_layouts():
    assert maximal_layouts("NVIDIA-A30") == [{"4g.24gb": 1}, {"2g.12gb": 2}, {"2g.12gb": 1, "1g.6gb": 2}, {"1g.6gb": 4}]


def test_maximal_layouts_start_with_the_whole_gpu_and_end_with_the_smallest_slices():
    layouts = maximal_layouts(H100)
    assert layouts[0] == {"7g.80gb": 1}
    assert layouts[-1] == {"1g.10gb": 7}
    assert maximal_layouts(H100) == layouts  # deterministic, and the cache hands out copies
    layouts[0]["7g.80gb"] = 99
    assert maximal_layouts(H100)[0] == {"7g.80gb": 1}


@pytest.mark.parametrize("product", MIG_PRODUCTS, ids=lambda product: product.name)
def test_maximal_layouts_are_exactly_those_brute_force_finds(product):
    profiles = [profile for profile in product.profiles if not profile.attribute]
    fitting = set()
    for counts in itertools.product(*(range(profile.max_count + 1) for profile in profiles)):
        layout = {profile.name: count for profile, count in zip(profiles, counts, strict=True) if count}
        if layout and brute_force_fits(product, layout):
            fitting.add(frozenset(layout.items()))

    def grown(layout, profile):
        counts = dict(layout)
        counts[profile.name] = counts.get(profile.name, 0) + 1
        return frozenset(counts.items())

    expected = {layout for layout in fitting if not any(grown(layout, p) in fitting for p in profiles)}
    assert {frozenset(layout.items()) for layout in maximal_layouts(product)} == expected


# --- properties --------------------------------------------------------------------------------------------------


@st.composite
def products_and_layouts(draw):
    product = draw(st.sampled_from(MIG_PRODUCTS))
    names = draw(st.lists(st.sampled_from([profile.name for profile in product.profiles]), unique=True, max_size=5))
    return product, {name: draw(st.integers(0, product.mig_profile(name).max_count + 1)) for name in names}


@settings(max_examples=400, deadline=None)
@given(products_and_layouts())
def test_validator_agrees_with_brute_force_and_its_placements_are_real(case):
    product, devices = case
    result = validate_layout(product, devices)
    assert result.valid == brute_force_fits(product, devices), result.errors
    assert result.compute_slices_used == sum(product.mig_profile(n).compute_slices * c for n, c in devices.items())
    if not result.valid:
        assert result.errors and result.placements == ()
        return
    assert result.errors == ()
    assert Counter(p.profile for p in result.placements) == Counter({n: c for n, c in devices.items() if c})
    used = set()
    for placement in result.placements:
        profile = product.mig_profile(placement.profile)
        assert placement.start in profile.starts
        assert placement.size == profile.memory_slices
        slices = set(range(placement.start, placement.start + placement.size))
        assert max(slices) < product.memory_slices
        assert not slices & used
        used |= slices
    assert len(used) == result.memory_slices_used
    assert result.compute_slices_used <= product.compute_slices


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(MIG_PRODUCTS), st.text(min_size=1, max_size=12))
def test_names_that_are_not_profiles_are_refused(product, name):
    if product.mig_profile(name) is None:
        (error,) = validate_layout(product, {name: 1}).errors
        assert error.startswith(f"{name} is not a profile of {product.name}")


# --- notation ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "devices"),
    [
        ("1g.10gb x7", {"1g.10gb": 7}),
        ("3g.40gb x2 + 1g.10gb x1", {"3g.40gb": 2, "1g.10gb": 1}),
        ("  3g.40gb ×2+1g.10gb*1 ", {"3g.40gb": 2, "1g.10gb": 1}),
        ("1g.10gb+me x1 + 1g.10gb x 6", {"1g.10gb+me": 1, "1g.10gb": 6}),
        ("7g.80gb", {"7g.80gb": 1}),
        ("4G.40GB X1", {"4g.40gb": 1}),
        ("1g.10gbx7", {"1g.10gb": 7}),
        ("", {}),
    ],
)
def test_parse_layout(text, devices):
    assert parse_layout(text) == devices


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1g.10gb x", "cannot read '1g.10gb x'"),
        ("banana x2", "cannot read 'banana x2'"),
        ("1g.10gb x2 + ", "cannot read"),
        ("1g.10gb x-1", "cannot read '1g.10gb x-1'"),
        ("1g.10gb x1 + 1g.10gb x2", "1g.10gb appears twice"),
    ],
)
def test_parse_layout_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_layout(text)


def test_format_layout_is_largest_first_and_skips_zeros():
    assert format_layout({"1g.10gb": 1, "3g.40gb": 2, "2g.20gb": 0}) == "3g.40gb ×2 + 1g.10gb ×1"
    assert format_layout({"1g.10gb": 2, "1g.10gb+me": 1, "1g.20gb": 1}) == "1g.20gb ×1 + 1g.10gb ×2 + 1g.10gb+me ×1"
    assert format_layout({}) == ""


@given(products_and_layouts())
def test_format_then_parse_round_trips(case):
    _, devices = case
    assert parse_layout(format_layout(devices)) == {name: count for name, count in devices.items() if count}


def test_alignment_failures_are_explained_too():
    # No catalog GPU has one (every refusal there is "takes all 8"), so a made-up GPU with rigid starts.
    rigid = GpuProduct(
        "Test-Rigid", "Test Rigid", 4096, "hopper", (9, 0), ("0x000010DE",), 4, True, 4, 4,
        (MigProfile("2g.2gb", 1, 2, 2, 2048, 2, 1, (0,)), MigProfile("1g.1gb", 2, 1, 1, 1024, 1, 1, (0,))),
    )  # fmt: skip
    result = validate_layout(rigid, {"1g.1gb": 1, "2g.2gb": 1})
    assert result.errors == ("2g.2gb × 1 leaves no room for 1g.1gb, which needs 1 free memory slice(s) starting at 0",)
