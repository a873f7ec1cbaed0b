"""The build: one version, the backend it asked for, and setup.py's
refusals, each one clear line.

setup.py's checks run in a subprocess as `setup.py build_ext` would run
them, with one thing taken away: the platform, Python.h, the compiler,
pthread.  What they print on stderr must be one line naming what is
missing, never the compiler's own output (but for the one line in which a
compiler that runs refuses a flag).

HWTIMER_PORTABLE=1 in the environment of a build forces the portable POSIX
backend of src/hwt_sys.c on Linux; CI sets it for the build and for the
tests, so that a build that silently kept the futex one fails here.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

import hwtimer
from hwtimer import _hwtimer

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "setup.py"


def test_version_comes_from_one_place():
    assert hwtimer.__version__ == importlib.metadata.version("hwtimer")
    pyproject = ROOT / "pyproject.toml"
    if pyproject.exists():
        text = pyproject.read_text()
        assert 'dynamic = ["version"]' in text
        assert 'version = { attr = "hwtimer.__version__" }' in text


def test_test_extra_has_the_pytest_asyncio_the_ini_options_need():
    # pyproject.toml sets asyncio_default_fixture_loop_scope, an option of
    # pytest-asyncio 0.24; an older one leaves it unknown, and under
    # filterwarnings = error that PytestConfigWarning stops every run
    # before the first test.
    from packaging.requirements import Requirement

    requires = [Requirement(r) for r in importlib.metadata.requires("hwtimer") or []]
    found = [r for r in requires if r.name == "pytest-asyncio"]
    assert found, requires
    for requirement in found:
        assert not requirement.specifier.contains("0.23.8"), str(requirement)


def run_build(tmp_path: Path, prelude: str = "", env: dict[str, str] | None = None):
    """Runs `setup.py build_ext` from the source tree into `tmp_path`, after
    `prelude` (run once setuptools is imported)."""
    if not SETUP.exists():
        pytest.skip("setup.py is not beside these tests")
    pytest.importorskip("setuptools")
    argv = ["setup.py", "build_ext", "--build-lib", str(tmp_path / "lib")]
    argv += ["--build-temp", str(tmp_path / "temp")]
    code = "\n".join(
        [
            "import runpy, sys",
            "import setuptools, setuptools.command.build_ext",
            textwrap.dedent(prelude),
            f"sys.argv = {argv!r}",
            "runpy.run_path('setup.py', run_name='__main__')",
        ]
    )
    full_env = {**os.environ, **(env or {})}
    full_env.pop("PYTHONWARNINGS", None)
    # a build loads no extension: a sanitizer's runtime that
    # scripts/sanitize.sh preloads only reaches the compiler (and a shell
    # wrapping it, which TSan's crashes)
    full_env.pop("LD_PRELOAD", None)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def build_ext(tmp_path: Path, prelude: str = "", env: dict[str, str] | None = None):
    """run_build(), which must refuse: returns its one line of error."""
    proc = run_build(tmp_path, prelude, env)
    assert proc.returncode != 0, "the build went on\n" + proc.stdout + proc.stderr
    assert not (tmp_path / "lib").exists(), "something was built"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_backend_is_the_one_the_build_asked_for():
    if os.environ.get("HWTIMER_PORTABLE", "0") not in ("", "0"):
        assert _hwtimer._backend == "posix"
    elif sys.platform.startswith("linux"):
        assert _hwtimer._backend == "futex"
    else:
        assert _hwtimer._backend == "posix"


@pytest.mark.parametrize(
    ("value", "werror"), [("1", True), ("0", False), ("", False), (None, False)]
)
def test_werror_switch_reads_like_the_others(value, werror):
    # HWTIMER_WERROR=0 is off, as HWTIMER_PORTABLE=0 and HWTIMER_LIMITED_API=0 are
    if not SETUP.exists():
        pytest.skip("setup.py is not beside these tests")
    env = {k: v for k, v in os.environ.items() if k != "HWTIMER_WERROR"}
    if value is not None:
        env["HWTIMER_WERROR"] = value
    code = "import runpy; print(runpy.run_path('setup.py', run_name='setup')['compile_args'])"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert ("'-Werror'" in proc.stdout) == werror, proc.stdout


def test_unsupported_platform_is_refused(tmp_path):
    line = build_ext(tmp_path, "sys.platform = 'win32'")
    assert line == (
        "error: hwtimer builds on POSIX systems only (Linux, macOS, the BSDs: its core"
        " needs POSIX threads); this platform is 'win32'"
    )


def test_another_python_implementation_is_refused(tmp_path):
    prelude = """
        import types
        sys.implementation = types.SimpleNamespace(**{**vars(sys.implementation), "name": "pypy"})
    """
    line = build_ext(tmp_path, prelude)
    assert line == (
        "error: hwtimer builds for CPython only (its C binding relies on CPython's object"
        " layout and GIL); this Python is 'pypy'"
    )


def test_limited_api_is_refused_before_its_base(tmp_path):
    # a cp310-abi3 wheel built by 3.9 would claim versions it was not built for
    prelude = """
        import collections
        fields = "major minor micro releaselevel serial"
        sys.version_info = collections.namedtuple("version_info", fields)(3, 9, 18, "final", 0)
    """
    line = build_ext(tmp_path, prelude, env={"HWTIMER_LIMITED_API": "1"})
    assert line == (
        "error: HWTIMER_LIMITED_API=1 builds against the stable ABI of CPython 3.10,"
        " which this Python 3.9 lacks: build it with CPython 3.10 or later, or without"
        " HWTIMER_LIMITED_API for a cp39 wheel"
    )


def test_core_refuses_a_platform_without_posix_threads():
    # A compiler for a system that is neither Unix nor macOS stops at one
    # #error that names the problem, setup.py's check or not.
    if not (ROOT / "src" / "hwt_sys.c").exists():
        pytest.skip("the C sources are not beside these tests")
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    undefine = ["__unix__", "__unix", "unix", "__linux__", "__linux", "linux", "__gnu_linux__"]
    cmd = [cc, "-fsyntax-only", *(f"-U{m}" for m in undefine), str(ROOT / "src" / "hwt_sys.c")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if ": error:" in line]
    assert len(errors) == 1, proc.stderr
    assert "hwtimer: unsupported platform" in errors[0]


def test_missing_python_h(tmp_path):
    empty = tmp_path / "include"
    empty.mkdir()
    line = build_ext(
        tmp_path,
        "import distutils.sysconfig\n"
        f"distutils.sysconfig.get_python_inc = lambda *args, **kwargs: {str(empty)!r}\n"
        "sys.exec_prefix = sys.base_exec_prefix  # no venv include directory either\n",
    )
    assert line.startswith(f"error: Python.h not found (searched {empty}")
    assert line.endswith("(Debian: apt-get install python3-dev)")


def test_no_working_compiler(tmp_path):
    line = build_ext(tmp_path, env={"CC": "/bin/false"})
    assert line == (
        "error: a working C compiler not usable with /bin/false:"
        " install gcc (Debian: apt-get install gcc)"
    )


def test_a_compiler_that_refuses_a_flag_is_not_said_to_be_missing(tmp_path):
    # gcc is there and runs, but a flag in CFLAGS is one it does not know:
    # "install gcc" would send the user the wrong way; the line quotes what
    # the compiler said about the flag instead
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc to build with")
    line = build_ext(tmp_path, env={"CC": gcc, "CFLAGS": "-fhwtimer-no-such-flag"})
    assert line.startswith(f"error: a working C compiler not usable with {gcc}, which says "), line
    assert "-fhwtimer-no-such-flag" in line and "CFLAGS" in line, line
    assert "install gcc" not in line, line


def test_missing_pthread_h(tmp_path):
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc to build with")
    # gcc's own headers stay (stdatomic.h), the C library's go (pthread.h)
    own = subprocess.run(
        [gcc, "-print-file-name=include"], capture_output=True, text=True, check=True
    ).stdout.strip()
    line = build_ext(tmp_path, env={"CC": gcc, "CFLAGS": f"-nostdinc -isystem {own}"})
    assert line == (
        f"error: <pthread.h> and -pthread not usable with {gcc}:"
        " install the C library's development files (Debian: apt-get install libc6-dev)"
    )


def test_a_compiler_without_link_time_optimisation_builds_without_it(tmp_path):
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc to build with")
    # a compiler that refuses -flto: the build leaves it out, and goes on
    cc = tmp_path / "cc"
    cc.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case $a in -flto*) echo "cc: no -flto" >&2; exit 1;; esac; done\n'
        f'exec {gcc} "$@"\n'
    )
    cc.chmod(0o755)
    proc = run_build(tmp_path, env={"CC": str(cc)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "-flto" not in proc.stdout + proc.stderr
    built = list((tmp_path / "lib" / "hwtimer").glob("_hwtimer*"))
    assert len(built) == 1
    # it loads, and makes a timer that runs a task
    check = textwrap.dedent(
        f"""
        import importlib.util, threading
        spec = importlib.util.spec_from_file_location("hwtimer._hwtimer", {str(built[0])!r})
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        ran = threading.Event()
        timer = m.HashedWheelTimer(tick_duration=0.001)
        timer.new_timeout(lambda t: ran.set(), 0.001)
        assert ran.wait(30)
        timer.stop()
        """
    )
    ran = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr


def limited_api_include_dirs() -> list[str]:
    """The include directories of every CPython 3.10 or later at hand: this
    one's, and pyenv's, whose headers an abi3 build may be made with."""
    dirs = {sysconfig.get_path("include")}
    pyenv = shutil.which("pyenv")
    if pyenv is not None:
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=60)
        for inc in Path(root.stdout.strip(), "versions").glob("3.*/include/python3.*"):
            if re.fullmatch(r"python3\.(1\d|[2-9]\d)", inc.name):
                dirs.add(str(inc))
    return sorted(d for d in dirs if (Path(d) / "Python.h").is_file())


def test_limited_api_build_returns_singletons_with_a_reference(tmp_path):
    # CPython 3.12.0 to 3.13.0's headers make Py_RETURN_NONE/TRUE/FALSE
    # return no reference, also under Py_LIMITED_API=0x030A0000: an abi3
    # extension built with them took one of None's, True's or False's
    # references at each such return on 3.10 and 3.11, where they are not
    # immortal, and freed True after a few hundred Timeout.cancel() calls.
    if not (ROOT / "src" / "binding.h").exists():
        pytest.skip("the C sources are not beside these tests")
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    probe = tmp_path / "probe.c"
    probe.write_text(
        '#include "binding.h"\n'
        "hwt_probe_none: Py_RETURN_NONE;\n"
        "hwt_probe_true: Py_RETURN_TRUE;\n"
        "hwt_probe_false: Py_RETURN_FALSE;\n"
    )
    for include in limited_api_include_dirs():
        proc = subprocess.run(
            [cc, "-E", "-P", "-DPy_LIMITED_API=0x030A0000", "-I", str(ROOT / "src"), "-I", include]
            + [str(probe)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        lines = [line for line in proc.stdout.splitlines() if line.startswith("hwt_probe_")]
        assert len(lines) == 3, (include, lines)
        for line in lines:
            assert "NewRef" in line or "INCREF" in line.upper(), (include, line)


def test_what_the_readme_build_commands_make_is_ignored_by_git():
    # `python -m build` and `auditwheel repair` (README, "Wheels, the sdist
    # and building from source") leave their output in the checkout: none
    # of it may show in `git status` as files to add.
    git = shutil.which("git")
    if git is None or not (ROOT / ".gitignore").exists():
        pytest.skip("not a git checkout")
    version = hwtimer.__version__
    made = [
        f"dist/hwtimer-{version}.tar.gz",
        f"dist/hwtimer-{version}-cp311-cp311-linux_x86_64.whl",
        f"wheelhouse/hwtimer-{version}-cp311-cp311-manylinux_2_34_x86_64.whl",
        "build/lib.linux-x86_64-cpython-311/hwtimer/__init__.py",
        "hwtimer.egg-info/PKG-INFO",
    ]
    not_ignored = [
        path
        for path in made
        if subprocess.run(
            [git, "check-ignore", "--no-index", "-q", path], cwd=ROOT, check=False
        ).returncode
        != 0
    ]
    assert not_ignored == []
