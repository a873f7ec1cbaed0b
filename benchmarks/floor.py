"""Builds and imports ``floor.c``, the floors hwtimer's pair and burst are
measured against (see that file for what each does).

It is compiled with the interpreter's own compiler and flags (those that
built hwtimer: ``sysconfig``'s ``CC``, ``CFLAGS``, ``LDSHARED``) into a
directory under the system's temporary directory named after a hash of the
source and the interpreter, so that it is built once and a change to it is
rebuilt.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "floor.c")
NAME = "_hwtfloor"


def build() -> str:
    """Compiles floor.c if needed; returns the path of the extension."""
    with open(SOURCE, "rb") as f:
        key = hashlib.sha256(f.read() + sys.version.encode() + sys.executable.encode())
    out_dir = os.path.join(tempfile.gettempdir(), f"hwtimer-bench-floor-{key.hexdigest()[:16]}")
    ext = os.path.join(out_dir, NAME + sysconfig.get_config_var("EXT_SUFFIX"))
    if os.path.exists(ext):
        return ext
    os.makedirs(out_dir, exist_ok=True)
    var = sysconfig.get_config_var
    obj = os.path.join(out_dir, f"floor.{os.getpid()}.o")  # each build its own
    include = sysconfig.get_paths()["include"]
    cc = shlex.split(var("CC")) + shlex.split(var("CFLAGS")) + shlex.split(var("CCSHARED"))
    compile_cmd = cc + ["-Wall", "-Wextra", f"-I{include}", "-c", SOURCE, "-o", obj]
    tmp = f"{ext}.{os.getpid()}"
    link_cmd = shlex.split(var("LDSHARED")) + [obj, "-o", tmp]
    for cmd in (compile_cmd, link_cmd):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"building the floor extension failed:\n{proc.stderr}")
    os.replace(tmp, ext)  # whole or not at all, should two runs build at once
    os.remove(obj)
    return ext


def buildable() -> bool:
    """Whether the floor extension builds here (a C compiler, the headers)."""
    try:
        build()
    except (RuntimeError, OSError):
        return False
    return True


def load():
    """The floor extension module, built if needed."""
    if NAME in sys.modules:
        return sys.modules[NAME]
    spec = importlib.util.spec_from_file_location(NAME, build())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[NAME] = module
    return module


def load_or_none(who: str):
    """The floor extension, or None where it cannot be built: then a line
    on stderr, naming the benchmark ``who``, says why."""
    try:
        return load()
    except (RuntimeError, OSError) as e:
        print(f"{who}: no floor: {e}", file=sys.stderr)
        return None
