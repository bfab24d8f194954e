from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "controlplane.api"
    label = "api"
