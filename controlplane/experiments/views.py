from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from controlplane.experiments.models import Experiment


@login_required
def experiment_list(request: HttpRequest) -> HttpResponse:
    experiments = Experiment.objects.select_related("created_by")
    return render(request, "experiments/experiment_list.html", {"experiments": experiments})
