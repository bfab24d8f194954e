"""Robots an operator can take over: the driver interface a real arm implements, the
simulated robot that stands in for it, and the bridge between them, the run's
intervention source and the control plane's console."""
