"""Builds hwtimer's C extension, hwtimer._hwtimer.

HWTIMER_SANITIZE=address,undefined (or =thread) builds it with those gcc
sanitizers, for scripts/sanitize.sh.  HWTIMER_WERROR=1 turns warnings into
errors, as CI builds it.  HWTIMER_PORTABLE=1 builds the portable POSIX
backend (src/hwt_sys.c) on Linux too, where it is tested; other systems get
it anyway.  HWTIMER_LIMITED_API=1 builds it against the limited API of
CPython 3.10, into one wheel tagged cp310-abi3 that serves 3.10 and every
later CPython.

Before compiling, the build checks what it needs (the platform, Python.h, a
working C compiler, pthread, the kernel headers) and stops with one line
naming what is missing, rather than a page of compiler errors; a compiler
that runs but refuses a flag it is given is quoted in that line instead.
"""

import contextlib
import os
import re
import sys
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError, LinkError, PlatformError, SetupError

sources = [
    "src/hwt.c",
    "src/wheel.c",
    "src/hwt_sys.c",
    "src/common.c",
    "src/module.c",
    "src/dispatch.c",
    "src/timer.c",
    "src/timeout.c",
    "src/looptimeout.c",
    "src/runner.c",
    "src/loopsink.c",
    "src/scope.c",
    "src/manual.c",
    "src/monitor.c",
]

portable = os.environ.get("HWTIMER_PORTABLE", "0") not in ("", "0")
define_macros = [("HWTIMER_PORTABLE", "1")] if portable else []

compile_args = ["-std=gnu11", "-Wall", "-Wextra", "-fvisibility=hidden"]
link_args = ["-pthread"]

if os.environ.get("HWTIMER_WERROR", "0") not in ("", "0"):
    compile_args.append("-Werror")

sanitize = os.environ.get("HWTIMER_SANITIZE", "").strip()
if sanitize:
    flags = [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-g"]
    if "undefined" in sanitize:
        flags.append("-fno-sanitize-recover=undefined")
    compile_args += flags + ["-O1"]
    link_args += flags

# Link-time optimisation, where the compiler can: it inlines the core's
# small calls (the clock, a timer's state, the schedule and the cancel)
# into the binding's, which -fvisibility=hidden leaves to it.  Not with
# the sanitizers, whose builds stay close to the source.
LTO_FLAGS = [] if sanitize else ["-flto=auto"]

# sys.platform prefixes the core cannot be built for: it needs POSIX threads
# (src/hwt_sys.c has a backend for Linux and one for every POSIX system).
REFUSED_PLATFORMS = ("win", "emscripten", "wasi")

# What the C sources need from the system, checked in this order: a name
# for the message, a C program that must compile and link with the build's
# flags, and what provides it.
EMPTY_PROGRAM = "int main(void) { return 0; }\n"
SYSTEM_NEEDS = [
    ("a working C compiler", EMPTY_PROGRAM, "gcc (Debian: apt-get install gcc)"),
    (
        "C11 <stdatomic.h>",
        "#include <stdatomic.h>\nint main(void) { atomic_int i = 0; return atomic_load(&i); }\n",
        "a C11 compiler (gcc >= 4.9)",
    ),
    (
        "<pthread.h> and -pthread",
        "#include <pthread.h>\n"
        "static void *run(void *arg) { return arg; }\n"
        "int main(void) {\n"
        "    pthread_t t;\n"
        "    return pthread_create(&t, 0, run, 0) || pthread_join(t, 0);\n"
        "}\n",
        "the C library's development files (Debian: apt-get install libc6-dev)",
    ),
]
# Linux's backend (futex, eventfd), unless the portable one is asked for.
if sys.platform.startswith("linux") and not portable:
    SYSTEM_NEEDS.append(
        (
            "<linux/futex.h> and <sys/eventfd.h>",
            "#include <linux/futex.h>\n#include <sys/eventfd.h>\n"
            "int main(void) { return FUTEX_WAIT_BITSET + EFD_NONBLOCK == 0; }\n",
            "the Linux kernel headers (Debian: apt-get install linux-libc-dev),"
            " or build the portable backend with HWTIMER_PORTABLE=1",
        )
    )


def check_platform(platform):
    """Raises PlatformError unless the core can be built on `platform`."""
    if platform.startswith(REFUSED_PLATFORMS):
        raise PlatformError(
            f"hwtimer builds on POSIX systems only (Linux, macOS, the BSDs: its core"
            f" needs POSIX threads); this platform is {platform!r}"
        )


def check_implementation(name):
    """Raises PlatformError unless `name` (sys.implementation.name) is
    CPython's: the binding relies on its object layout and its GIL."""
    if name != "cpython":
        raise PlatformError(
            f"hwtimer builds for CPython only (its C binding relies on CPython's object"
            f" layout and GIL); this Python is {name!r}"
        )


def check_limited_api(limited_api, version):
    """Raises SetupError if the stable-ABI build is asked of a CPython older
    than its base, 3.10, whose wheel would be tagged for versions it is not."""
    if limited_api and tuple(version[:2]) < (3, 10):
        raise SetupError(
            f"HWTIMER_LIMITED_API=1 builds against the stable ABI of CPython 3.10,"
            f" which this Python {version[0]}.{version[1]} lacks: build it with CPython"
            f" 3.10 or later, or without HWTIMER_LIMITED_API for a cp{version[0]}{version[1]}"
            f" wheel"
        )


def check_python_h(include_dirs):
    """Raises SetupError unless one of `include_dirs` holds Python.h."""
    if not any(os.path.isfile(os.path.join(d, "Python.h")) for d in include_dirs):
        where = ", ".join(include_dirs) or "no include directory"
        raise SetupError(
            f"Python.h not found (searched {where}): install the development headers"
            f" of this Python {sys.version_info[0]}.{sys.version_info[1]}"
            f" (Debian: apt-get install python3-dev)"
        )


@contextlib.contextmanager
def _quiet(path):
    """Sends this process's stdout and stderr, the compiler's included, to
    the file `path`: a failed probe is reported by its one line, not its
    output."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(path, "w") as out:
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


# A line of a compiler's or linker's diagnostics ("gcc: error: ...",
# "cc1: error: ...", "/usr/bin/ld: cannot find ...", "probe.c:1:1: ..."),
# not the command lines setuptools echoes ("gcc -W... -c probe.c").
DIAGNOSTIC = re.compile(r"^\S+: \S")


def _probe(compiler, program, extra=()):
    """Compiles and links `program` with the build's flags and `extra`:
    returns None if it builds, or else the step that failed, "compile" or
    "link", and the first line of diagnostics printed by it ("" if none)."""
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "probe.c")
        with open(source, "w") as f:
            f.write(program)
        said = os.path.join(tmp, "said.txt")
        cflags, ldflags = compile_args + list(extra), link_args + list(extra)
        step = "compile"
        try:
            with _quiet(said):
                objects = compiler.compile([source], output_dir=tmp, extra_postargs=cflags)
                step = "link"
                compiler.link_executable(objects, "probe", output_dir=tmp, extra_postargs=ldflags)
        except (CompileError, LinkError):
            with open(said, errors="replace") as f:
                lines = [line.strip() for line in f if DIAGNOSTIC.match(line)]
            return step, lines[0] if lines else ""
    return None


def _builds(compiler, program, extra=()):
    """Returns whether `program` compiles and links with the build's flags
    and `extra`."""
    return _probe(compiler, program, extra) is None


def check_system(compiler):
    """Raises SetupError naming the first of SYSTEM_NEEDS that `compiler`
    cannot build.  A compiler that runs but cannot compile even an empty
    program (a flag it refuses, say) is not said to be missing: the line
    quotes what it said."""
    for need, program, remedy in SYSTEM_NEEDS:
        failed = _probe(compiler, program)
        if failed is None:
            continue
        step, said = failed
        cc = (getattr(compiler, "compiler_so", None) or ["the C compiler"])[0]
        if program == EMPTY_PROGRAM and step == "compile" and said:
            raise SetupError(
                f'{need} not usable with {cc}, which says "{said}": check the flags it is'
                f" given (CC, CFLAGS, CPPFLAGS, HWTIMER_SANITIZE)"
            )
        raise SetupError(f"{need} not usable with {cc}: install {remedy}")


class checked_build_ext(build_ext):
    """build_ext that refuses a platform or a system it cannot build on, and
    compiles every time: setuptools would otherwise reuse an extension left
    in build/ by a build with other flags (HWTIMER_PORTABLE, HWTIMER_WERROR,
    HWTIMER_SANITIZE), since it only compares file times."""

    def finalize_options(self):
        super().finalize_options()
        self.force = True

    def run(self):
        check_platform(sys.platform)
        check_implementation(sys.implementation.name)
        check_limited_api(limited_api, sys.version_info)
        check_python_h(self.include_dirs)
        super().run()

    def build_extensions(self):
        check_system(self.compiler)
        if LTO_FLAGS and _builds(self.compiler, EMPTY_PROGRAM, LTO_FLAGS):
            for ext in self.extensions:
                ext.extra_compile_args = ext.extra_compile_args + LTO_FLAGS
                ext.extra_link_args = ext.extra_link_args + LTO_FLAGS
        super().build_extensions()


limited_api = os.environ.get("HWTIMER_LIMITED_API", "0") not in ("", "0")
options = {}
if limited_api:
    define_macros.append(("Py_LIMITED_API", "0x030A0000"))
    # a build directory of its own, or a full-API extension left in build/
    # would be packed into the abi3 wheel beside the abi3 one
    options = {"bdist_wheel": {"py_limited_api": "cp310"}, "build": {"build_base": "build/abi3"}}

if __name__ == "__main__":
    setup(
        options=options,
        ext_modules=[
            Extension(
                "hwtimer._hwtimer",
                sources=sources,
                depends=["src/hwt.h", "src/wheel.h", "src/hwt_sys.h", "src/binding.h"],
                define_macros=define_macros,
                extra_compile_args=compile_args,
                extra_link_args=link_args,
                py_limited_api=limited_api,
            )
        ],
        cmdclass={"build_ext": checked_build_ext},
    )
