"""Every failure as OpenAI-shaped JSON with the status a client can act on; never a traceback.

    400 invalid_request_error   bad JSON, wrong types, values out of range, unsupported fields, prompt too long
    404 invalid_request_error   unknown model (code model_not_found), unknown route
    503 server_error            waiting queue full (code overloaded, with Retry-After)
    500 server_error            a bug; the traceback goes to the server log only
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.engine.async_engine import EngineDeadError, OverloadedError
from specdec.errors import ConfigError, OutOfBlocksError, PromptTooLongError, SpecdecError

log = logging.getLogger("specdec.server")


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def from_specdec(exc: SpecdecError, prompt_param: str = "prompt") -> APIError:
    """The API error for an engine-side refusal."""
    if isinstance(exc, OverloadedError):
        return APIError(503, str(exc), "server_error", code="overloaded",
                        headers={"Retry-After": str(exc.retry_after_s)})
    if isinstance(exc, EngineDeadError):
        return APIError(500, str(exc), "server_error", code="internal_error")
    if isinstance(exc, PromptTooLongError):
        return APIError(400, str(exc), param=prompt_param, code="context_length_exceeded")
    if isinstance(exc, OutOfBlocksError):
        return APIError(400, f"{exc} (or ask for fewer max_tokens)", param="max_tokens")
    if isinstance(exc, ConfigError):  # a prompt's, or a sampling control's checked against the model's vocabulary
        return APIError(400, str(exc), param=exc.field or prompt_param)
    return APIError(400, str(exc))


def from_validation(exc: ValidationError | RequestValidationError) -> APIError:
    """Pydantic's first complaint, naming the field the way the request spelled it."""
    first = exc.errors()[0]
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "extra_forbidden":
        message = f"unsupported field '{param}': specdec does not implement it"
    else:
        message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
    return APIError(400, message, param=param, code="invalid_value")


def install(app: FastAPI) -> None:
    """Register the handlers that turn every exception into an OpenAI-shaped response."""

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(SpecdecError)
    async def specdec_error(_: Request, exc: SpecdecError) -> JSONResponse:
        return from_specdec(exc).response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return from_validation(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = "not_found" if exc.status_code == 404 else None
        return APIError(exc.status_code, str(exc.detail), kind, code=code).response()

    @app.exception_handler(Exception)
    async def bug(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error while serving a request")
        return APIError(500, f"internal server error ({type(exc).__name__}); see the server log", "server_error",
                        code="internal_error").response()
