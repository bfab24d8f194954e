"""What a run's page and the compare page show, read in one place for the views and the
live socket alike."""

import hashlib
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe

from controlplane.access.doors import may
from controlplane.runs import artifacts, eval_tables
from controlplane.runs.evaluations import evaluation_choices
from controlplane.runs.forms import EvaluateForm
from controlplane.runs.frozen_config import (
    ConfigError,
    dump_value,
    frozen_config,
    frozen_section,
)
from controlplane.runs.interruption import resume_refusal
from controlplane.runs.models import Run, RunEvent, RunState
from controlplane.runs.selectors import with_figures
from trainer.cluster import ClusterConfigError, cluster_from_dict, resolve_placement
from trainer.config.addresses import redact_urls_in

EVENTS_SHOWN = 200  # the newest events on the page; all of them are in the API


def run_controls(run: Run, user: AbstractBaseUser | AnonymousUser) -> dict[str, bool]:
    """Which buttons the page shows: Stop while the run is active, Resume once it is
    interrupted or cancelled with a checkpoint, each only to a role that may press it."""
    resumable = run.state in (RunState.INTERRUPTED, RunState.CANCELLED)
    return {
        "can_stop": may(user, "run-stop", "POST") and run.is_active,
        "can_resume": resumable and may(user, "run-resume", "POST") and not resume_refusal(run),
    }


def eval_run_context(run: Run) -> dict[str, Any]:
    """An eval run's part of its page: what it evaluates and its table once reported."""
    table = eval_tables.table_of(run)
    options = run.eval_options or {}
    return {
        "source": run.source_run,
        "options": options,
        "tasks_asked": ",".join(map(str, options.get("tasks") or [])),
        "view": eval_tables.table_view(table) if table else None,
    }


def evaluations_context(
    run: Run, user: AbstractBaseUser | AnonymousUser, form: EvaluateForm | None = None
) -> dict[str, Any]:
    """A training run's evaluations (with their averages, and side by side per
    checkpoint) and the Evaluate form: shown to a role that may launch one, once the run
    has a checkpoint."""
    evaluations = eval_tables.evaluations_of(run)
    choices = evaluation_choices(run) if may(user, "run-evaluate", "POST") else None
    return {
        "evaluations": evaluations,
        "eval_tables": eval_tables.checkpoints_side_by_side(evaluations),
        "eval_choices": choices,
        "can_evaluate": bool(choices and choices.checkpoints),
        "eval_form": form or EvaluateForm(),
    }


def live_fragments(
    run_id: int, user: AbstractBaseUser | AnonymousUser, events: bool = True
) -> dict[str, str]:
    """The run page's live fragments by element id, as its socket sends them: the header
    and, with `events`, everything an event can change (events, placement, files,
    evaluations or an eval run's table). {} for no such run.

    The page shows the same HTML. It carries no hx-swap-oob: htmx's ws extension swaps
    each element of a socket message by its id anyway, and a page holding out-of-band
    fragments would have them swapped into whatever page an htmx response holding it
    lands on (a boosted link to it, the page Stop's redirect leads to)."""
    run = (
        with_figures(Run.objects.select_related("experiment", "revision", "created_by", "cluster"))
        .filter(pk=run_id)
        .first()
    )
    if run is None:
        return {}
    context: dict[str, Any] = {
        "run": run,
        # Passwords in camera URLs are the run's to use, nobody's to read.
        "overrides": [redact_urls_in(override) for override in run.overrides or []],
        **run_controls(run, user),
    }
    parts = {"run-header": render_to_string("runs/_run_header.html", context)}
    if not events:
        return parts
    context["events"] = recent_events(run)
    context["processes"] = where_it_runs(run)
    parts["run-events"] = render_to_string("runs/_events.html", context)
    parts["run-processes"] = render_to_string("runs/_processes.html", context)
    context["model"] = model_card(run)
    parts["run-model"] = render_to_string("runs/_model_card.html", context)
    if run.is_eval:  # its table arrives as the trainer's `evaluated` event
        context["eval_run"] = eval_run_context(run)
        parts["run-evaluation"] = render_to_string("runs/_evaluation.html", context)
    else:  # a checkpoint written: a new file, and Evaluate becomes available
        context.update(evaluations_context(run, user))
        parts["run-evaluations"] = render_to_string("runs/_evaluations.html", context)
    context["files"] = artifacts.list_artifacts(run.pk)
    parts["run-files"] = render_to_string("runs/_files.html", context)
    return parts


def fragment_digest(html: str) -> str:
    return hashlib.blake2b(html.encode(), digest_size=8).hexdigest()


def seen_fragments(parts: dict[str, str]) -> str:
    """What a page shows, for its socket's URL (`?seen=`): `id:digest` per fragment, so
    the socket's first send after the page load leaves alone what has not changed since
    (a control swapped then would lose the click that was on its way)."""
    return ",".join(f"{key}:{fragment_digest(html)}" for key, html in parts.items())


def template_names(parts: dict[str, str]) -> dict[str, SafeString]:
    """Fragments for a page's template, by names it can use (`run-header` → run_header).
    Safe: each is the output of our own templates, which escaped what they show."""
    return {key.replace("-", "_"): mark_safe(html) for key, html in parts.items()}


def parse_seen(text: str) -> dict[str, str]:
    """`seen_fragments` read back: {fragment id: digest}; what does not parse is left out
    (it is then sent, which is always safe)."""
    pairs = (item.partition(":") for item in text.split(",")[:20])
    return {key: digest for key, sep, digest in pairs if sep and key and digest}


def recent_events(run: Run) -> list[RunEvent]:
    """The newest events, oldest first."""
    # Recorded episodes have a section of their own (and there may be hundreds).
    newest = run.events.exclude(kind="episode").order_by("-created_at", "-pk")[:EVENTS_SHOWN]
    return list(reversed(newest))


# What the run page shows of a trainer's model card, in this order; other keys of the
# event (a newer trainer's) are not shown.
MODEL_CARD_FIELDS = (
    ("kind", "Kind"),
    ("family", "Family"),
    ("parameters", "Parameters"),
    ("trainable_parameters", "Trainable parameters"),
    ("lora", "LoRA"),
    ("freeze_vision", "Vision tower frozen"),
    ("gradient_checkpointing", "Gradient checkpointing"),
    ("action_bins", "Action bins per dim"),
    ("expert_parameters", "Action expert parameters"),
    ("chunk_size", "Actions per chunk"),
    ("denoising_steps", "Denoising steps"),
    ("noise", "Noise"),
    ("normalisation", "Normalisation statistics"),
    ("image_size", "Image size"),
    ("hidden_sizes", "Hidden sizes"),
)


def model_card(run: Run) -> dict[str, Any] | None:
    """The policy's card from the trainer's newest `model` event, as rows of label and
    text, plus its base folder and fingerprint; None before the trainer sent one."""
    event = run.events.filter(kind="model").order_by("-created_at", "-pk").first()
    if event is None or not isinstance(event.data, dict):
        return None
    data = event.data
    rows = [(label, _card_text(data[key], key)) for key, label in MODEL_CARD_FIELDS if key in data]
    base = data.get("base") if isinstance(data.get("base"), dict) else {}
    return {
        "rows": rows,
        "base_path": str(base.get("path", "")),
        "base_sha256": str(base.get("sha256", "")),
    }


def _card_text(value: Any, key: str = "") -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict):
        return ", ".join(f"{name} {_card_text(item)}" for name, item in value.items())
    if isinstance(value, list):
        joiner = " × " if key == "image_size" else ", "  # height × width
        return joiner.join(str(item) for item in value)
    return str(value)


@dataclass(frozen=True)
class ProcessTable:
    """The run's processes as planned and as reported; `error` says why the plan could
    not be read from the frozen config (the reported rows are still shown)."""

    rows: list[dict[str, Any]]
    error: str | None = None


def where_it_runs(run: Run) -> ProcessTable:
    """Each process of the run as the plan places it and as it reported itself (the
    newest `placed` event): component, rank, planned node and devices, reported node,
    pid, devices seen, interpreter. Planned rows come from the frozen config's
    `cluster:` section; without one, or for an eval run (`trainer eval` is one process
    whatever the source run's placement), the run is one process on node 0."""
    placed = run.events.filter(kind="placed").order_by("-created_at", "-pk").first()
    reported = {
        (p.get("component"), p.get("rank")): p
        for p in (placed.data.get("processes", []) if placed else [])
        if isinstance(p, dict)
    }
    error = None
    try:
        planned = _planned_processes(run)
    except (ConfigError, ClusterConfigError) as problem:
        planned, error = {}, f"The planned placement cannot be read: {problem}"
    keys = list(planned) + [key for key in reported if key not in planned]
    rows = [
        {"component": key[0], "rank": key[1], "plan": planned.get(key), "seen": reported.get(key)}
        for key in keys
    ]
    return ProcessTable(rows, error)


def _planned_processes(run: Run) -> dict[tuple[str, int], dict[str, Any]]:
    """Raises ConfigError or ClusterConfigError naming what is wrong."""
    section = frozen_section(run, "cluster")
    if not section or run.is_eval:
        return {("actor", 0): {"node_rank": 0, "devices": ""}}
    data = section.get("cluster", section)
    plan = resolve_placement(cluster_from_dict(data), data.get("component_placement"))
    return {
        (p.component, p.process_rank): {
            "node_rank": p.node_rank,
            "devices": ",".join(map(str, p.visible_accelerators)),
        }
        for p in plan.processes
    }


def config_problem(run: Run) -> str | None:
    """Why the run's frozen config cannot be read (shown on its page), or None."""
    try:
        frozen_config(run)
    except ConfigError as error:
        return str(error)
    return None


# The readers below fall back to the defaults when the frozen config cannot be read:
# the page then shows `config_problem` once, above everything.


def planning_horizons(run: Run) -> list[int]:
    """The distinct horizons of the run's `rollout.action_horizons_pattern`, ascending
    (the frozen config was validated at launch; [] when it has none)."""
    try:
        pattern = frozen_section(run, "rollout").get("action_horizons_pattern") or []
    except ConfigError:
        return []
    return sorted({h for h in pattern if isinstance(h, int) and not isinstance(h, bool)})


def algorithm_name(run: Run) -> str:
    """The run's `algorithm.name` (its charts differ: RLPD has Q values, buffers,
    interventions); ppo, the default, when the config does not say."""
    try:
        return str(frozen_section(run, "algorithm").get("name") or "ppo")
    except ConfigError:
        return "ppo"


def has_console(run: Run) -> bool:
    """Whether the run has robots an operator can take over (`env.interventions.source:
    console`): only such a run offers a console."""
    return not run.is_eval and intervention_source(run) == "console"


def intervention_source(run: Run) -> str:
    """The run's `env.interventions.source` (an on-policy run with one charts its
    intervention rate too); none when the config does not say."""
    try:
        return str(frozen_section(run, "env", "interventions").get("source") or "none")
    except ConfigError:
        return "none"


def chart_context(run: Run) -> dict[str, Any]:
    """What the page's charts script needs to start, as JSON for `json_script`."""
    return {
        "run": run.pk,
        "label": run_label(run),
        "horizons": planning_horizons(run),
        "algorithm": algorithm_name(run),
        "interventions": intervention_source(run),
        "state": run.state,
        "active": run.is_active,
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "progress_step": run.progress_step,
        "progress_total": run.progress_total,
    }


def run_label(run: Run) -> str:
    """How a legend names a run: "run 12 · demo r3"."""
    return f"run {run.pk} · {run.experiment.name} r{run.revision.number}"


class BadRunIds(ValueError):
    """The compare page's `ids` do not name two or more existing runs."""


MAX_COMPARED = 12


def runs_to_compare(ids: str) -> list[Run]:
    """The runs named by `ids` ("1,2,5"), in that order; raises BadRunIds naming what is
    wrong (not numbers, unknown runs, fewer than two, too many)."""
    parts = [part.strip() for part in ids.split(",") if part.strip()]
    not_numbers = [part for part in parts if not part.isdigit()]
    if not_numbers:
        raise BadRunIds(f"not run ids: {', '.join(not_numbers)} (give numbers, e.g. ?ids=3,7)")
    wanted = list(dict.fromkeys(int(part) for part in parts))
    if len(wanted) < 2:
        raise BadRunIds("choose at least two runs to compare (e.g. ?ids=3,7)")
    if len(wanted) > MAX_COMPARED:
        raise BadRunIds(f"at most {MAX_COMPARED} runs at once; {len(wanted)} were given")
    found = Run.objects.select_related("experiment", "revision").in_bulk(wanted)
    missing = [str(pk) for pk in wanted if pk not in found]
    if missing:
        raise BadRunIds(f"no such run: {', '.join(missing)}")
    return [found[pk] for pk in wanted]


def config_differences(runs: list[Run]) -> list[tuple[str, list[str]]]:
    """The frozen config keys (dotted paths) whose values are not the same in every run,
    with each run's value as YAML text ("—" where a run lacks the key). Raises
    ConfigError when a run's frozen config cannot be read."""
    flat = [_flatten(frozen_config(run)) for run in runs]
    keys = sorted(set().union(*flat))
    differing = []
    for key in keys:
        # A key set to null, or to an empty mapping, is as good as absent.
        values = [_MISSING if one.get(key) in (None, {}) else one[key] for one in flat]
        if any(value != values[0] for value in values):
            differing.append((key, [_shown(value) for value in values]))
    return differing


_MISSING = object()


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): node}


def _shown(value: Any) -> str:
    if value is _MISSING:
        return "—"
    return redact_urls_in(dump_value(value))
