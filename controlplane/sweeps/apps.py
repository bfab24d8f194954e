from django.apps import AppConfig


class SweepsConfig(AppConfig):
    name = "controlplane.sweeps"
    label = "sweeps"
