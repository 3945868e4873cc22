"""The contract's error body becomes the matching exception, with field paths for 422."""

from __future__ import annotations

import pytest

from torchyard.errors import (
    ApiError,
    Conflict,
    ErrorDetail,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    ServerError,
    Unauthorized,
    ValidationFailed,
    error_from_response,
)
from torchyard.render import error_lines


def _body(code: str, message: str, details: list[dict[str, object]] | None = None) -> dict:
    return {"error": {"code": code, "message": message, "details": details or []}}


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (401, "unauthorized", Unauthorized),
        (403, "forbidden", PermissionDenied),
        (404, "not_found", NotFound),
        (409, "conflict", Conflict),
        (413, "payload_too_large", PayloadTooLarge),
        (422, "validation_error", ValidationFailed),
        (500, "internal_error", ServerError),
        (503, "unavailable", ServerError),
        (418, "teapot", ApiError),
    ],
)
def test_status_maps_to_its_exception_class(status: int, code: str, cls: type) -> None:
    exc = error_from_response(status, _body(code, "boom"))
    assert type(exc) is cls
    assert (exc.status, exc.code, exc.message) == (status, code, "boom")


def test_validation_details_keep_json_paths() -> None:
    exc = error_from_response(
        422,
        _body(
            "validation_error",
            "invalid spec",
            [
                {"loc": ["body", "model", "n_heads"], "msg": "must divide d_model", "type": "x"},
                {"loc": ["body", "data", "include", 0], "msg": "bad glob", "type": "y"},
                {"loc": ["body"], "msg": "whole body", "type": "z"},
            ],
        ),
    )
    assert [d.path for d in exc.details] == ["model.n_heads", "data.include[0]", "<body>"]
    assert exc.details[0] == ErrorDetail(("body", "model", "n_heads"), "must divide d_model", "x")


def test_422_is_shown_as_one_line_per_field_without_repeating_the_first() -> None:
    exc = error_from_response(
        422,
        _body(
            "validation_error",
            "invalid request: body.model.n_heads: n_heads (5) must divide (and 1 more)",
            [
                {
                    "loc": ["body", "model", "n_heads"],
                    "msg": "n_heads (5) must divide",
                    "type": "x",
                },
                {"loc": ["body", "name"], "msg": "required", "type": "missing"},
            ],
        ),
    )
    assert error_lines(exc) == [
        "invalid request (422 validation_error):",
        "  model.n_heads: n_heads (5) must divide",
        "  name: required",
    ]


def test_an_informative_message_is_kept_above_its_details() -> None:
    exc = error_from_response(
        403,
        _body(
            "forbidden",
            "path '/etc' is outside the allowed data roots",
            [{"loc": ["body", "uri"], "msg": "outside allowed roots", "type": "forbidden"}],
        ),
    )
    assert error_lines(exc) == [
        "path '/etc' is outside the allowed data roots (403 forbidden)",
        "  uri: outside allowed roots",
    ]
    assert error_lines(error_from_response(404, _body("not_found", "job 9 not found"))) == [
        "job 9 not found (404 not_found)"
    ]


def test_non_contract_bodies_still_raise_with_the_text() -> None:
    exc = error_from_response(502, None, "<html>Bad Gateway</html>")
    assert isinstance(exc, ServerError)
    assert exc.code == "http_502"
    assert "Bad Gateway" in exc.message


def test_fastapi_default_detail_is_understood() -> None:
    exc = error_from_response(404, {"detail": "Not Found"})
    assert isinstance(exc, NotFound)
    assert exc.message == "Not Found"
