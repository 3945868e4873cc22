"""The job spec: what a user submits, the one vocabulary every side validates with.

Pure pydantic (and `dataformat`): the API, core, the workers, the client SDK and the trainer all
import it, and it imports none of them (`tests/unit/project/test_layers.py`). One module per part:

- `jobspec.job`: `JobSpec` (the built-in trainer), `ScriptJobSpec` (`entrypoint`), their
  sections, `parse_job_spec` and the public JSON Schema (`json_schema`);
- `jobspec.data`, `jobspec.method`, `jobspec.entrypoint`: the data, method and entrypoint
  sections; `jobspec.base`: what every section shares (unknown fields are errors);
- `jobspec.checks`: the rules across fields and sections, each naming the field to change;
- `jobspec.sweep`: `SweepSpec`, a sweep's search space over a base spec, checked against it;
- `jobspec.stored`: reading a spec back from the database (upgraded by version, never raises).
"""
