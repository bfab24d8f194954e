from django import forms

from controlplane.runs.evaluations import EvalRequest


class EvaluateForm(forms.Form):
    """The run page's Evaluate form; the request is checked by runs.evaluations."""

    checkpoint = forms.IntegerField(required=False, min_value=0, label="Checkpoint")
    suite = forms.CharField(required=False, max_length=100, label="Suite")
    tasks = forms.CharField(
        required=False, max_length=2000, label="Tasks", help_text="Task ids, e.g. 0,3"
    )
    states = forms.IntegerField(required=False, label="States per task")

    def clean_suite(self) -> str | None:
        return self.cleaned_data["suite"].strip() or None

    def clean_tasks(self) -> list[int] | None:
        parts = [part.strip() for part in self.cleaned_data["tasks"].split(",")]
        parts = [part for part in parts if part]
        if not parts:
            return None
        bad = [part for part in parts if not part.lstrip("-").isdigit()]
        if bad:
            raise forms.ValidationError(f"not task ids: {', '.join(bad)} (give e.g. 0,3)")
        return [int(part) for part in parts]

    def request(self) -> EvalRequest:
        data = self.cleaned_data
        return EvalRequest(data["checkpoint"], data["suite"], data["tasks"], data["states"])
