"""Running trainer components on Ray: placement of a resolved plan onto live nodes."""

from .ray_placement import (
    PlacedActor,
    PlacementUnsatisfiable,
    actor_options,
    check_plan_against_nodes,
    create_placed_actors,
    runtime_env_for,
)

__all__ = [
    "PlacedActor",
    "PlacementUnsatisfiable",
    "actor_options",
    "check_plan_against_nodes",
    "create_placed_actors",
    "runtime_env_for",
]
