from django import forms

from trainer.config import YamlLimits


class ClusterImportForm(forms.Form):
    name = forms.SlugField(max_length=100, help_text="Letters, digits, - and _.")
    description = forms.CharField(required=False, widget=forms.TextInput)
    yaml_text = forms.CharField(
        label="Cluster YAML", required=False, widget=forms.Textarea(attrs={"rows": 12})
    )
    yaml_file = forms.FileField(label="…or a YAML file", required=False)

    def clean(self) -> dict:
        data = super().clean()
        upload = data.get("yaml_file")
        limit = YamlLimits.from_env().max_bytes
        if upload is not None and upload.size > limit:
            self.add_error(
                "yaml_file",
                f"The file is {upload.size} bytes; a cluster file may have at most {limit} "
                "bytes (setting ARMATURE_YAML_MAX_BYTES).",
            )
        elif upload is not None:
            try:
                data["yaml_text"] = upload.read().decode("utf-8")
            except UnicodeDecodeError:
                self.add_error("yaml_file", "The file is not UTF-8 text.")
        if not (data.get("yaml_text") or "").strip() and not self.errors:
            raise forms.ValidationError("Paste the cluster YAML or choose a file.")
        return data


class ClusterYamlForm(forms.Form):
    yaml_text = forms.CharField(label="Cluster YAML", widget=forms.Textarea(attrs={"rows": 24}))
