from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from controlplane.inventory.models import Cluster


@login_required
def cluster_list(request: HttpRequest) -> HttpResponse:
    return render(request, "inventory/cluster_list.html", {"clusters": Cluster.objects.all()})


@login_required
def robot_list(request: HttpRequest) -> HttpResponse:
    return render(request, "inventory/robot_list.html")
