"""Admin for the inventory. A cluster is edited as its YAML, validated by the trainer's
rules like everywhere else; the rows it produces are shown read-only."""

from django import forms
from django.contrib import admin

from controlplane.inventory import services
from controlplane.inventory.models import Cluster, EnvConfig, Node, NodeGroup, Robot
from trainer import cluster as tc


class ClusterAdminForm(forms.ModelForm):
    yaml_text = forms.CharField(
        label="Cluster YAML", widget=forms.Textarea(attrs={"rows": 30, "cols": 100})
    )

    class Meta:
        model = Cluster
        fields = ["name", "description"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            text, problems = services.editable_cluster_yaml(self.instance)
            self.fields["yaml_text"].initial = text
            if problems:  # rows edited into an invalid cluster: say what to fix
                listed = "; ".join(str(problem) for problem in problems)
                self.fields["yaml_text"].help_text = f"The stored cluster is invalid: {listed}"

    def clean_yaml_text(self) -> str:
        text = self.cleaned_data["yaml_text"]
        try:
            self.cleaned_data["spec"] = tc.load_cluster_yaml(text)
            services.ensure_storable(self.cleaned_data["spec"])
        except tc.ClusterConfigError as error:
            raise forms.ValidationError(error.messages) from None
        return text


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class NodeGroupInline(ReadOnlyInline):
    model = NodeGroup
    fields = [
        "label", "node_ranks", "accelerator_type", "accelerator_count", "hardware_type",
        "ignore_hardware",
    ]  # fmt: skip


class NodeInline(ReadOnlyInline):
    model = Node
    fields = [
        "rank", "groups", "accelerator_type", "accelerator_count", "python_interpreter_path",
        "python_interpreters",
    ]  # fmt: skip


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    form = ClusterAdminForm
    list_display = ["name", "num_nodes", "description", "updated_at"]
    search_fields = ["name"]
    inlines = [NodeGroupInline, NodeInline]

    def get_readonly_fields(self, request, obj=None) -> list[str]:
        return ["name"] if obj else []  # clusters are stored by name

    def save_model(self, request, obj, form, change) -> None:
        saved = services.save_cluster(
            obj.name, form.cleaned_data["spec"], form.cleaned_data["description"]
        )
        obj.pk = saved.pk


@admin.register(Robot)
class RobotAdmin(admin.ModelAdmin):
    list_display = ["__str__", "node_rank", "robot_ip"]
    readonly_fields = ["node_group", "hardware_rank", "node_rank", "robot_ip", "camera_serials"]
    fields = readonly_fields

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(EnvConfig)
class EnvConfigAdmin(RobotAdmin):
    list_display = ["node_group", "node_ranks", "python_interpreter_path"]
    readonly_fields = ["node_group", "node_ranks", "env_vars", "python_interpreter_path"]
    fields = readonly_fields
