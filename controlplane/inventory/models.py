from django.db import models


class Cluster(models.Model):
    """A team's cluster, described by the `cluster:` section of a config."""

    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    config_yaml = models.TextField(help_text="The cluster: section, as YAML.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
