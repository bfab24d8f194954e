from django.apps import AppConfig


class RealtimeConfig(AppConfig):
    name = "controlplane.realtime"
    label = "realtime"
