#!/usr/bin/env python3
"""check_docs.py - every public function of the headers is documented.

Usage: python3 tools/check_docs.py [HEADER ...]
       (default: distsgd.h, distsgd_cl.h and their parts, distsgd/**/*.h)

For every DSGD_API declaration (a DSGD_API statement that ends in ';'; the
definitions, which end in '{', are skipped):
  1. a comment block must end on the line right above it, unless it follows
     the previous DSGD_API declaration with no line in between: then it is in
     that declaration's group, and the group's comment (the one above the
     group's first declaration) is its comment;
  2. that comment must say "Thread safety";
  3. when the function returns dsgd_result, that comment must say "Errors:"
     (or "Errors (a remark):").
Each violation is printed as FILE:LINE: NAME: what is missing; the exit status
is 1 when there is any. Python 3 standard library only.
"""
import glob
import re
import sys

ERRORS = re.compile(r"\bErrors(\s*\([^()]*\))?:")


def declarations(lines):
    """Yields (first line index, last line index, statement text) of every
    DSGD_API statement, declaration or definition."""
    i = 0
    while i < len(lines):
        if not lines[i].startswith("DSGD_API"):
            i += 1
            continue
        j, text = i, lines[i]
        # a declaration ends in ';', a definition in '{' (or '}' when its
        # body is on the same line: `DSGD_API int f(void) { return 1; }`)
        while not re.search(r"[;{}]\s*$", lines[j].split("/*")[0]):
            j += 1
            text += "\n" + lines[j]
        yield i, j, text
        i = j + 1


def comment_above(lines, i):
    """The comment block that ends on line i - 1, or None."""
    j = i - 1
    if j < 0 or not lines[j].rstrip().endswith("*/"):
        return None
    while "/*" not in lines[j]:
        j -= 1
    return "\n".join(lines[j:i])


def check(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    problems, count = [], 0
    prev_end, prev_comment = None, None
    for first, last, text in declarations(lines):
        if not text.split("/*")[0].rstrip().endswith(";"):
            continue  # a definition
        count += 1
        name = re.search(r"(\w+)\s*\(", text).group(1)
        comment = comment_above(lines, first)
        if comment is None and prev_end == first - 1:
            comment = prev_comment  # in the previous declaration's group
        where = "%s:%d: %s" % (path, first + 1, name)
        if comment is None:
            problems.append(where + ": no comment above it (or above its group)")
        else:
            if "Thread safety" not in comment:
                problems.append(where + ': its comment says nothing under "Thread safety"')
            if re.match(r"DSGD_API\s+dsgd_result\s", text) and not ERRORS.search(comment):
                problems.append(where + ': returns dsgd_result, but its comment has no "Errors:"')
        prev_end, prev_comment = last, comment
    return count, problems


def main(argv):
    paths = argv[1:] or (["distsgd.h", "distsgd_cl.h"] + sorted(glob.glob("distsgd/*.h")) +
                         sorted(glob.glob("distsgd/cl/*.h")))
    total, problems = 0, []
    for path in paths:
        n, p = check(path)
        total += n
        problems += p
    for p in problems:
        print(p)
    if problems:
        print("check_docs: %d problem(s) in %d DSGD_API declarations" % (len(problems), total))
        return 1
    print("check_docs: %d DSGD_API declarations in %s, all documented" % (total, " ".join(paths)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
