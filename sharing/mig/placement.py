"""MIG layouts: does a set of profiles fit one GPU, where, and if not, why (docs/nvidia-contracts.md §4.1)."""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sharing.mig.catalog import PROFILE_NAME_RE, GpuProduct, MigProfile, get_product, profile_name_key

# A layout in canonical form: (profile name, count) pairs, largest profile first, no zero counts.
_Layout = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Placement:
    """Where one MIG device sits, in memory slices, as `nvidia-smi mig -lgi` shows Start:Size (§4.1)."""

    profile: str
    start: int
    size: int


@dataclass(frozen=True)
class LayoutResult:
    """Verdict on one GPU's layout: a concrete placement when it fits, reasons an admin can act on when not."""

    valid: bool
    placements: tuple[Placement, ...]
    errors: tuple[str, ...]
    compute_slices_used: int
    memory_slices_used: int


def _size_key(profile: MigProfile) -> tuple:
    return (-profile.memory_slices, -profile.compute_slices, profile.name)


def _terms(counts: Iterable[tuple[str, int]]) -> str:
    return " + ".join(f"{name} × {count}" for name, count in counts)


def _resolve(product: GpuProduct | str) -> GpuProduct:
    return get_product(product) if isinstance(product, str) else product


@functools.lru_cache(maxsize=4096)
def _place(product: GpuProduct, layout: _Layout) -> tuple[Placement, ...] | None:
    """Backtracking over memory slices: larger profiles first, each at the lowest free allowed start."""
    instances = [product.mig_profile(name) for name, count in layout for _ in range(count)]
    instances.sort(key=_size_key)
    chosen: list[Placement] = []

    def place(index: int, occupied: int, min_start: int) -> bool:
        if index == len(instances):
            return True
        profile = instances[index]
        following = instances[index + 1] if index + 1 < len(instances) else None
        for start in profile.starts:
            mask = ((1 << profile.memory_slices) - 1) << start
            if start < min_start or start + profile.memory_slices > product.memory_slices or occupied & mask:
                continue
            chosen.append(Placement(profile.name, start, profile.memory_slices))
            # Instances of one profile are interchangeable: keep their starts increasing to skip permutations.
            if place(index + 1, occupied | mask, start + 1 if following == profile else 0):
                return True
            chosen.pop()
        return False

    if not place(0, 0, 0):
        return None
    return tuple(sorted(chosen, key=lambda placement: placement.start))


def _fits(product: GpuProduct, layout: _Layout) -> bool:
    profiles = [(product.mig_profile(name), count) for name, count in layout]
    if any(count > profile.max_count for profile, count in profiles):
        return False
    if sum(profile.compute_slices * count for profile, count in profiles) > product.compute_slices:
        return False
    return _place(product, layout) is not None


def _unknown_profile(product: GpuProduct, name: object) -> str:
    names = [profile.name for profile in product.profiles]
    text = str(name)
    suggestion = None
    # The resource / config-name spelling (§1.4, §3.5) writes the attribute with a '.': 1g.10gb.me, 1g.24gb.me.all.
    dotted = next((text[: -len(dot)] + "+" + dot[1:] for dot in (".me.all", ".gfx", ".me") if text.endswith(dot)), None)
    if dotted in names:
        suggestion = dotted
    elif (match := PROFILE_NAME_RE.match(text)) is not None:
        # Same slice count and attribute, nearest memory: 1g.5gb on an H100 means 1g.10gb, not 1g.20gb.
        same_shape = [
            (abs(int(other["mem"]) - int(match["mem"])), int(other["mem"]), other.string)
            for other in map(PROFILE_NAME_RE.match, names)
            if other and (other["g"], other["attr"], other["ci"]) == (match["g"], match["attr"], match["ci"])
        ]
        suggestion = min(same_shape)[2] if same_shape else None
    if suggestion is None:
        close = difflib.get_close_matches(text, names, n=1)
        suggestion = close[0] if close else None
    if suggestion:
        return f"{text} is not a profile of {product.name} — did you mean {suggestion}?"
    return f"{text} is not a profile of {product.name}; its profiles are {', '.join(names)}"


def _explain_no_room(product: GpuProduct, layout: _Layout) -> str:
    """Name the instance that does not fit after the largest ones that do, in an admin's words."""
    instances = [product.mig_profile(name) for name, count in layout for _ in range(count)]
    instances.sort(key=_size_key)
    fitted = max(k for k in range(len(instances)) if _place(product, _canonical(instances[:k])) is not None)
    blocked, before = instances[fitted], instances[:fitted]
    what = ("another " if blocked in before else "") + blocked.name
    placed = _terms(_canonical(before)) or "an empty GPU"
    if sum(profile.memory_slices for profile in before) == product.memory_slices:
        return f"{placed} takes all {product.memory_slices} memory slices; no room for {what}"
    starts = ", ".join(map(str, blocked.starts))
    needs = f"{blocked.memory_slices} free memory slice(s) starting at {starts}"
    return f"{placed} leaves no room for {what}, which needs {needs}"


def _canonical(instances: Iterable[MigProfile]) -> _Layout:
    counts: dict[MigProfile, int] = {}
    for profile in instances:
        counts[profile] = counts.get(profile, 0) + 1
    return tuple((profile.name, counts[profile]) for profile in sorted(counts, key=_size_key))


def validate_layout(product: GpuProduct | str, devices: Mapping[str, int]) -> LayoutResult:
    """Check a layout against the product's MIG rules and find where each device goes, before anything is applied."""
    product = _resolve(product)
    if not product.mig_capable:
        return LayoutResult(False, (), (f"{product.name} does not support MIG",), 0, 0)

    errors: list[str] = []
    requested: dict[MigProfile, int] = {}
    for name, count in devices.items():
        profile = product.mig_profile(name) if isinstance(name, str) else None
        if profile is None:
            errors.append(_unknown_profile(product, name))
        elif isinstance(count, bool) or not isinstance(count, int) or count < 0:
            errors.append(f"the count of {name} must be a whole number ≥ 0, not {count!r}")
        elif count:
            requested[profile] = count
    if errors:
        return LayoutResult(False, (), tuple(errors), 0, 0)

    layout = tuple((profile.name, requested[profile]) for profile in sorted(requested, key=_size_key))
    compute = sum(profile.compute_slices * count for profile, count in requested.items())
    memory = sum(profile.memory_slices * count for profile, count in requested.items())
    for name, count in layout:
        profile = product.mig_profile(name)
        if count > profile.max_count and not profile.media_extensions:  # +me has its own rule below
            errors.append(f"{product.name} fits at most {profile.max_count} × {name}; {name} × {count} asks for more")
    media = [(name, count) for name, count in layout if product.mig_profile(name).media_extensions]
    if sum(count for _, count in media) > 1:
        # §4: "+me" = one instance may own the media engines (max 1 per GPU), whichever +me profile it is.
        errors.append(
            f"only one +me instance fits on a GPU (it owns all media engines); "
            f"{_terms(media)} asks for {sum(count for _, count in media)}"
        )
    owner = next((name for name, _ in layout if product.mig_profile(name).attribute == "+me.all"), None)
    others = [(name, count) for name, count in layout if name != owner and product.mig_profile(name).attribute != "-me"]
    if owner and others:
        # +me.all takes every media engine of the GPU: the instances beside it can only be -me ones (§4).
        errors.append(f"{owner} takes all media engines; {_terms(others)} beside it would need some (use -me profiles)")
    if compute > product.compute_slices:
        errors.append(f"{product.name} has {product.compute_slices} compute slices; {_terms(layout)} needs {compute}")
    if errors:
        return LayoutResult(False, (), tuple(errors), compute, memory)

    placements = _place(product, layout)
    if placements is None:
        return LayoutResult(False, (), (_explain_no_room(product, layout),), compute, memory)
    return LayoutResult(True, placements, (), compute, memory)


@functools.lru_cache(maxsize=64)
def _maximal_layouts(product: GpuProduct) -> tuple[_Layout, ...]:
    profiles = sorted((profile for profile in product.profiles if not profile.attribute), key=_size_key)
    found: list[_Layout] = []

    def with_one_more(layout: _Layout, extra: MigProfile) -> _Layout:
        counts = dict(layout)
        counts[extra.name] = counts.get(extra.name, 0) + 1
        return tuple((p.name, counts[p.name]) for p in profiles if p.name in counts)

    def extend(index: int, layout: _Layout, compute: int) -> None:
        if index == len(profiles):
            if (
                layout
                and _fits(product, layout)
                and not any(_fits(product, with_one_more(layout, p)) for p in profiles)
            ):
                found.append(layout)
            return
        profile = profiles[index]
        most = min(profile.max_count, (product.compute_slices - compute) // profile.compute_slices)
        for count in range(most, -1, -1):
            extend(
                index + 1,
                layout + (((profile.name, count),) if count else ()),
                compute + count * profile.compute_slices,
            )

    extend(0, (), 0)
    return tuple(found)


def maximal_layouts(product: GpuProduct | str) -> list[dict[str, int]]:
    """Every layout that fits and cannot take one more instance: the menu of useful geometries for a product.

    Profiles with an attribute (+me, +me.all, +gfx, -me) are left out: they are the same slices with other
    engines, chosen on purpose; the double-memory 1g profiles are included. Largest profiles first, more of them
    before fewer.
    """
    return [dict(layout) for layout in _maximal_layouts(_resolve(product))]


# A term: a profile name (attributes such as +me belong to it), then optionally x / × / * and a count.
_TERM_RE = re.compile(r"^(?P<name>\S+?)\s*(?:[x×*]\s*(?P<count>\d+))?$")
# Terms are joined by '+' followed by a digit; '+' followed by a letter is part of a name (1g.10gb+me).
_TERM_SEPARATOR_RE = re.compile(r"\s*\+\s*(?=\d)")


def parse_layout(text: str) -> dict[str, int]:
    """Read the admin notation "3g.40gb x2 + 1g.10gb x1" (x, × or *; a bare name means one); "" is no devices."""
    devices: dict[str, int] = {}
    if not text.strip():
        return devices
    for term in _TERM_SEPARATOR_RE.split(text.strip().lower()):
        match = _TERM_RE.match(term.strip())
        if match is None or PROFILE_NAME_RE.match(match["name"]) is None:
            raise ValueError(f"cannot read {term.strip()!r} in {text!r}: write terms like '1g.10gb x7' joined by '+'")
        name = match["name"]
        if name in devices:
            raise ValueError(f"{name} appears twice in {text!r}; give it once with the total count")
        devices[name] = int(match["count"]) if match["count"] is not None else 1
    return devices


def format_layout(devices: Mapping[str, int]) -> str:
    """Write a layout in the admin notation, largest profiles first, leaving out zero counts."""
    return " + ".join(f"{name} ×{devices[name]}" for name in sorted(devices, key=profile_name_key) if devices[name])
