from django.conf import settings
from django.db import models


class Experiment(models.Model):
    """A named training configuration that runs are launched from."""

    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    tags = models.JSONField(default=list, blank=True)
    config_yaml = models.TextField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return self.name
