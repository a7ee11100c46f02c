"""The console: a read-only web page of the cluster served by the driver, what `topics
--describe`, `consumer-groups --describe` and the metrics would tell, at a glance.

A static page (console.html: plain HTML, CSS and a little JavaScript, no build step) that
reads `/api/overview` every few seconds and draws it: brokers, topics and partitions with their
leader, ISR, high watermark and Delta files, groups with their lag, and throughput charts.

Behind the cluster's TLS and HTTP Basic (rpc/http_door.py). The overview holds what the caller
may DESCRIBE only (cluster/console_view.py), so a browser signed in as a principal sees the
topics and groups that principal could describe with the CLI.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from http import HTTPStatus
from importlib import resources
from typing import Any

from deltabus.rpc.access import Access
from deltabus.rpc.http_door import HttpRequest, HttpResponse

OVERVIEW_PATH = "/api/overview"
TEXT = "text/plain; charset=utf-8"


class ConsoleApp:
    """The page and its overview (`overview`: what an Access may see of the cluster)."""

    name = "console"
    request_bytes_max = 0

    def __init__(self, overview: Callable[[Access], dict[str, Any]]) -> None:
        self._overview = overview
        self._page = resources.files("deltabus.rpc").joinpath("console.html").read_bytes()

    def serve(self, request: HttpRequest) -> HttpResponse:
        if request.method != "GET":
            return self.refusal(HTTPStatus.METHOD_NOT_ALLOWED,
                                f"{request.method} is not served: the console is read-only")
        if request.path in ("/", "/index.html"):
            return HttpResponse(HTTPStatus.OK, self._page, "text/html; charset=utf-8",
                                {"Cache-Control": "no-store"})
        if request.path == OVERVIEW_PATH:
            body = json.dumps(self._overview(request.access)).encode()
            return HttpResponse(HTTPStatus.OK, body, "application/json",
                                {"Cache-Control": "no-store"})
        return self.refusal(HTTPStatus.NOT_FOUND, f"{request.path} is not served here")

    def refusal(self, status: int, message: str) -> HttpResponse:
        return HttpResponse(status, (message + "\n").encode(), TEXT)
