"""The placement string grammar: comma-separated segments `resource_ranks[:process_ranks]`.

    placement := segment ("," segment)*
    segment   := resources [":" processes]
    resources := range | "all"
    processes := range            (never "all": a process count must be explicit)
    range     := INT | INT "-" INT   (inclusive, first <= last)

Parsing is independent of any cluster, so syntax errors are reported even when the
inventory itself is broken. Segments keep ranges as (first, last) pairs, never expanded.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigIssue, Path
from .ranks import RankSyntaxError, parse_rank_token

ALL = "all"


@dataclass(frozen=True, slots=True)
class RankRange:
    first: int
    last: int

    @property
    def count(self) -> int:
        return self.last - self.first + 1

    def __str__(self) -> str:
        return f"{self.first}-{self.last}" if self.last != self.first else str(self.first)


@dataclass(frozen=True, slots=True)
class Segment:
    """One `resource_ranks[:process_ranks]` entry; `resources is None` means `all`,
    `processes is None` means inferred (one process per resource, continuing the count)."""

    text: str
    resources: RankRange | None
    processes: RankRange | None


def parse_placement_string(
    text: str, *, component: str | None = None, path: Path = ()
) -> tuple[list[Segment], list[ConfigIssue]]:
    """Split a placement string into segments, collecting one issue per malformed segment."""
    segments: list[Segment] = []
    issues: list[ConfigIssue] = []

    def problem(rule: str, message: str, segment: str | None) -> None:
        # Messages name the component and segment themselves, to read well on their own.
        where = [f"component '{component}'"] if component else []
        if segment:
            where.append(f"segment '{segment}'")
        prefix = ", ".join(where) + ": " if where else ""
        issues.append(ConfigIssue(rule, prefix + message, path, component, segment))

    if text.strip() == "":
        problem("placement.empty", "the placement is empty: give resource ranks such as 0-7", None)
        return segments, issues
    for raw in text.split(","):
        segment_text = raw.strip()
        if segment_text == "":
            problem(
                "placement.segment_syntax",
                f"placement '{text}' has an empty segment (a stray comma)",
                segment_text,
            )
            continue
        parts = segment_text.split(":")
        if len(parts) > 2:
            problem(
                "placement.segment_syntax",
                f"{len(parts) - 1} colons; expected resource_ranks or resource_ranks:process_ranks",
                segment_text,
            )
            continue
        resources_text = parts[0].strip()
        resources: RankRange | None = None
        ok = True
        if resources_text != ALL:
            try:
                resources = RankRange(*parse_rank_token(resources_text))
            except RankSyntaxError as error:
                problem(
                    "placement.range_syntax",
                    f"resource ranks {error}",
                    segment_text,
                )
                ok = False
        processes: RankRange | None = None
        if len(parts) == 2:
            processes_text = parts[1].strip()
            if processes_text == ALL:
                problem(
                    "placement.all_processes",
                    "'all' may name resources but not process ranks; write the process "
                    "range, e.g. 0-7",
                    segment_text,
                )
                ok = False
            else:
                try:
                    processes = RankRange(*parse_rank_token(processes_text))
                except RankSyntaxError as error:
                    problem(
                        "placement.range_syntax",
                        f"process ranks {error}",
                        segment_text,
                    )
                    ok = False
        if ok:
            segments.append(Segment(segment_text, resources, processes))
    return segments, issues
