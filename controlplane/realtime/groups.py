"""Names of the channel-layer groups, in one place."""

SYSTEM_STATUS = "system.status"
