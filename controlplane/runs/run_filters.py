"""The runs list's filters and orderings, as a django-filter `FilterSet`: the API's list
(where drf-spectacular documents them) and the runs page read the same one."""

from __future__ import annotations

import copy
import functools
import json
from typing import Any, ClassVar

import django_filters as filters
from django.db import connection
from django.db.models import F, QuerySet

from controlplane.runs.models import Run, RunKind, RunState

# The orderings a caller names, and the annotated field each sorts by.
ORDER_FIELDS = {"created": "created_at", "success": "latest_success", "duration": "duration"}
ORDERINGS = tuple(f"{sign}{name}" for name in ORDER_FIELDS for sign in ("", "-"))
DEFAULT_ORDERING = "-created"
FILTERS = ("state", "experiment", "tag", "creator", "kind")


def _unknown(what: str, values: tuple[str, ...] | list[str]) -> dict[str, str]:
    return {"invalid_choice": f"Unknown {what} '%(value)s'; use one of {', '.join(values)}."}


class CopiedShallow:
    """A FilterSet deep-copies its filters for every request, choices and messages
    included: most of what a list request spends in it. A filter's per-request state is
    only its `parent` and `model`, set on the copy, so a shallow copy is enough."""

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        copied = copy.copy(self)
        if getattr(copied, "method", None) is not None:
            copied.method = copied.method  # its FilterMethod must call the copy's parent
        return copied


@functools.cache
def copied_shallow(cls: type) -> type:
    """`cls` whose instances are copied shallow when deep-copied (see CopiedShallow)."""
    return type(cls.__name__, (CopiedShallow, cls), {})


class ChoiceFilter(CopiedShallow, filters.ChoiceFilter):
    pass


class CharFilter(CopiedShallow, filters.CharFilter):
    pass


class RunOrdering(CopiedShallow, filters.OrderingFilter):
    """Sorts by one of ORDER_FIELDS, runs without a value (no success yet, not started)
    last either way; ties newest first."""

    def get_ordering_value(self, param: str):
        descending = param.startswith("-")
        field = F(ORDER_FIELDS[param.lstrip("-")])
        return field.desc(nulls_last=True) if descending else field.asc(nulls_last=True)

    def filter(self, qs: QuerySet, value: list[str] | None) -> QuerySet:
        ordering = [self.get_ordering_value(param) for param in value or [DEFAULT_ORDERING]]
        return qs.order_by(*ordering, "-pk")


class RunFilterSet(filters.FilterSet):
    state = ChoiceFilter(
        choices=RunState.choices, help_text="only runs in this state",
        error_messages=_unknown("state", RunState.values),
    )  # fmt: skip
    experiment = CharFilter(
        field_name="experiment__name", help_text="only runs of this experiment (name)"
    )
    tag = CharFilter(method="with_tag", help_text="only runs with this tag")
    creator = CharFilter(
        field_name="created_by__username", help_text="only runs launched by this username"
    )
    kind = ChoiceFilter(
        choices=RunKind.choices, help_text="only runs of this kind",
        error_messages=_unknown("kind", RunKind.values),
    )  # fmt: skip
    ordering = RunOrdering(
        fields=tuple((field, name) for name, field in ORDER_FIELDS.items()),
        help_text=f"default {DEFAULT_ORDERING}",
        error_messages=_unknown("ordering", ORDERINGS),
    )

    class Meta:
        model = Run
        fields: list[str] = []

    # The form's class depends on nothing but the filters above: built once, not for
    # every request (building it is most of what a FilterSet costs per request).
    _form_class: ClassVar[type | None] = None

    def get_form_class(self) -> type:
        cls = type(self)
        if cls.__dict__.get("_form_class") is None:
            form_class = super().get_form_class()
            # A form deep-copies its fields too, for every request; these are only
            # read (cleaning a query string), never changed by one.
            for field in form_class.base_fields.values():
                field.__class__ = copied_shallow(type(field))
            cls._form_class = form_class
        return cls._form_class

    def __init__(self, data=None, *args, **kwargs) -> None:
        if data is not None and "user" in data and "creator" not in data:
            # `user` is what the runs page called `creator` before the API named it.
            data = data.copy()
            data["creator"] = data["user"]
        super().__init__(data, *args, **kwargs)

    def with_tag(self, runs: QuerySet, name: str, tag: str) -> QuerySet:
        if connection.features.supports_json_field_contains:
            return runs.filter(tags__contains=[tag])
        # SQLite: the JSON text holds the tag quoted as a whole element.
        return runs.filter(tags__icontains=json.dumps(tag))

    @property
    def qs(self) -> QuerySet:
        runs = super().qs
        if not (self.is_bound and self.form.cleaned_data.get("ordering")):
            runs = self.filters["ordering"].filter(runs, None)  # the default ordering
        return runs


def chosen(filterset: RunFilterSet) -> dict[str, str]:
    """What the list is filtered and sorted by, for the page's form: nothing but the
    default order when a parameter is wrong (the page says which)."""
    found = filterset.form.cleaned_data if filterset.is_valid() else {}
    ordering = found.get("ordering") or [DEFAULT_ORDERING]
    return {**{name: found.get(name) or "" for name in FILTERS}, "ordering": ordering[0]}


def problems(filterset: RunFilterSet) -> dict[str, str]:
    """{parameter: what is wrong with it} (empty when every parameter is right)."""
    return {name: " ".join(errors) for name, errors in filterset.errors.items()}
