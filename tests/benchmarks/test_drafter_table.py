"""tools/drafter_table.py: the README's drafter table comes from the shipped heads' metadata and one tau file."""

from __future__ import annotations

import json

import pytest

from tools import drafter_table


def _tau(tmp_path, rows):
    path = tmp_path / "tau.json"
    path.write_text(json.dumps({"target": "smollm2-135m", "prompts": 14, "quantize": "int8", "rows": rows,
                                "command": "python bench/heldout_tau.py --methods x"}))
    return path


ROWS = [{"drafter": "eagle", "tree": "dynamic:depth=5,topk=3,budget=7", "tau": 2.0661},
        {"drafter": "eagle", "tree": "chain:k=2", "tau": 1.6417},
        {"drafter": "ngram", "tree": "chain:k=5", "tau": 1.618}]


def test_table_reads_the_shipped_metadata_and_the_measured_tau(tmp_path, capsys):
    assert drafter_table.main(["--tau", str(_tau(tmp_path, ROWS))]) == 0
    out = capsys.readouterr().out
    eagle = next(line for line in out.splitlines() if line.startswith("| `eagle`"))
    meta = json.loads((drafter_table.ASSETS / "eagle" / "smollm2-135m" / "specdec_eagle.json").read_text())
    assert f"{meta['corpus']['sequences']:,} sequences" in eagle  # from the head's own record
    assert "**2.066** (`dynamic:depth=5,topk=3,budget=7`), 1.642 (`chain:k=2`)" in eagle  # first tree in bold
    assert "MB" in eagle
    assert "not measured" in next(line for line in out.splitlines() if line.startswith("| `draft`"))
    assert "| `ngram` (no training, for reference) | prompt lookup | - | **1.618** (`chain:k=5`) |" in out


def test_readme_block_is_replaced_between_the_markers_only(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{drafter_table.BEGIN}\nold table\n{drafter_table.END}\nafter\n")
    assert drafter_table.main(["--tau", str(_tau(tmp_path, ROWS)), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith(f"before\n{drafter_table.BEGIN}\n| drafter |") and text.endswith(f"{drafter_table.END}\nafter\n")
    assert "old table" not in text
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="drafter-table"):
        drafter_table.main(["--tau", str(_tau(tmp_path, ROWS)), "--readme", str(readme)])


def test_a_missing_tau_file_is_one_error_line(tmp_path, capsys):
    assert drafter_table.main(["--tau", str(tmp_path / "none.json")]) == 2
    assert capsys.readouterr().err.startswith("error: no held-out tau file")
