"""What exists and what it costs: GPU types, node types, regions and models."""

from coral.catalog.loader import (
    Catalog,
    CatalogError,
    UnknownNameError,
    default_catalog,
    load_catalog,
)
from coral.catalog.schema import GpuType, ModelArch, MoeConfig, NodeType, Region, RegionPrice

__all__ = [
    "Catalog",
    "CatalogError",
    "GpuType",
    "ModelArch",
    "MoeConfig",
    "NodeType",
    "Region",
    "RegionPrice",
    "UnknownNameError",
    "default_catalog",
    "load_catalog",
]
