#!/usr/bin/env python3
"""Generate single_include/distsgd.h from distsgd.h, distsgd_cl.h and distsgd_mpi.h.

The maps distsgd.h, distsgd_cl.h and distsgd_mpi.h include their parts
(distsgd/*.h, distsgd/cl/*.h, distsgd/mpi/*.h); the output is distsgd.h with
every `#include "distsgd/..."` line replaced by that part, under a breadcrumb
comment naming its source, followed by each add-on's map the same way (its
`#include "distsgd.h"` line removed): distsgd_cl.h inside
`#ifdef DISTSGD_WITH_OPENCL`, distsgd_mpi.h inside `#ifdef DISTSGD_WITH_MPI`,
so a user of the core alone needs no OpenCL or MPI headers. The output is
deterministic: no timestamps, no paths, LF line endings.

Usage: python3 tools/amalgamate.py [--out PATH]   (run from anywhere)
"""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BANNER = ("/* GENERATED from distsgd.h, distsgd_cl.h and distsgd_mpi.h: "
          "do not edit; run make amalgamate */\n")

USAGE_NOTE = """\
/* Single-header distsgd. Use it like distsgd.h: define DISTSGD_IMPLEMENTATION
   in exactly one file before the include. The OpenCL backend (distsgd_cl.h) is
   compiled only when DISTSGD_WITH_OPENCL is defined before the include; then
   also define DISTSGD_CL_IMPLEMENTATION in the implementation file as usual,
   and build with `pkg-config --cflags --libs OpenCL clblast`. The MPI
   transport (distsgd_mpi.h) is compiled only when DISTSGD_WITH_MPI is
   defined before the include; then also define DISTSGD_MPI_IMPLEMENTATION
   in the implementation file, and build with mpicc. */
"""

INCLUDE_CORE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"distsgd\.h"[ \t]*(/\*.*\*/)?[ \t]*$')
INCLUDE_PART = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"(distsgd/[A-Za-z0-9_/]+\.h)"[ \t]*(/\*.*\*/)?[ \t]*$')


def read(name):
    path = os.path.join(ROOT, name)
    with open(path, "r", encoding="utf-8", newline="") as f:
        text = f.read()
    text = text.replace("\r\n", "\n")
    if not text.endswith("\n"):
        text += "\n"
    return text


def strip_core_include(text, name):
    out, removed = [], 0
    for line in text.split("\n"):
        if INCLUDE_CORE.match(line):
            removed += 1
            continue
        out.append(line)
    if removed != 1:
        sys.exit('amalgamate.py: expected exactly one #include "distsgd.h" line in '
                 '%s, found %d' % (name, removed))
    return "\n".join(out)


def inline_parts(text, seen):
    """Replaces each part include of a map by the part, once, with a
    breadcrumb naming its source file."""
    out = []
    for line in text.split("\n"):
        m = INCLUDE_PART.match(line)
        if not m:
            out.append(line)
            continue
        name = m.group(1)
        if name in seen:
            sys.exit("amalgamate.py: %s included twice" % name)
        seen.add(name)
        part = read(name)
        if any(INCLUDE_PART.match(l) for l in part.split("\n")):
            sys.exit("amalgamate.py: part %s includes another part; only the maps include parts" % name)
        out.append("/* ---------------------------------------- %s */" % name)
        out.append(part.rstrip("\n"))
    return "\n".join(out)


def build():
    seen = set()
    core = inline_parts(read("distsgd.h"), seen)
    cl = inline_parts(strip_core_include(read("distsgd_cl.h"), "distsgd_cl.h"), seen)
    mpi = inline_parts(strip_core_include(read("distsgd_mpi.h"), "distsgd_mpi.h"), seen)
    parts = [
        BANNER,
        USAGE_NOTE,
        "\n/* ======== distsgd.h ======== */\n",
        core,
        "\n/* ======== distsgd_cl.h (only with DISTSGD_WITH_OPENCL) ======== */\n",
        "#ifdef DISTSGD_WITH_OPENCL\n",
        cl,
        "#endif /* DISTSGD_WITH_OPENCL */\n",
        "\n/* ======== distsgd_mpi.h (only with DISTSGD_WITH_MPI) ======== */\n",
        "#ifdef DISTSGD_WITH_MPI\n",
        mpi,
        "#endif /* DISTSGD_WITH_MPI */\n",
    ]
    return "".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "single_include", "distsgd.h"),
                    help="output path (default: single_include/distsgd.h)")
    args = ap.parse_args()
    text = build()
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
