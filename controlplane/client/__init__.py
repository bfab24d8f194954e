"""Armature's CI client: submit an experiment, launch a run, wait for it, check metric
gates, write JSON and JUnit XML reports.

Standard library only and no Django, so a CI job runs it with any Python ≥ 3.11 and a
checkout of this package: `python -m controlplane.client submit EXPERIMENT.yaml --wait`.
See docs/ci.md.
"""
