"""Bodies of the code archive routes (`api/routes/code.py`, docs/CONTRACTS.md section 5)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from api import openapi_examples
from api.schemas import PRINTABLE, Timestamp

CodeName = Annotated[str, Field(min_length=1, max_length=200, pattern=PRINTABLE)]


class CodeArchiveSummary(BaseModel):
    """An uploaded code archive, as listed (without its files)."""

    model_config = openapi_examples.config(openapi_examples.CODE_ARCHIVE_SUMMARY)

    id: str = Field(description='"code_" and 16 hex digits; what `entrypoint.code` names.')
    name: str = Field(description="The form's `name`, else the uploaded file's name.")
    format: Literal["tar.gz", "zip"] = Field(description="The archive's format.")
    sha256: str = Field(description="Hex sha256 of the archive's bytes (unique per project).")
    size_bytes: int = Field(description="The archive's size.")
    unpacked_bytes: int = Field(description="Its regular files' sizes added up.")
    num_files: int = Field(description="Its regular files.")
    created_at: Timestamp = Field(description="When it was uploaded; UTC, ISO 8601.")


class CodeArchive(CodeArchiveSummary):
    """An uploaded code archive with the relative paths of its regular files, sorted."""

    model_config = openapi_examples.config(openapi_examples.CODE_ARCHIVE)

    files: list[str] = Field(description="Relative paths of its regular files, sorted.")


class CodeArchiveList(BaseModel):
    model_config = openapi_examples.config(openapi_examples.CODE_ARCHIVE_LIST)

    items: list[CodeArchiveSummary] = Field(description="Newest first.")
