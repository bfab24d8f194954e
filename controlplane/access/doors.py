"""The one table of who may do what, and the decision it gives.

Every URL (by its name) and every WebSocket route has a row here: for each method it
answers to, the rule a caller must meet. A method missing from a row is refused (405),
and a URL or route missing from the table is refused altogether, so a new door is
closed until someone writes its rule. tests/controlplane/test_access_matrix.py walks
every URL and route with every kind of caller against this table.
"""

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from controlplane.access.roles import has_role, role_of


class Rule(enum.StrEnum):
    PUBLIC = "public"  # anyone, logged in or not
    VIEWER = "viewer"  # any logged-in user
    OPERATOR = "operator"
    ADMIN = "admin"
    RUN_TOKEN = "run token"  # a trainer presenting the signed token of the run in the URL
    SIGNED = "signed"  # the body carries a SECRET_KEY signature, which the view checks
    # Django's admin site: the admin role and, as Django itself asks, `is_staff`; then
    # Django's model permissions decide what the user may do there.
    ADMIN_STAFF = "admin + staff"


ROLE_RULES = (Rule.VIEWER, Rule.OPERATOR, Rule.ADMIN)


class Kind(enum.StrEnum):
    """How a door says no (see docs/permissions.md)."""

    PAGE = "page"  # HTML: anonymous callers go to the login page
    API = "api"  # REST: 401 without credentials
    SOCKET = "socket"  # WebSocket: closed with a 44xx code before the handshake ends
    PART = "part"  # a part of another door's answer that needs more than the door


CONNECT = "CONNECT"  # the one "method" of a WebSocket route
SEE = "SEE"  # the one "method" of a part


@dataclass(frozen=True)
class Door:
    kind: Kind
    what: str
    rules: Mapping[str, Rule] = field(default_factory=dict)
    # For a door mounted only in the one-machine mode (no Redis channel layer): its path,
    # so the table stays the same in both modes.
    one_machine_path: str = ""

    def rule(self, method: str) -> Rule | None:
        method = method.upper()
        if method == "HEAD" or (method == "OPTIONS" and self.kind is Kind.API):
            method = "GET"  # HEAD is GET without the body; DRF answers OPTIONS as a read
        return self.rules.get(method, self.rules.get("*"))  # "*": every method

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(self.rules)


def page(what: str, **rules: Rule) -> Door:
    return Door(Kind.PAGE, what, rules)


def api(what: str, **rules: Rule) -> Door:
    return Door(Kind.API, what, rules)


def socket(what: str, rule: Rule) -> Door:
    return Door(Kind.SOCKET, what, {CONNECT: rule})


def part(what: str, rule: Rule) -> Door:
    return Door(Kind.PART, what, {SEE: rule})


PUBLIC, VIEWER, OPERATOR, ADMIN = Rule.PUBLIC, Rule.VIEWER, Rule.OPERATOR, Rule.ADMIN

# Keyed by URL name (`namespace:name` inside a namespace) or, for sockets and parts,
# by the name their code uses. Reading is for every logged-in user; launching,
# stopping and editing experiments for operators; the cluster inventory, shared by
# every run, for admins.
DOORS: dict[str, Door] = {
    # --- Pages -----------------------------------------------------------------------
    "home": page("home page", GET=VIEWER),
    "healthz": page("overall and per-component up/down", GET=PUBLIC),
    "login": page("log in (attempts are rate-limited)", GET=PUBLIC, POST=PUBLIC),
    "logout": page("log out", POST=PUBLIC),
    "settings": page("your role and API tokens", GET=VIEWER),
    "token-create": page("create an API token of your own", POST=VIEWER),
    "token-revoke": page("revoke an API token of your own", POST=VIEWER),
    "run-list": page("runs", GET=VIEWER),
    "run-detail": page("a run", GET=VIEWER),
    "run-logs": page("a run's log tail", GET=VIEWER),
    "run-stop": page("stop a run", POST=OPERATOR),
    "run-resume": page("resume an interrupted or cancelled run", POST=OPERATOR),
    "run-evaluate": page("evaluate a run's checkpoint (launches an eval run)", POST=OPERATOR),
    "run-file": page("download one of a run's files", GET=VIEWER),
    "run-episodes": page("a run's recorded episodes, filtered (its page's grid)", GET=VIEWER),
    "run-episode-video": page("one recorded episode's video (Range for seeking)", GET=VIEWER),
    "run-diff": page("config diff of two runs", GET=VIEWER),
    "run-compare": page("charts of several runs overlaid", GET=VIEWER),
    "run-compare-episodes": page(
        "compared runs' episodes of one init state, side by side", GET=VIEWER
    ),
    "experiment-list": page("experiments; create one", GET=VIEWER, POST=OPERATOR),
    "experiment-validate": page("validate a config as you type", POST=VIEWER),
    "experiment-detail": page("an experiment; save a revision", GET=VIEWER, POST=OPERATOR),
    "experiment-diff": page("diff of two revisions", GET=VIEWER),
    "experiment-clone": page("clone an experiment", POST=OPERATOR),
    "experiment-launch": page("launch a run", POST=OPERATOR),
    "run-launch": page("launch a run of a chosen experiment (Home's dialog)", POST=OPERATOR),
    "experiment-launch-preview": page("placement of a launch", GET=VIEWER),
    "run-launch-preview": page("placement of a launch (any experiment)", GET=VIEWER),
    "cluster-list": page("clusters; import one", GET=VIEWER, POST=ADMIN),
    "cluster-validate": page("validate a cluster YAML as you type", POST=VIEWER),
    "cluster-detail": page("a cluster", GET=VIEWER),
    "cluster-live": page("a cluster's live Ray nodes", GET=VIEWER),
    "cluster-edit": page("edit a cluster's YAML", GET=ADMIN, POST=ADMIN),
    "cluster-export": page("a cluster as YAML", GET=VIEWER),
    "cluster-placement": page("placement preview page", GET=VIEWER),
    "cluster-placement-preview": page("placement preview as you type", POST=VIEWER),
    "robot-list": page("robots", GET=VIEWER),
    "console": page("operator console: the robots online", GET=VIEWER),
    "console-robots": page("one run's robots: live camera, state and controls", GET=VIEWER),
    "console-audit": page("every takeover of a robot", GET=VIEWER),
    "sweep-list": page("sweeps", GET=VIEWER),
    "sweep-detail": page("a sweep: its trials, charts and importances (live)", GET=VIEWER),
    "sweep-new": page(
        "a new sweep of an experiment: the form; start it", GET=VIEWER, POST=OPERATOR
    ),  # fmt: skip
    "sweep-cancel": page("cancel a sweep (stops its running trials)", POST=OPERATOR),
    "sweep-best-revision": page(
        "a new experiment revision from a sweep's best trial", POST=OPERATOR
    ),
    "api-docs": page("the API docs (Swagger UI)", GET=VIEWER),
    "realtime-relay": Door(
        Kind.PAGE,
        "other processes publish to browsers (one-machine mode only: not mounted with Redis)",
        {"POST": Rule.SIGNED},
        # realtime.publish.RELAY_PATH: the generated table, checked in both modes, keeps
        # the two equal.
        one_machine_path="/internal/realtime/publish",
    ),
    # --- REST API (/api/v1/) -----------------------------------------------------------
    "api-root": api("the API's index", GET=VIEWER),
    "api-schema": api("the OpenAPI schema", GET=VIEWER),
    "api-cluster-list": api("clusters; create one", GET=VIEWER, POST=ADMIN),
    "api-cluster-detail": api("a cluster; replace, delete", GET=VIEWER, PUT=ADMIN, DELETE=ADMIN),
    "api-cluster-export": api("a cluster as YAML", GET=VIEWER),
    "api-cluster-nodes": api("a cluster's nodes", GET=VIEWER),
    "api-robot-list": api("robots", GET=VIEWER),
    "api-robot-detail": api("a robot", GET=VIEWER),
    "placement-preview": api("resolve a placement (computes only)", POST=VIEWER),
    "api-experiment-list": api("experiments; create one", GET=VIEWER, POST=OPERATOR),
    "api-experiment-detail": api("an experiment", GET=VIEWER),
    "api-experiment-revisions": api("revisions; add one", GET=VIEWER, POST=OPERATOR),
    "api-run-list": api("runs; launch one", GET=VIEWER, POST=OPERATOR),
    "api-run-detail": api("a run", GET=VIEWER),
    "api-run-cancel": api("cancel a run", POST=OPERATOR),
    "api-run-resume": api("resume an interrupted or cancelled run", POST=OPERATOR),
    "api-run-evaluate": api("evaluate a run's checkpoint (launches an eval run)", POST=OPERATOR),
    "api-run-evaluation": api("an eval run's per-task table", GET=VIEWER),
    "api-run-evaluations": api("a run's evaluations with their averages", GET=VIEWER),
    "api-run-artifacts": api("a run's files with their sizes", GET=VIEWER),
    "api-run-artifact": api("download one of a run's files", GET=VIEWER),
    "api-run-episodes": api("a run's recorded episodes, filtered", GET=VIEWER),
    "api-run-episode": api("one recorded episode's video", GET=VIEWER),
    "api-run-reconcile": api("re-read a run's Ray job", POST=OPERATOR),
    "api-run-logs": api("a run's logs", GET=VIEWER),
    "api-run-events": api("a run's events", GET=VIEWER),
    "api-run-metrics": api(
        "a run's metrics: one key's points by page, or each key's latest", GET=VIEWER
    ),
    "api-run-series": api("a run's metric series, downsampled into buckets", GET=VIEWER),
    "api-run-latest": api("every metric's latest value of a run", GET=VIEWER),
    "api-run-success": api("a run's success per horizon and task, from summed counts", GET=VIEWER),
    "api-sweep-list": api("sweeps; start one", GET=VIEWER, POST=OPERATOR),
    "api-sweep-detail": api("a sweep with its trials and importances", GET=VIEWER),
    "api-sweep-cancel": api("cancel a sweep (stops its running trials)", POST=OPERATOR),
    "api-sweep-best-revision": api(
        "a new experiment revision from a sweep's best trial", POST=OPERATOR
    ),
    # --- WebSockets ---------------------------------------------------------------------
    "ws-status": socket("live system status panel", VIEWER),
    "ws-runs": socket("live runs list", VIEWER),
    "ws-run": socket("live header, events and metric points of one run", VIEWER),
    "ws-trainer": socket("a trainer's link for its run", Rule.RUN_TOKEN),
    "ws-console": socket("live robots of a run (operators also drive them)", VIEWER),
    "ws-sweep": socket("live trials, charts and importances of one sweep", VIEWER),
    # --- Parts of an answer -------------------------------------------------------------
    "healthz-detail": part("/healthz's latency, detail and topology per component", VIEWER),
    "console-control": part(
        "take over, drive, release, mark, e-stop a robot (on ws-console)", OPERATOR
    ),
    "console-clear-any-stop": part(
        "clear an e-stop another operator pressed (on ws-console; who pressed it may "
        "clear their own)",
        ADMIN,
    ),
    "config-process-settings": part(
        "env vars and interpreter in an experiment's own cluster section (saving or "
        "launching one; docs/permissions.md#process-level-settings)",
        ADMIN,
    ),
}

# Django's admin site: one rule for every URL in its namespace, which its
# `has_permission` asks (access/admin_site.py). Django's own login page is the exception
# (public, as the project's is); who is let in then meets Django's model permissions.
ADMIN_SITE_NAMESPACE = "admin"
ADMIN_SITE = Door(Kind.PAGE, "Django's admin site (but its login page)", {"*": Rule.ADMIN_STAFF})


class Answer(enum.Enum):
    ALLOW = "allow"
    LOG_IN = "log in"  # no credentials: the caller must authenticate first
    FORBIDDEN = "forbidden"
    NO_SUCH_METHOD = "method not allowed"


@dataclass(frozen=True)
class Verdict:
    answer: Answer
    reason: str = ""
    methods: tuple[str, ...] = ()  # what the door answers to, for a 405's Allow header

    @property
    def allowed(self) -> bool:
        return self.answer is Answer.ALLOW


ALLOW = Verdict(Answer.ALLOW)


def row_of(door: str) -> Door | None:
    """The table's row for a door: its own, or the admin site's for a URL of that site."""
    if door.partition(":")[0] == ADMIN_SITE_NAMESPACE:
        return ADMIN_SITE
    return DOORS.get(door)


def verdict(user: AbstractBaseUser | AnonymousUser | None, door: str, method: str) -> Verdict:
    """May `user` use `method` on `door`? Roles (and for the admin site, Django's staff
    flag) only: run tokens are decided by their own door (sockets.py)."""
    row = row_of(door)
    if row is None:
        return Verdict(Answer.FORBIDDEN, f"No access rule covers {door!r} yet.")
    rule = row.rule(method)
    if rule is None:
        return Verdict(Answer.NO_SUCH_METHOD, f"{door} does not answer {method}.", row.methods)
    if rule in (Rule.PUBLIC, Rule.SIGNED):
        return ALLOW
    if rule not in (*ROLE_RULES, Rule.ADMIN_STAFF):
        return Verdict(Answer.FORBIDDEN, f"{door} is for a {rule}, not a user.")
    role = role_of(user)
    if role is None:
        return Verdict(Answer.LOG_IN, "Log in first.")
    if rule is Rule.ADMIN_STAFF and not (user.is_active and user.is_staff):
        return Verdict(Answer.FORBIDDEN, f"{door} is for staff with the admin role.")
    needed = Rule.ADMIN if rule is Rule.ADMIN_STAFF else rule
    if not has_role(user, needed.value):
        return Verdict(Answer.FORBIDDEN, f"This needs the {needed} role; you are {role}.")
    return ALLOW


def may(user: AbstractBaseUser | AnonymousUser | None, door: str, method: str = "GET") -> bool:
    """For views and templates that show a button only to those who may press it."""
    return verdict(user, door, method).allowed
