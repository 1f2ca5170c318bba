#!/usr/bin/env python3
"""check_parts.py - every part compiles with only the parts above it.

Usage: python3 tools/check_parts.py [CC [CXX]]   (run from anywhere; default cc, c++)
       python3 tools/check_parts.py --sizes    (the sizes alone: no compiler)

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
later parts call.

A part's private structs are its own. An opaque handle (a struct that the
declarations name, `typedef struct dsgd_x dsgd_x;`, and only the
implementation defines) belongs to the part that defines its body: only
that part, and the part's own parts (the files beside it whose name extends
its name: strategy_sync.h is a part of strategy.h, ps_server.h of ps.h),
may use its fields; any other part, a sibling too, calls accessors. The
check reads clang's text AST of the whole library (every group above in one
translation unit, with the implementation macros; and once without them,
which tells the opaque structs) and reports, file:line, each MemberExpr
(`p->field`, `s.field`) on such a struct's field that is spelled outside
those parts (a use in a macro's body counts where the macro is written).
Structs named with a double underscore (dsgd__*) are internal helpers that
parts share, and structs whose body the declarations show are public:
neither is checked; nor is code the default configuration leaves out (an
#ifdef). clang is $CLANG, default clang; without it this check is skipped,
with a note.

A part is read in one sitting: no part (a file the maps include, the
add-ons' parts too, whether or not their libraries are found) is over
MAX_PART_LINES lines, and no function in one is over MAX_FUNC_LINES, counted
from the first line of its definition to its closing brace (found by brace
depth, with comments, strings and character literals blanked out).

Prints one line a part, one line the private-field check (or one a use it
found), one line the sizes (or one a part or function over its limit), and
exits 1 if anything failed.
"""
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = re.compile(r'^#include "(distsgd/[A-Za-z0-9_/]+\.h)"')
WARN = ["-Wall", "-Wextra", "-Wpedantic", "-Werror", "-Wno-unused-function", "-fsyntax-only"]


MAX_PART_LINES = 1500
MAX_FUNC_LINES = 100


def blank_comments(src):
    """src with its comments, strings and character literals as spaces
    (newlines kept, so that line numbers stay)."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
        elif src[i] in "\"'":
            j = i + 1
            while j < n and src[j] != src[i] and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            out.append(src[i])
            i += 1
            continue
        out.append("".join(c if c == "\n" else " " for c in src[i:j]))
        i = j
    return "".join(out)


HEADER = re.compile(r"^[A-Za-z_].*\(")
PREPROC = re.compile(r"^\s*#")


def long_functions(path, limit):
    """(first line, length, name) of each function definition in path over
    limit lines: a definition starts at a line at column 0 that opens a
    parameter list and ends at the brace that closes the body it opens."""
    with open(path, encoding="utf-8") as f:
        lines = blank_comments(f.read()).split("\n")
    found, depth, header, start = [], 0, None, None
    for no, line in enumerate(lines, 1):
        if PREPROC.match(line):
            continue
        if depth == 0 and HEADER.match(line):
            header = no
        for k, c in enumerate(line):
            if c == "{":
                if depth == 0 and header is not None and line[:k].rstrip().endswith(")"):
                    start = header
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0 and start is not None:
                    if no - start + 1 > limit:
                        name = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", lines[start - 1])
                        found.append((start, no - start + 1, name.group(1) if name else "?"))
                    start = header = None
        if depth == 0 and line.rstrip().endswith(";"):
            header = None
    return found


def size_problems(parts):
    """Lines, one per part or function over its limit."""
    bad = []
    for part in parts:
        path = os.path.join(ROOT, part)
        with open(path, encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > MAX_PART_LINES:
            bad.append("%s: %d lines (at most %d: split it along a seam)" % (part, n, MAX_PART_LINES))
        for start, length, name in long_functions(path, MAX_FUNC_LINES):
            bad.append("%s:%d: %s is %d lines (at most %d)" % (part, start, name, length, MAX_FUNC_LINES))
    return bad


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


# clang's text AST dump (-Xclang -ast-dump): a node's line is its tree prefix,
# its kind and address, for a declaration maybe "parent"/"prev" addresses, then
# its source range in <...> and, for a declaration, its location. A location
# leaves out the file, and the line, that the previous one printed shares
# (col:C, line:L:C, FILE:L:C), so the file is followed line by line; a
# location in a macro is where it is spelled.
AST_NODE = re.compile(r"([ |`-]*)([A-Za-z]\w*) (0x[0-9a-f]+)(?: (?:parent|prev) 0x[0-9a-f]+)*")
AST_LOC = re.compile(r"<invalid sloc>|col:\d+|line:(\d+):\d+|(<[^<>]*>|[^<>,\s]+):(\d+):\d+")
AST_RECORD = re.compile(r" struct (\w+)( definition)?$")
AST_MEMBER = re.compile(r" (->|\.)(\w*) (0x[0-9a-f]+)")


def ast_nodes(dump):
    """(depth, kind, address, file, line, rest of the line) of each node of a
    text AST dump: file and line are where the node's last location (its
    range's end, or a declaration's location) is spelled ("", 0: none)."""
    cur = ["", 0]  # the file and line the dump left out

    def loc_at(text, i):
        """The location at text[i:]: (end, (file, line) or None), or None."""
        loc = AST_LOC.match(text, i)
        if loc is None:
            return None
        if loc.group(2) is not None:
            cur[0], cur[1] = loc.group(2), int(loc.group(3))
        elif loc.group(1) is not None:
            cur[1] = int(loc.group(1))
        return loc.end(), None if loc.group(0) == "<invalid sloc>" else (cur[0], cur[1])

    for text in dump.splitlines():
        m = AST_NODE.match(text)
        if not m:
            continue
        kind, i, at = m.group(2), m.end(), ("", 0)
        if text.startswith(" <", i):
            got = loc_at(text, i + 2)
            while got is not None:
                i, at = got[0], got[1] or at
                got = loc_at(text, i + 2) if text.startswith(", ", i) else None
            i += 1  # the range's ">"
            if kind.endswith("Decl") and text.startswith(" ", i):
                got = loc_at(text, i + 1)
                if got is not None:
                    i, at = got[0], got[1] or at
        yield len(m.group(1)), kind, m.group(3), at[0], at[1], text[i:]


def ast_dump(clang, text, extra, tmp, name):
    src = os.path.join(tmp, name)
    with open(src, "w") as f:
        f.write(text)
    r = subprocess.run([clang, "-std=c99", "-x", "c", "-fsyntax-only", "-w", "-fno-color-diagnostics",
                        "-Xclang", "-ast-dump", "-I", ROOT] + extra + [src], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None, r.stderr


def may_use(where, owner):
    """Whether the part at where may use the fields of owner's private
    structs: owner itself, or one of owner's own parts (a file beside it whose
    name extends owner's: distsgd/strategy_sync.h of distsgd/strategy.h)."""
    stem = owner[:-2] if owner.endswith(".h") else owner
    return where == owner or (os.path.dirname(where) == os.path.dirname(owner) and where.startswith(stem + "_"))


def private_uses(clang, defines, parts, extra, tmp):
    """Every use of a field of a part's private struct outside that part, as
    (file, line, struct, field, owner); or an error message."""
    includes = "".join('#include "%s"\n' % p for p in parts)
    decls, err = ast_dump(clang, includes, extra, tmp, "ast_decls.c")
    if decls is None:
        return "clang cannot compile the declarations:\n" + "\n".join(err.splitlines()[:12])
    declared, defined = set(), set()
    for line in decls.splitlines():
        if "RecordDecl 0x" in line:
            m = AST_RECORD.search(line)
            if m:
                (defined if m.group(2) else declared).add(m.group(1))
    opaque = set(n for n in declared - defined if "__" not in n)
    full, err = ast_dump(clang, defines + includes, extra, tmp, "ast_impl.c")
    if full is None:
        return "clang cannot compile the implementation:\n" + "\n".join(err.splitlines()[:12])
    fields = {}   # a private field's address: (struct, owner)
    inside = None  # (depth, struct, owner) while in a private struct's body
    uses = set()
    for depth, kind, addr, path, line, rest in ast_nodes(full):
        if inside is not None and depth <= inside[0]:
            inside = None
        if kind == "RecordDecl" and inside is None:
            m = AST_RECORD.search(rest)
            if m and m.group(2) and m.group(1) in opaque:
                owner = os.path.relpath(path, ROOT) if path else "?"
                if owner not in parts:  # the dump was misread
                    return "struct %s's body is in %s, not in a part" % (m.group(1), owner)
                inside = (depth, m.group(1), owner)
        elif kind == "FieldDecl" and inside is not None:
            fields[addr] = inside[1:]
        elif kind == "MemberExpr":
            m = AST_MEMBER.search(rest)
            if m and m.group(3) in fields:
                struct, owner = fields[m.group(3)]
                where = os.path.relpath(path, ROOT) if path else "?"
                if not may_use(where, owner):
                    uses.add((where, line, struct, m.group(1) + m.group(2), owner))
    if not fields:  # a check that finds no private struct checks nothing
        return "no private struct found in clang's AST (%d declared without a body)" % len(opaque)
    return sorted(uses)


def check_sizes():
    """Prints the size problems (or one ok line); returns their number."""
    every = [p for m in ("distsgd.h", "distsgd_cl.h", "distsgd_mpi.h") if os.path.exists(os.path.join(ROOT, m))
             for p in parts_of(m)]
    sizes = size_problems(every)
    for line in sizes:
        print("FAIL  " + line)
    if not sizes:
        print("ok    %d parts of at most %d lines, functions of at most %d" % (len(every), MAX_PART_LINES,
                                                                          MAX_FUNC_LINES))
    else:
        print("check_parts: %d part(s) or function(s) over their size" % len(sizes))
    return len(sizes)


def main():
    if sys.argv[1:] == ["--sizes"]:
        return 1 if check_sizes() else 0
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
    clang = os.environ.get("CLANG", "clang")
    if shutil.which(clang) is None:
        clang = None
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
        # the compilers run in parallel (the threads only wait on them); clang's
        # AST of every group at once (an add-on's parts with the core), first
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            private = None
            if clang is not None:
                every = [p for _, parts, _ in groups for p in parts]
                impl = "#define DISTSGD_IMPLEMENTATION\n" + "".join(d for d, _, _ in groups)
                extra = [f for _, _, flags in groups for f in flags]
                private = pool.submit(private_uses, clang, impl, every, extra, tmp)
            results = list(pool.map(compile_one, range(len(jobs))))
            uses = private.result() if private is not None else None
        for (part, n, _, _), bad in zip(jobs, results):
            if not bad:
                print("ok    %s with only the %d parts above it (C99, C++11)" % (part, n))
            for lang, err in bad:
                print("FAIL  %s with only the parts above it (%s):" % (part, lang))
                print("\n".join(err.splitlines()[:12]))
            failed += 1 if bad else 0
    bad_uses = 0
    if uses is None:
        print("skip  private fields (no %s found; tools/deps.sh test installs clang)" % os.environ.get("CLANG", "clang"))
    elif isinstance(uses, str):
        print("FAIL  private fields: " + uses)
        bad_uses = 1
    elif not uses:
        print("ok    no part uses a field of another part's private struct (clang's AST)")
    else:
        for where, line, struct, field, owner in uses:
            print("FAIL  %s:%d: %s of struct %s, private to %s (use an accessor)" % (where, line, field, struct, owner))
        bad_uses = len(uses)
    sizes = check_sizes()
    if failed:
        print("check_parts: %d part(s) use something from a part below them" % failed)
    if bad_uses:
        print("check_parts: %d use(s) of another part's private struct fields" % bad_uses)
    return 1 if failed or bad_uses or sizes else 0


if __name__ == "__main__":
    sys.exit(main())
