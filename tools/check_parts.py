#!/usr/bin/env python3
"""check_parts.py - every part compiles with only the parts above it.

Usage: python3 tools/check_parts.py [CC [CXX]]   (run from anywhere; default cc, c++)

Reads the parts, in order, from the #include lines of the maps (distsgd.h,
then distsgd_cl.h when pkg-config finds OpenCL and CLBlast, then distsgd_mpi.h
when <mpi.h> is found with the flags of `mpicc --showme:compile` or of
pkg-config's mpi or mpich), and compiles, for
each part P, a translation unit that defines the implementation macros and
includes the parts up to P and no further, as C99 and as C++11. A part that
uses anything from a part below it (a layer calling up) fails to compile
there, and so does a definition that precedes its declaration (C++ would give
it C++ linkage). Warnings are
errors, except unused static functions: a part may hold helpers that only
later parts call. Prints one line a part and exits 1 if any failed.
"""
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = re.compile(r'^#include "(distsgd/[A-Za-z0-9_/]+\.h)"')
WARN = ["-Wall", "-Wextra", "-Wpedantic", "-Werror", "-Wno-unused-function", "-fsyntax-only"]


def parts_of(map_name):
    with open(os.path.join(ROOT, map_name), encoding="utf-8") as f:
        return [m.group(1) for m in (INCLUDE.match(line) for line in f) if m]


def pkg_flags():
    try:
        out = subprocess.run(["pkg-config", "--cflags", "OpenCL", "clblast"], capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.split() if out.returncode == 0 else None


def mpi_flags(cc):
    """MPI's include flags when <mpi.h> compiles with them, else None."""
    candidates = [["mpicc", "--showme:compile"], ["pkg-config", "--cflags", "mpi"],
                  ["pkg-config", "--cflags", "mpich"]]
    for cmd in candidates:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True)
        except OSError:
            continue
        if out.returncode != 0:
            continue
        flags = out.stdout.split()
        probe = subprocess.run([cc, "-E", "-x", "c", "-"] + flags, input="#include <mpi.h>\n",
                               capture_output=True, text=True)
        if probe.returncode == 0:
            return flags
    return None


def main():
    cc = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("CC", "cc")
    cxx = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("CXX", "c++")
    langs = [("C99", [cc, "-std=c99", "-x", "c"]), ("C++11", [cxx, "-std=c++11", "-x", "c++"])]
    groups = [("", parts_of("distsgd.h"), [])]
    cl_flags = pkg_flags()
    if cl_flags is not None and os.path.exists(os.path.join(ROOT, "distsgd_cl.h")):
        groups.append(("#define DISTSGD_CL_IMPLEMENTATION\n", parts_of("distsgd_cl.h"), cl_flags))
    else:
        print("skip  distsgd_cl.h parts (pkg-config finds no OpenCL clblast)")
    flags = mpi_flags(cc)
    if flags is not None and os.path.exists(os.path.join(ROOT, "distsgd_mpi.h")):
        groups.append(("#define DISTSGD_MPI_IMPLEMENTATION\n", parts_of("distsgd_mpi.h"), flags))
    else:
        print("skip  distsgd_mpi.h parts (no <mpi.h> with mpicc's or pkg-config's flags)")
    core = groups[0][1]
    jobs = []  # (part, number above it, source text, extra flags), in order
    for defines, parts, extra in groups:
        # an add-on's parts stand on the whole core, not on another add-on
        above = [] if parts is core else list(core)
        for part in parts:
            above.append(part)
            text = "#define DISTSGD_IMPLEMENTATION\n" + defines + "".join('#include "%s"\n' % p for p in above)
            jobs.append((part, len(above) - 1, text, extra))
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        def compile_one(i):
            part, n, text, extra = jobs[i]
            src = os.path.join(tmp, "part%d.c" % i)
            with open(src, "w") as f:
                f.write(text)
            bad = []
            for lang, cmd in langs:
                r = subprocess.run(cmd + WARN + extra + ["-I", ROOT, src], capture_output=True, text=True)
                if r.returncode != 0:
                    bad.append((lang, r.stderr))
            return bad
        # the compilers run in parallel (the threads only wait on them)
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            results = list(pool.map(compile_one, range(len(jobs))))
        for (part, n, _, _), bad in zip(jobs, results):
            if not bad:
                print("ok    %s with only the %d parts above it (C99, C++11)" % (part, n))
            for lang, err in bad:
                print("FAIL  %s with only the parts above it (%s):" % (part, lang))
                print("\n".join(err.splitlines()[:12]))
            failed += 1 if bad else 0
    if failed:
        print("check_parts: %d part(s) use something from a part below them" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
