"""The child process of a `python` grader (`trainer.graders.PythonProcess`): loads the team's
`grade(sample, item)` and answers one JSON line for each JSON line it reads.

Run by path in isolated mode (`python -I trainer/grader_child.py`), never imported, so it uses
the standard library only. `-I` ignores every `PYTHON*` variable and the user's site-packages and
leaves the script's folder out of `sys.path`; the job's code directory (the working directory)
is put first on it on purpose, so that a grader may import its neighbours.

Protocol, UTF-8 JSON lines on the process's original stdin and stdout (the team's code gets
/dev/null as stdin and the parent's stderr as stdout, so a `print` cannot break the protocol):
first `{"source": "<python>"}` or `{"file": "<path>"}` is read and the code loaded, answered
with `{"ready": true}` or `{"error": "..."}` (the code travels on the pipe, not in argv, whose
entries Linux caps at 128 KiB and `ps` shows); then for each `{"sample": {...}, "item": {...}}`
read, `{"score": <finite float>}` or `{"error": "..."}` (an exception in `grade`, or a return
value that is no finite real number).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import numbers
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, BinaryIO


def main() -> None:
    protocol_in, protocol_out = _protocol_streams()
    sys.path.insert(0, os.getcwd())
    try:
        grade = _load(json.loads(protocol_in.readline()))
    except BaseException as exc:
        _send(protocol_out, {"error": _describe(exc)})
        return
    _send(protocol_out, {"ready": True})
    for line in protocol_in:
        request = json.loads(line)
        _send(protocol_out, _answer(grade, request["sample"], request["item"]))


def _protocol_streams() -> tuple[BinaryIO, BinaryIO]:
    """The original stdin and stdout as private binary streams; fd 0 becomes /dev/null and fd 1
    the parent's stderr, line-buffered, for the team's code (a child killed at a timeout loses
    no whole line it printed)."""
    protocol_in = os.fdopen(os.dup(0), "rb")
    protocol_out = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # a TextIOWrapper
    return protocol_in, protocol_out


def _load(code: dict[str, str]) -> Callable[..., Any]:
    """The `grade` function of inline source (`{"source": ...}`) or of a file (`{"file": path}`).
    Raises what loading the code raises, or `TypeError` when `grade` is missing or does not take
    (sample, item)."""
    if "source" in code:
        namespace: dict[str, Any] = {"__name__": "grader"}
        exec(compile(code["source"], "<source>", "exec"), namespace)
        grade = namespace.get("grade")
    else:
        spec = importlib.util.spec_from_file_location("grader", code["file"])
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {code['file']}")
        module = importlib.util.module_from_spec(spec)
        sys.modules["grader"] = module
        spec.loader.exec_module(module)
        grade = getattr(module, "grade", None)
    if not callable(grade):
        raise TypeError("the code defines no function `grade(sample, item)`")
    try:
        inspect.signature(grade).bind({}, {})
    except TypeError:
        signature = inspect.signature(grade)
        raise TypeError(f"grade{signature} cannot be called as grade(sample, item)") from None
    except ValueError:  # a builtin without a signature: its calls will tell
        pass
    return grade


def _answer(grade: Callable[..., Any], sample: Any, item: Any) -> dict[str, Any]:
    try:
        score = grade(sample, item)
    except BaseException as exc:  # the team's exception is the sample's result, not ours
        return {"error": _describe(exc)}
    if isinstance(score, bool) or not isinstance(score, numbers.Real):
        return {"error": f"grade() returned {type(score).__name__}, not a number"}
    if not math.isfinite(float(score)):
        return {"error": f"grade() returned {float(score)}, not a finite number"}
    return {"score": float(score)}


def _describe(exc: BaseException) -> str:
    """`Type: message`, with the line of the team's code it was raised from when known."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    if frames:
        text += f" (line {frames[-1].lineno} of {os.path.basename(frames[-1].filename)})"
    return text


def _send(stream: BinaryIO, message: dict[str, Any]) -> None:
    stream.write(json.dumps(message).encode() + b"\n")
    stream.flush()


if __name__ == "__main__":
    main()
