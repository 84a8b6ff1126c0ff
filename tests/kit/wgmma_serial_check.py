#!/usr/bin/env python3
"""wgmma_serial_check.py: compile the build's wgmma kernels again with `-Xptxas -v` and fail if
ptxas serialized any wgmma.mma_async (its C751x / C752x "Potential Performance Loss" notes).

ptxas does that silently: without -v the build succeeds, and the kernel runs every wgmma one at a
time. On the H100 (2026-11-27) a branch between a stage's wgmma instructions in the Hopper
prefill kernel did it and every shape ran 25% slower; a pure refactor of a tile's shape
arithmetic tipped the same kernel into C7511 (registers too few for the wgmma pipeline). This
test catches both kinds where the build happens, no GPU needed.

    wgmma_serial_check.py BUILD_DIR SOURCE...   (SOURCE: a .cu path relative to the source root)

Each SOURCE's compile command comes from BUILD_DIR/compile_commands.json, and runs twice: as the
build has it, and without -g / -lineinfo / -G (a release build's code: the register allocation,
and with it C7511, differ between the two). The objects go to temporary files, so the build's own
outputs are untouched.
"""
import json
import os
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

SERIALIZED = "wgmma.mma_async instructions are serialized"


def command_for(build_dir, source):
    with open(os.path.join(build_dir, "compile_commands.json"), encoding="utf-8") as f:
        entries = json.load(f)
    for e in entries:
        if os.path.normpath(e["file"]).endswith(os.path.normpath(source)):
            return e
    return None


def compile_args(entry, debug):
    """The entry's command without its outputs and dependency files (and, debug False, without
    its debug-information flags)."""
    out_args, skip = [], False
    for a in shlex.split(entry["command"]):
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a == "-MD" or (not debug and a in ("-g", "-lineinfo", "-G")):
            continue
        out_args.append(a)
    return out_args


def check(build_dir, job):
    source, debug = job
    what = f"{source} ({'as built' if debug else 'without debug information'})"
    entry = command_for(build_dir, source)
    if entry is None:
        return what, None, f"{source}: not in compile_commands.json"
    with tempfile.TemporaryDirectory() as tmp:
        cmd = compile_args(entry, debug) + ["-Xptxas", "-v", "-o", os.path.join(tmp, "out.o")]
        r = subprocess.run(cmd, cwd=entry["directory"], capture_output=True, text=True)
    text = r.stdout + r.stderr
    if r.returncode != 0:
        return what, None, f"{what}: the compile failed ({r.returncode}):\n{text[-2000:]}"
    hits = [line for line in text.splitlines() if SERIALIZED in line]
    return what, hits, None


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    build_dir, sources = sys.argv[1], sys.argv[2:]
    bad = 0
    jobs = [(s, debug) for s in sources for debug in (True, False)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        for source, hits, error in pool.map(lambda j: check(build_dir, j), jobs):
            if error is not None:
                print(error)
                bad += 1
            elif hits:
                print(f"{source}: ptxas serialized wgmma in {len(hits)} place(s):")
                for line in hits:
                    print("  " + line)
                bad += 1
            else:
                print(f"{source}: no wgmma serialized")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
