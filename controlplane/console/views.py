from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from controlplane.access.pages import guarded


@guarded
def console_index(request: HttpRequest) -> HttpResponse:
    return render(request, "console/index.html")
