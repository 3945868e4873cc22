"""YAML read with the YAML 1.2 core schema's scalars, on PyYAML (a YAML 1.1 library).

Two YAML 1.1 rules surprise spec authors: `on`, `off`, `yes`, `no` are booleans (so the key of
`retries.on` would become `True`), and `3e-4` without a dot is a string. Here only
`true`/`false` are booleans and `3e-4` is a float, as in YAML 1.2 and JSON. The server
(`core.jobs.spec_yaml`) and the CLI (`torchyard.specs`) read specs with this one loader, so a file
means the same to both. Pure: PyYAML only.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

_BOOL = "tag:yaml.org,2002:bool"
_FLOAT = "tag:yaml.org,2002:float"


class Loader(yaml.SafeLoader):
    """`yaml.SafeLoader` with YAML 1.2 booleans and floats (see the module docstring)."""


Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Loader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
Loader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.VERBOSE,
    ),
    list("-+0123456789."),
)


def load(text: str) -> Any:
    """Parse one YAML document. Raises `yaml.YAMLError` when it does not parse."""
    return yaml.load(text, Loader=Loader)
