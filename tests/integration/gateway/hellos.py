"""Hello requests as a daemon sends them to the reference gateway, for the gateway tests."""

from __future__ import annotations

from typing import Any

from workers.gateway import HelloRequest


def request(**kw: Any) -> HelloRequest:
    fields = {
        "node_id": "n1",
        "cert_serial": "n1-serial",
        "role": "worker",
        "boot_id": "b1",
        "journal_id": "j1",
    }
    return HelloRequest(**{**fields, **kw})
