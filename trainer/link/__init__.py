"""The link from a training run to the control plane: metrics, progress and events out
over a WebSocket, authenticated by the run's token. See docs/link-protocol.md.

The wire format (`protocol.py`, `console_messages.py`, `spool.py`: pydantic and the
standard library) is shared with the control plane, which imports those modules alone;
so this package's own import pulls in nothing. The trainer's end: `client.TrainerLink`,
`environment.link_from_env`, `reporter.RunReporter` / `EvalReporter` / `run_link`.
"""
