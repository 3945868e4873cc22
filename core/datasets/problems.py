"""A dataset check's problems, as the API's error details: the first `MAX_LISTED` kept (each
at its line or row and field path), all counted, any of them refusing the whole file with
`InvalidInput` (422). Shared by the record formats (`core.datasets.formats`) and the token
files (`core.datasets.tokens`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from core.platform.errors import InvalidInput
from dataformat.records import describe_error, error_path

MAX_LISTED = 100


@dataclass
class Problems:
    """The first `MAX_LISTED` problems as API error details, and how many there were."""

    where: tuple[str, ...]
    listed: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0

    def add(
        self, unit: str | None, number: int | None, loc: list[str | int], msg: str, type_: str
    ) -> None:
        """One problem at `unit number` (`line 17`, `row 3`; None: the whole file)."""
        self.total += 1
        if len(self.listed) >= MAX_LISTED:
            return
        at: list[str | int] = [unit, number] if unit and number is not None else []
        detail: dict[str, Any] = {
            "loc": [*self.where, *at, *loc],
            "msg": f"{unit} {number}: {msg}" if at else msg,
            "type": type_,
        }
        if unit == "line":
            detail["line"] = number
        self.listed.append(detail)

    def add_validation(self, unit: str, number: int, exc: ValidationError) -> None:
        for error in exc.errors():
            self.add(unit, number, _loc(error), describe_error(error), str(error["type"]))

    def raise_if_any(self) -> None:
        if not self.total:
            return
        message = "dataset refused"
        if self.total > 1:
            shown = "all" if self.total <= MAX_LISTED else f"the first {MAX_LISTED}"
            message += f", {self.total} problems ({shown} listed in details), the first"
        raise InvalidInput(f"{message}: {self.listed[0]['msg']}", details=self.listed)


def _loc(error: Any) -> list[str | int]:
    """A pydantic error's location as a JSON path (union branches dropped; the field a record
    validator names in its message appended)."""
    loc: list[str | int] = [p for p in error["loc"] if error_path((p,))]
    field_name = str(error["msg"]).split(":", 1)[0]
    if ":" in str(error["msg"]) and field_name.isidentifier():
        loc.append(field_name)
    return loc
