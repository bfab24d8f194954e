"""Running trainer components on Ray: placement of a resolved plan onto live nodes
(`ray_placement`), the collectives actor ranks train through (`collective`), and the
driver of a distributed run (`distributed_run`).

Modules are imported where they are used, so the single-process path (which uses
`collective` only) never pays for importing Ray."""
