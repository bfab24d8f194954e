from django import forms

from controlplane.inventory.models import Cluster


class ExperimentForm(forms.Form):
    name = forms.SlugField(max_length=100)
    description = forms.CharField(required=False)
    tags = forms.CharField(required=False, help_text="Comma-separated.")
    config_yaml = forms.CharField(widget=forms.Textarea(attrs={"rows": 24}))

    def clean_tags(self) -> list[str]:
        return [tag.strip() for tag in self.cleaned_data["tags"].split(",") if tag.strip()]


class RevisionForm(forms.Form):
    config_yaml = forms.CharField(widget=forms.Textarea(attrs={"rows": 24}))
    message = forms.CharField(required=False, max_length=300)


class CloneForm(forms.Form):
    name = forms.SlugField(max_length=100, label="New name")


class LaunchForm(forms.Form):
    cluster = forms.ModelChoiceField(
        Cluster.objects.all(), required=False, to_field_name="name",
        # No cluster: the whole run is one trainer process on the control plane's Ray.
        empty_label="this process, no placement",
    )  # fmt: skip
    overrides = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "runner.iterations=20"}),
        help_text="One key=value per line.",
    )
    timeout_s = forms.IntegerField(required=False, min_value=1, label="Timeout (s)")
    tags = forms.CharField(
        required=False, max_length=500, help_text="Comma-separated, added to the experiment's."
    )

    def clean_tags(self) -> list[str]:
        return [tag.strip() for tag in self.cleaned_data["tags"].split(",") if tag.strip()]

    def clean_overrides(self) -> list[str]:
        lines = [line.strip() for line in self.cleaned_data["overrides"].splitlines()]
        overrides = [line for line in lines if line]
        bad = [line for line in overrides if "=" not in line]
        if bad:
            raise forms.ValidationError(f"Not key=value: {', '.join(bad)}")
        return overrides
