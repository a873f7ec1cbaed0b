"""The binding's layout: its files depend one way.

src/binding.h lists the binding's files, top first; each may use only the
hwtimer_* names that the files listed under it define.  These tests read
the C sources, the cheapest guard there is against a call that goes up
(and so, sooner or later, a circle).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
VALGRIND_SH = SRC.parent / "scripts" / "valgrind.sh"

# A file-scope definition: a function, a type spec or a variable, not static.
DEFINITION = re.compile(
    r"^(?!static\b|extern\b|typedef\b|#)[A-Za-z_][^;(=]*?\b(hwtimer_\w+)\s*[(=;]"
)
COMMENT_OR_STRING = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"', re.S)


def layers(header: str) -> list[str]:
    """The files binding.h lists, top first."""
    block = header.split("layers (top first):", 1)[1].split("end of layers", 1)[0]
    return re.findall(r"^ \*   (\w+\.c) ", block, re.M)


def binding_sources() -> dict[str, str]:
    """The binding's files (those that include binding.h), by name."""
    return {
        path.name: path.read_text()
        for path in sorted(SRC.glob("*.c"))
        if '#include "binding.h"' in path.read_text()
    }


def definitions(sources: dict[str, str]) -> dict[str, str]:
    """Where each hwtimer_* name is defined: name -> file."""
    where: dict[str, str] = {}
    for name, text in sources.items():
        for line in COMMENT_OR_STRING.sub("", text).splitlines():
            m = DEFINITION.match(line)
            if m:
                assert m.group(1) not in where, f"{m.group(1)} defined twice"
                where[m.group(1)] = name
    return where


def upward_uses(sources: dict[str, str], order: list[str]) -> list[str]:
    """Each use of a name defined in a file above the user, as 'user: name
    (file)'; `order` is top first."""
    rank = {name: i for i, name in enumerate(order)}
    where = definitions(sources)
    found = []
    for name, text in sources.items():
        for used in sorted(set(re.findall(r"\bhwtimer_\w+", COMMENT_OR_STRING.sub("", text)))):
            home = where.get(used)
            if home and home != name and rank[home] <= rank[name]:
                found.append(f"{name}: {used} ({home})")
    return found


def test_binding_h_lists_every_binding_file_once() -> None:
    order = layers((SRC / "binding.h").read_text())
    assert len(order) == len(set(order))
    assert sorted(order) == sorted(binding_sources())


def test_each_file_uses_only_the_files_below_it() -> None:
    order = layers((SRC / "binding.h").read_text())
    assert upward_uses(binding_sources(), order) == []


def test_binding_h_sections_follow_the_layers() -> None:
    header = (SRC / "binding.h").read_text()
    sections = re.findall(r"^/\* (\w+\.c) \*/$", header, re.M)
    order = [name for name in reversed(layers(header)) if name in sections]
    assert sections == order


def test_the_check_finds_an_upward_use_and_a_circle() -> None:
    sources = {
        "top.c": "PyObject *hwtimer_top(void)\n{\n    return hwtimer_bottom();\n}\n",
        "bottom.c": (
            "/* hwtimer_top() in a comment is no use */\n"
            "PyObject *hwtimer_bottom(void)\n{\n    return hwtimer_top();\n}\n"
        ),
    }
    assert upward_uses(sources, ["top.c", "bottom.c"]) == ["bottom.c: hwtimer_top (top.c)"]
    assert upward_uses(sources, ["bottom.c", "top.c"]) == ["top.c: hwtimer_bottom (bottom.c)"]


@pytest.mark.parametrize(
    ("line", "name"),
    [
        ("PyObject *hwtimer_timeout_new(TimerObject *timer,", "hwtimer_timeout_new"),
        ("hwtimer_state *hwtimer_state_of_type(PyTypeObject *tp)", "hwtimer_state_of_type"),
        ("PyType_Spec hwtimer_timer_spec = {", "hwtimer_timer_spec"),
        ("_Thread_local TimerObject *hwtimer_current_task_timer;", "hwtimer_current_task_timer"),
        ("static int hwtimer_private(void)", None),
        ("    return hwtimer_clock_ns(timer);", None),
    ],
)
def test_definitions_are_read_from_file_scope(line, name) -> None:
    assert definitions({"f.c": line + "\n"}) == ({name: "f.c"} if name else {})


def test_module_state_holds_references_only_through_its_list() -> None:
    # module_traverse() and module_clear() expand HWTIMER_STATE_REFS: a
    # reference declared in the struct by hand would be missed by both.
    header = (SRC / "binding.h").read_text()
    struct = header.split("typedef struct {\n#define HWTIMER_STATE_FIELD", 1)[1]
    struct = struct.split("} hwtimer_state;", 1)[0]
    assert not re.findall(r"\bPy\w*Object \*\w+", COMMENT_OR_STRING.sub("", struct))
    module = (SRC / "module.c").read_text()
    for function in ("module_traverse", "module_clear"):
        body = module.split(f"static int {function}(", 1)[1].split("\n}\n", 1)[0]
        assert "HWTIMER_STATE_REFS(" in body, function


def valgrind_verdict(tmp_path: Path, report: str) -> subprocess.CompletedProcess[str]:
    """Runs scripts/valgrind.sh's judge of a memcheck report on `report`,
    with the arguments the script gives it."""
    if not VALGRIND_SH.exists():
        pytest.skip("scripts/valgrind.sh is not beside these tests")
    script = VALGRIND_SH.read_text()
    call, judge = script.split("<<'PY'", 1)
    judge = judge.split("\n", 1)[1].split("\nPY\n", 1)[0]
    args = call.rsplit("\n", 1)[1].split('"$venv/bin/python" - ', 1)[1].split()
    values = {
        '"$log"': str(tmp_path / "memcheck.log"),
        '"${HWTIMER_VG_VERBOSE:-0}"': "0",
        '"$root/src"': str(SRC),
    }
    assert all(arg in values for arg in args), args
    (tmp_path / "memcheck.log").write_text(report)
    return subprocess.run(
        [sys.executable, "-c", judge, *(values[arg] for arg in args)],
        capture_output=True,
        text=True,
        timeout=60,
    )


MEMCHECK_ERROR = """\
==4242== Invalid read of size 8
==4242==    at 0x4F1A2B3: {function} ({file}:{line})
==4242==    by 0x4A3B2C1: _PyObject_MakeTpCall (call.c:214)
==4242==    by 0x4A3B9D0: _PyEval_EvalFrameDefault (ceval.c:4769)
==4242==  Address 0x6d2e0f8 is 8 bytes inside a block of size 64 free'd
==4242==    at 0x48431EF: free (vg_replace_malloc.c:872)
==4242==    by 0x4A0C3B5: dict_dealloc (dictobject.c:2355)
==4242==
"""


@pytest.mark.parametrize("name", sorted(p.name for p in SRC.glob("*.[ch]")))
def test_valgrind_sh_counts_an_error_in_each_source_file_as_hwtimer_s(
    tmp_path: Path, name: str
) -> None:
    # memcheck names a frame's file without its directory: every file of
    # src/, not a list of some, must make an error hwtimer's.
    report = MEMCHECK_ERROR.format(function="hwtimer_something", file=name, line=123)
    proc = valgrind_verdict(tmp_path, report)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 memcheck errors, 1 with a hwtimer frame" in proc.stdout


def test_valgrind_sh_passes_an_error_wholly_inside_cpython(tmp_path: Path) -> None:
    report = MEMCHECK_ERROR.format(function="PyDict_GetItem", file="dictobject.c", line=1811)
    proc = valgrind_verdict(tmp_path, report)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 memcheck errors, 0 with a hwtimer frame" in proc.stdout


SANITIZE_SH = SRC.parent / "scripts" / "sanitize.sh"


def forking_tests() -> dict[str, list[str]]:
    """The tests that fork a process with threads (os.fork(), or a child
    run with FORK_PRELUDE), by file: those TSan cannot follow."""
    import ast

    found: dict[str, list[str]] = {}
    for path in sorted((SRC.parent / "tests").glob("test_*.py")):
        if path.name == "test_core_model.py":  # not in sanitize.sh's run
            continue
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                body = ast.get_source_segment(text, node) or ""
                if "os.fork(" in body or "FORK_PRELUDE" in body:
                    found.setdefault(str(path), []).append(node.name)
    return found


def test_sanitize_sh_thread_run_leaves_out_every_test_that_forks() -> None:
    # Without arguments, sanitize.sh thread runs the suite less the tests
    # that fork a process with threads, whose child TSan cannot follow
    # ("dup thread with used id"): its -k expression must deselect each.
    if not SANITIZE_SH.exists():
        pytest.skip("scripts/sanitize.sh is not beside these tests")
    expression = re.findall(r'set -- "\$@" -k "([^"]+)"', SANITIZE_SH.read_text())
    assert len(expression) == 1, expression
    forking = forking_tests()
    assert forking
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        + ["-k", expression[0], *forking],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=SRC.parent.parent,
    )
    collected = {line.split("::")[-1].split("[")[0] for line in proc.stdout.splitlines()}
    assert "deselected" in proc.stdout, proc.stdout + proc.stderr
    left = sorted(name for names in forking.values() for name in names if name in collected)
    assert left == []


DTLS_LIB = """
_Thread_local void *slot;
void set_slot(void *p) { slot = p; }
"""

# Bursts of detached threads, each writing a thread-local of a dlopen()ed
# library (as hwtimer's dispatch thread does) and ending: glibc frees a
# finished thread's block of it when it trims its cache of stacks, in
# whichever thread makes the next one, ordered by locks that TSan does not
# see.
DTLS_MAIN = """
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
static void (*set_slot)(void *);
static void *body(void *arg) { usleep(1000); set_slot(arg); return NULL; }
int main(int argc, char **argv) {
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib || !(set_slot = (void (*)(void *))dlsym(lib, "set_slot")))
        return 2;
    for (int i = 0; i < 100; i++) {
        for (int j = 0; j < 12; j++) {
            pthread_attr_t attr;
            pthread_t t;
            pthread_attr_init(&attr);
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            if (pthread_create(&t, &attr, body, &i) != 0)
                return 2;
            pthread_attr_destroy(&attr);
        }
        usleep(5000);
    }
    puts("done");
    return 0;
}
"""


def test_tsan_supp_passes_glibc_freeing_an_ended_threads_dynamic_tls(tmp_path: Path) -> None:
    # A thread-local of the extension written by a thread that has ended
    # (the dispatch thread's own dispatcher) is freed later by glibc in
    # another thread; TSan, blind to glibc's own locks, calls that a race
    # with no hwtimer in it.  scripts/tsan.supp must pass it.
    supp = SRC.parent / "scripts" / "tsan.supp"
    if not supp.exists():
        pytest.skip("scripts/tsan.supp is not beside these tests")
    (tmp_path / "lib.c").write_text(DTLS_LIB)
    (tmp_path / "main.c").write_text(DTLS_MAIN)
    lib, exe = tmp_path / "lib.so", tmp_path / "main"
    try:
        for cmd in (
            ["gcc", "-fsanitize=thread", "-fPIC", "-shared", f"{tmp_path}/lib.c", "-o", str(lib)],
            ["gcc", "-fsanitize=thread", f"{tmp_path}/main.c", "-o", str(exe), "-ldl"],
        ):
            if subprocess.run(cmd, capture_output=True, timeout=120).returncode != 0:
                pytest.skip("gcc cannot build with -fsanitize=thread here")
    except OSError:
        pytest.skip("no gcc here")

    def run(options: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": "/usr/bin:/bin", "TSAN_OPTIONS": f"halt_on_error=1:exitcode=86{options}"}
        return subprocess.run(
            [str(exe), str(lib)], capture_output=True, text=True, timeout=120, env=env
        )

    bare = run("")
    if bare.returncode != 86 or "_dl_deallocate_tls" not in bare.stderr:
        pytest.skip("this TSan and glibc do not report it")
    proc = run(f":suppressions={supp}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout == "done\n"
