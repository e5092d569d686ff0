"""MIG catalog, layout validation and placement: a pure core, no Django and no I/O."""

from sharing.mig.catalog import PRODUCTS, GpuProduct, MigProfile, UnknownProductError, get_product, mig_resources
from sharing.mig.placement import (
    LayoutResult,
    Placement,
    format_layout,
    maximal_layouts,
    parse_layout,
    validate_layout,
)

__all__ = [
    "PRODUCTS",
    "GpuProduct",
    "LayoutResult",
    "MigProfile",
    "Placement",
    "UnknownProductError",
    "format_layout",
    "get_product",
    "maximal_layouts",
    "mig_resources",
    "parse_layout",
    "validate_layout",
]
