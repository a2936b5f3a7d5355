"""The inspector page (SPEC SV1, issue 38 item 6): ``GET /`` and ``GET /inspector/*``.

A single page in plain JavaScript (``index.html``, ``app.js``, ``app.css`` next to this file,
shipped in the wheel) that reads the JSON routes of ``threadkeep serve`` with the API key a
person types in; it loads nothing from the network. The page itself needs no key (it holds
no data); ``GET /inspector/session`` tells the page whose key it holds (user and role), so
that it offers the admin's sweep only to admins. Everything it shows comes from ``/api/*``.
These routes are the page's, not the API's: the OpenAPI schema leaves them out.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from threadkeep.errors import AuthenticationError

__all__ = ["ASSETS", "routes"]

HERE: Final = Path(__file__).parent
# The files served, by name: nothing else in this folder is reachable.
ASSETS: Final = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
# Only this server's own files and routes: no CDN, no inline script, no framing.
_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def routes(identify: Callable[[str], tuple[str, str] | None]) -> list[Any]:
    """The inspector's routes for the Starlette app.

    Args:
        identify: The ``(user, role)`` of a bearer key, ``None`` for an unknown key.
    """
    from starlette.requests import Request
    from starlette.responses import FileResponse, JSONResponse, Response
    from starlette.routing import Route

    def asset(name: str) -> Response:
        return FileResponse(HERE / name, media_type=ASSETS[name], headers=_HEADERS)

    async def index(request: Request) -> Response:
        return asset("index.html")

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:
            return JSONResponse(
                {"error": "not_found", "message": f"the inspector has no file {name!r}; open / for the page"},
                status_code=404,
            )
        return asset(name)

    async def session(request: Request) -> Response:
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else ""
        found = identify(token) if token else None
        if found is None:
            refused = AuthenticationError("send Authorization: Bearer <an API key>")
            return JSONResponse(refused.to_dict(), status_code=401, headers={"WWW-Authenticate": "Bearer"})
        user, role = found
        return JSONResponse({"user": user, "role": role})

    # The page's own routes, not the API's: left out of the OpenAPI schema.
    return [
        Route("/", index, methods=["GET"], include_in_schema=False),
        Route("/inspector/session", session, methods=["GET"], include_in_schema=False),
        Route("/inspector/{name}", static, methods=["GET"], include_in_schema=False),
    ]
