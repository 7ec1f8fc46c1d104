"""The README's quick start runs as written (documentation that is executed)."""
import os
import re

import pytest

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def python_blocks():
    with open(README) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_python_block_runs(index, capsys):
    exec(compile(python_blocks()[index], f"README.md block {index}", "exec"), {})
    assert "num_edges" in capsys.readouterr().out or index > 0  # the quick start prints stats
