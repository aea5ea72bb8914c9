"""The operator console: static pages at ``/ui`` and the list of report files it can open.

* ``GET /ui`` -> redirect to ``/ui/``; ``GET /ui/`` -> the single page; ``GET /ui/{file}`` -> one of
  the files in :data:`STATIC_DIR` (nothing else: the name must be one of them). No key is needed:
  the pages hold no data; every data call they make goes to the JSON APIs, which check the key the
  page sends as ``Authorization: Bearer`` (kept in ``sessionStorage``, never in a URL or a cookie,
  so there is nothing for a cross-site request to ride on). Pages are served with a strict
  ``Content-Security-Policy`` (same-origin scripts, styles and fetches only).
* ``GET /v1/ui/reports`` (admin) -> the replay / load-test JSON reports under ``ui.reports_dir``;
  ``GET /v1/ui/reports/{name}`` -> one of them, as written.

With ``ui.enabled: false`` every path here answers 404 with the error envelope.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse, Response

from app.config import UIConfig
from app.deps import AdminDep, UIConfigDep
from app.errors import NotFound

router = APIRouter(tags=["ui"])

STATIC_DIR = Path(__file__).resolve().parent.parent / "ui" / "static"
MAX_REPORT_BYTES = 8 * 2**20
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
MEDIA = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}


def _enabled(ui: UIConfig) -> None:
    if not ui.enabled:
        raise NotFound("The console is off (ui.enabled: false).", code="ui_disabled")


def _static(name: str) -> Response:
    path = STATIC_DIR / name
    if "/" in name or name.startswith(".") or not path.is_file():
        raise NotFound(f"No console file {name!r}.", code="not_found")
    return FileResponse(path, media_type=MEDIA.get(path.suffix, "application/octet-stream"), headers=HEADERS)


@router.get("/ui", include_in_schema=False)
async def ui_root(ui: UIConfigDep) -> Response:
    _enabled(ui)
    return RedirectResponse("/ui/", status_code=308)


@router.get("/ui/", include_in_schema=False)
async def ui_index(ui: UIConfigDep) -> Response:
    _enabled(ui)
    return _static("index.html")


@router.get("/ui/{name}", include_in_schema=False)
async def ui_file(name: str, ui: UIConfigDep) -> Response:
    _enabled(ui)
    return _static(name)


def report_kind(data: Any) -> str | None:
    """``replay`` (``ttc replay --json``), ``loadtest`` (``ttc loadtest``'s ``summary.json``) or None."""
    if isinstance(data, dict) and isinstance(data.get("rows"), list) and isinstance(data.get("uniform"), list):
        return "replay"
    if isinstance(data, dict) and isinstance(data.get("levels"), list) and isinstance(data.get("meta"), dict):
        return "loadtest"
    return None


def _read(path: Path) -> Any:
    if path.stat().st_size > MAX_REPORT_BYTES:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def list_reports(root: Path) -> list[dict[str, Any]]:
    """Report files under ``root`` (and one folder down, where ``ttc loadtest --out`` writes), newest
    first; files that are not reports are left out."""
    if not root.is_dir():
        return []
    found = []
    for path in [*root.glob("*.json"), *root.glob("*/*.json")]:
        data = _read(path)
        kind = report_kind(data)
        if kind is not None:
            st = path.stat()
            found.append({"name": path.relative_to(root).as_posix(), "kind": kind, "bytes": st.st_size,
                          "modified": st.st_mtime})
    return sorted(found, key=lambda r: (-r["modified"], r["name"]))


def _reports_dir(ui: UIConfig) -> Path | None:
    _enabled(ui)
    return ui.reports_dir


@router.get("/v1/ui/reports")
async def reports(ui: UIConfigDep, _who: AdminDep) -> dict[str, Any]:
    """The report files the service knows of (``ui.reports_dir``; empty list when none is set)."""
    root = _reports_dir(ui)
    found = await asyncio.to_thread(list_reports, root) if root else []  # file reads off the event loop
    return {"object": "list", "dir": str(root) if root else None, "data": found}


@router.get("/v1/ui/reports/{name:path}")
async def report(name: str, ui: UIConfigDep, _who: AdminDep) -> Any:
    """One listed report file, as written (only names :func:`list_reports` lists are served)."""
    root = _reports_dir(ui)
    listed = {r["name"] for r in await asyncio.to_thread(list_reports, root)} if root else set()
    if root is None or name not in listed:
        raise NotFound(f"No report {name!r}.", param="name", code="report_not_found")
    path = Path(os.path.normpath(root / name))
    return FileResponse(path, media_type="application/json")
