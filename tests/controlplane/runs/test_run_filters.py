"""The runs list's FilterSet copies its filters shallow for each request (a deep copy
was most of its cost): each request's filters must still be its own."""

from controlplane.runs.run_filters import RunFilterSet


def test_each_request_filters_with_filters_of_its_own():
    first, second = RunFilterSet({"tag": "a"}), RunFilterSet({"tag": "b"})
    for name in first.filters:
        assert first.filters[name] is not second.filters[name]
        assert first.filters[name] is not RunFilterSet.base_filters[name]
        assert first.filters[name].parent is first
    # the method filter calls its own set's method, not a shared one's
    assert first.filters["tag"].filter.f is first.filters["tag"]
    assert first.form.fields["state"] is not second.form.fields["state"]
