"""Server administration: `python -m core.admin migrate | bootstrap | create-key`.

`torchyard admin ...` runs this module in a subprocess, so the client package stays light.
"""

from __future__ import annotations

import argparse
import sys

from sqlalchemy.engine import make_url

from core.access import auth
from core.platform.db import get_engine, session_scope, upgrade
from core.platform.settings import get_settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchyard admin")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", help="apply database migrations (alembic upgrade head)")
    boot = sub.add_parser(
        "bootstrap",
        help="create a project (if absent) and an organisation admin key (may create projects)",
    )
    boot.add_argument("--project", default="default")
    boot.add_argument("--key-name", default="bootstrap")
    boot.add_argument(
        "--replace",
        action="store_true",
        help="revoke the project's earlier organisation admin keys of this name (a rerun "
        "keeps one key, not one more each time)",
    )
    args = parser.parse_args(argv)

    settings = get_settings()
    if args.command == "migrate":
        upgrade(settings.direct_database_url)  # DDL straight to Postgres, not through a pooler
        shown = make_url(settings.direct_database_url).render_as_string(hide_password=True)
        print(f"migrated {shown}")
        return 0
    with session_scope(get_engine(settings)) as session:
        project = auth.get_project_by_name(session=session, name=args.project)
        if project is None:
            project = auth.create_project(session=session, name=args.project)
        if args.replace:
            secret = auth.replace_org_admin_key(
                session=session, project_id=project.id, name=args.key_name
            )
        else:
            secret = auth.create_api_key(
                session=session, project_id=project.id, name=args.key_name, org_admin=True
            )
    print(f"project {project.name} ({project.id})", file=sys.stderr)
    print(f"TORCHYARD_API_KEY={secret}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
