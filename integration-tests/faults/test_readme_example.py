"""The README's fault-injection example, run as written (its code block is this test's body)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_fault_injection_example_runs_as_written(josef_cluster):
    text = README.read_text()
    section = text[text.index("<!-- faults-example:begin -->"):text.index("<!-- faults-example:end -->")]
    namespace: dict = {}
    exec(compile(re.search(r"```python\n(.*?)```", section, re.S).group(1), str(README), "exec"), namespace)
    namespace["test_isolated_leader"](josef_cluster)
