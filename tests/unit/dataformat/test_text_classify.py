"""`dataformat.text.classify`: one read per file sorts a directory's files as registration
lists them, by the rule the trainer applies (`sniff`: a problem in the first block is binary)."""

from __future__ import annotations

from pathlib import Path

from dataformat.readers import DataFile
from dataformat.text import BLOCK_BYTES, CleanBlocks, classify, sniff


def test_binary_repaired_and_text_files_by_where_their_first_problem_lies(tmp_path: Path) -> None:
    lead = b"x = 1\n" * (BLOCK_BYTES // 6 + 10)  # past the first block
    files = {
        "a.so": b"\x7fELF\x02\x01\x01\x00" + b"z" * 100,
        "b.py": lead + b"# caf\xe9\n",
        "c.py": "é = 1\n".encode() * 10,
        "d.txt": b"ok\n" + b"\xff" * 3,
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    found = classify([DataFile(name, str(tmp_path / name)) for name in sorted(files)])
    assert [f.path for f in found.binary] == ["a.so", "d.txt"]
    assert [f.path for f in found.repaired] == ["b.py"]
    assert f"byte {len(lead) + 6} " in found.repaired[0].reason  # the 0xe9 after "# caf"
    assert found.total_bytes == sum(len(d) for d in files.values())
    for name in files:  # the trainer's rule says the same of each file
        binary = sniff(str(tmp_path / name), name) is not None
        assert binary == (name in {"a.so", "d.txt"}), name
    clean = CleanBlocks()
    kept = clean.clean((tmp_path / "b.py").read_bytes()) + clean.finish()
    assert kept == lead + b"# caf\n" and clean.dropped == 1
