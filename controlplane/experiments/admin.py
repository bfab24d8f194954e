from django.contrib import admin

from controlplane.experiments.models import Experiment


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = ["name", "created_by", "updated_at"]
    search_fields = ["name", "description"]
