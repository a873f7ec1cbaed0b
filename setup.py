"""Builds hwtimer's C extension, hwtimer._hwtimer.

HWTIMER_SANITIZE=address,undefined (or =thread) builds it with those gcc
sanitizers, for scripts/sanitize.sh.  HWTIMER_WERROR=1 turns warnings into
errors, as CI builds it.
"""

import os

from setuptools import Extension, setup

sources = [
    "src/hwt.c",
    "src/module.c",
    "src/timer.c",
    "src/timeout.c",
    "src/loopsink.c",
    "src/scope.c",
]

compile_args = ["-std=gnu11", "-Wall", "-Wextra", "-fvisibility=hidden"]
link_args = ["-pthread"]

if os.environ.get("HWTIMER_WERROR"):
    compile_args.append("-Werror")

sanitize = os.environ.get("HWTIMER_SANITIZE", "").strip()
if sanitize:
    flags = [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-g"]
    if "undefined" in sanitize:
        flags.append("-fno-sanitize-recover=undefined")
    compile_args += flags + ["-O1"]
    link_args += flags

setup(
    ext_modules=[
        Extension(
            "hwtimer._hwtimer",
            sources=sources,
            depends=["src/hwt.h", "src/binding.h"],
            extra_compile_args=compile_args,
            extra_link_args=link_args,
        )
    ],
)
