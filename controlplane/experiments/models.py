from django.conf import settings
from django.db import models


class Experiment(models.Model):
    """A named training configuration; its config lives in immutable revisions."""

    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    tags = models.JSONField(default=list, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return self.name

    @property
    def latest_revision(self) -> "Revision | None":
        return self.revisions.order_by("-number").first()


class Revision(models.Model):
    """One saved version of an experiment's config. Never changed once written."""

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField()
    config_yaml = models.TextField()
    message = models.CharField(max_length=300, blank=True)
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["experiment", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["experiment", "number"], name="unique_revision")
        ]

    def __str__(self) -> str:
        return f"{self.experiment.name}@{self.number}"
