"""Training sessions of the Tinker-compatible API (docs/sessions.md), read the Torchyard way:
which are live, their training clients and the jobs serving them, their calls.

    with Client() as client:
        for s in client.sessions.list(state="active").items:
            print(s.id, s.display_name, [m.current_step for m in s.models])

The sessions themselves are driven by the official `tinker` client; ``torchyard sessions`` and
``torchyard sessions show`` are these calls.
"""

from __future__ import annotations

from typing import Literal

from torchyard.transport import Transport
from torchyard.types import Page, TrainingSession


class Sessions:
    """``client.sessions``: list and read the project's training sessions."""

    def __init__(self, client: Transport) -> None:
        self._client = client

    def list(
        self,
        *,
        state: Literal["active", "ended"] | None = None,
        offset: int | None = None,
        limit: int | None = None,
    ) -> Page[TrainingSession]:
        """One page of the project's sessions, newest first (`next_cursor`: pass as
        `offset`)."""
        answer = self._client.request(
            "GET", "/v1/sessions", params={"state": state, "offset": offset, "limit": limit}
        )
        return Page[TrainingSession].model_validate(
            {"items": answer["items"], "next_cursor": answer.get("next_offset")}
        )

    def get(self, session_id: str) -> TrainingSession:
        """One session. Raises `NotFound` (another project's too)."""
        answer = self._client.request("GET", f"/v1/sessions/{session_id}")
        return TrainingSession.model_validate(answer)
