"""The instance types the gateway accepts: its catalog plus types the nodes define.

Operators may define types in a node's config file. A node lists every type it knows
in its capacity snapshots' ``fit`` map, so a name seen there but missing here is learnt
by asking the nodes (the ``ec2.DescribeInstanceTypes`` fan-out) and kept from then on.
A name nobody knows is ``InvalidParameterValue``: an unknown type is never reported as
a full cluster.
"""

from __future__ import annotations

from roost.bus.schemas import TypeInfo
from roost.domain.catalog import Catalog, InstanceType
from roost.domain.errors import InvalidParameterValue
from roost.gateway.capacity import CapacityView
from roost.gateway.nodes import NodeClient

FAN_OUT_SECONDS = 0.5


def from_info(info: TypeInfo) -> InstanceType | None:
    """A type as a node describes it; a node from before model sets sends one model."""
    models = info.gpu_models or ([info.gpu_model] if info.gpu_model else [])
    try:
        t = InstanceType(info.name, info.cpu_milli, info.mem_mib, info.gpu_count,
                         info.gpu_milli, tuple(models))
        t.validate()
    except ValueError:
        return None
    return t


class TypeRegistry:
    def __init__(self, catalog: Catalog, nodes: NodeClient, view: CapacityView) -> None:
        self._types: dict[str, InstanceType] = dict(catalog.items())
        self._nodes = nodes
        self._view = view

    def get(self, name: str) -> InstanceType | None:
        return self._types.get(name)

    def all(self) -> dict[str, InstanceType]:
        return dict(self._types)

    async def refresh(self) -> None:
        """Learn the types live nodes know and this gateway does not (catalog wins)."""
        if not self._view.advertised_types() - self._types.keys():
            return
        replies = await self._nodes.describe_types(
            timeout=FAN_OUT_SECONDS, expect=self._view.live_count()
        )
        for reply in replies:
            for info in reply.types:
                if info.name not in self._types and (t := from_info(info)) is not None:
                    self._types[t.name] = t

    async def resolve(self, name: str) -> InstanceType:
        found = self._types.get(name)
        if found is None:
            await self.refresh()
            found = self._types.get(name)
        if found is None:
            raise InvalidParameterValue(f"Invalid value '{name}' for InstanceType.")
        return found
