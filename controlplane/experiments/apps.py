from django.apps import AppConfig


class ExperimentsConfig(AppConfig):
    name = "controlplane.experiments"
    label = "experiments"
