"""The README's examples of testing code with hwtimer run as written: each
``.. example file: NAME`` comment names the file the code block under it
is, and pytest runs them in a fresh directory, with hwtimer's plugin
loaded from its entry point as in a user's project."""

from __future__ import annotations

import re
import textwrap

import pytest
from conftest import README

pytest_plugins = ["pytester"]

EXAMPLE = re.compile(
    r"^\.\. example file: (?P<name>\S+)\n\n\.\. code-block:: python\n\n(?P<code>(?:    .*\n|\n)+)",
    re.MULTILINE,
)


def readme_examples() -> dict[str, str]:
    return {
        m["name"]: textwrap.dedent(m["code"]).strip() + "\n"
        for m in EXAMPLE.finditer(README.read_text())
    }


def test_readme_examples_run_as_written(pytester: pytest.Pytester) -> None:
    pytest.importorskip("pytest_asyncio")
    files = readme_examples()
    assert set(files) == {"sessions.py", "test_sessions.py", "fetcher.py", "test_fetcher.py"}
    for name, code in files.items():
        pytester.path.joinpath(name).write_text(code)
    pytester.makeini(
        "[pytest]\nfilterwarnings = error\nasyncio_default_fixture_loop_scope = function\n"
    )
    # without looptime's plugin, if it is installed: see pyproject.toml
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:looptime_plugin", "-q"
    )
    result.assert_outcomes(passed=4)
