"""Identifiers that look like the real ones (UUIDs, pod-name suffixes) and are cheap to make by the hundred thousand."""

from __future__ import annotations

import hashlib

_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet of Kubernetes' generated name suffixes


def uuid4_text(value: int) -> str:
    """128 bits as a version-4 UUID: what uuid.UUID(int=..., version=4) prints, several times faster."""
    h = f"{value & ((1 << 128) - 1):032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


def _digest(parts: tuple[object, ...]) -> bytes:
    return hashlib.sha256(":".join(map(str, parts)).encode()).digest()


def stable_uuid(*parts: object) -> str:
    """A UUID4 that depends only on its inputs (GPU and MIG device UUIDs repeat for the same seed)."""
    return uuid4_text(int.from_bytes(_digest(parts)[:16], "big"))


def suffix(*parts: object, length: int = 5) -> str:
    return "".join(_SUFFIX_ALPHABET[b % len(_SUFFIX_ALPHABET)] for b in _digest(parts)[:length])
