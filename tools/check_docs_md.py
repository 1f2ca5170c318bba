#!/usr/bin/env python3
"""Check the Markdown documentation: links, anchors, code blocks, wording.

Usage: python3 tools/check_docs_md.py README.md docs/*.md   (run from anywhere)

For each file given:
  - every relative link [text](path) and [text](path#anchor) (images too)
    names an existing file or folder, relative to the .md file; an anchor
    into a .md file (or #anchor alone, into the same file) matches one of
    its headings, slugged as GitHub does (lowercase; spaces to '-'; every
    other character but letters, digits, '-' and '_' dropped; a repeated
    heading gets -1, -2, ...). http(s) and mailto links are not fetched.
  - the text keeps the documentation's rules: no "issue N" references, no
    ../shared paths, no package index's address (the hosts that
    tools/check_refs.sh lists); README.md names no test file (tests/NAME.c,
    test_NAME.c), which the contributors' pages in docs/ may.
  - every fenced block whose language is `c` (```c) is compiled with
      gcc -std=c99 -Wall -Wextra -Wpedantic -Werror -I<repo>/single_include -c
    and, when it has main() and defines DISTSGD_IMPLEMENTATION, linked with
    -lm -lpthread; unless the line right before the fence (or an HTML
    comment line in a run of them right above it) is <!-- fragment -->.
  - a block marked <!-- check: run c++ --> is also built as C++
    (g++ -std=c++20 -Wall -Wextra -Wpedantic -Werror), with only a copy of
    single_include/distsgd.h on the include path, and both programs must
    run and exit 0.
Blocks in other languages (sh, make, text, ...) are not compiled.

Prints one line per check ("ok   ..." or "FAIL ..." with the reason) and
ends with "N passed, N failed"; exits 1 on any failure. The compilations
run in parallel (a thread pool of os.cpu_count() workers). DSGD_DOCS_CC and
DSGD_DOCS_CXX override gcc and g++. Standard library only.
"""
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SINGLE = os.path.join(ROOT, "single_include", "distsgd.h")
CC = os.environ.get("DSGD_DOCS_CC", "gcc")
CXX = os.environ.get("DSGD_DOCS_CXX", "g++")
C_FLAGS = ["-std=c99", "-Wall", "-Wextra", "-Wpedantic", "-Werror"]
CXX_FLAGS = ["-std=c++20", "-Wall", "-Wextra", "-Wpedantic", "-Werror"]
LIBS = ["-lm", "-lpthread"]
RUN_TIMEOUT_S = 120

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([A-Za-z0-9_+#.-]*)\s*$")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
COMMENT_LINE = re.compile(r"^\s*<!--(.*?)-->\s*$")
BANNED = [
    (re.compile(r"\bissues?\s+#?[0-9]+", re.I), "an issue reference"),
    (re.compile(r"\.\./shared"), "a ../shared path"),
    (re.compile(r"pypi\.org|pypi\.python\.org|download\.pytorch\.org", re.I), "a package-index address"),
    (re.compile(r"\btests/[A-Za-z0-9_.-]+\.(?:c|h|sh|py)\b"), "a test file name"),
    (re.compile(r"\btest_[A-Za-z0-9_]+\.c\b"), "a test file name"),
]


def slug(text):
    """GitHub's heading anchor: markup dropped, lowercase, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text
    text = re.sub(r"<[^>]+>", "", text)                      # inline HTML
    out = []
    for ch in text.strip().lower():
        if ch == " ":
            out.append("-")
        elif ch in "-_" or ch.isalnum():
            out.append(ch)
    return "".join(out)


class Doc:
    """A Markdown file split into prose lines, code blocks and headings."""

    def __init__(self, path):
        self.path = path
        with open(path, encoding="utf-8") as f:
            self.lines = f.read().split("\n")
        self.prose = []    # (line number, text) outside fences
        self.blocks = []   # (line number of the fence, language, marks, code)
        self.anchors = set()
        counts = {}
        i = 0
        while i < len(self.lines):
            line = self.lines[i]
            m = FENCE.match(line)
            if m:
                fence, lang = m.group(2), m.group(3).lower()
                marks = set()
                j = i - 1
                while j >= 0 and COMMENT_LINE.match(self.lines[j]):
                    marks.add(COMMENT_LINE.match(self.lines[j]).group(1).strip())
                    j -= 1
                body = []
                k = i + 1
                while k < len(self.lines) and not (self.lines[k].strip().startswith(fence[0] * len(fence))
                                                   and self.lines[k].strip().strip(fence[0]) == ""):
                    body.append(self.lines[k])
                    k += 1
                self.blocks.append((i + 1, lang, marks, "\n".join(body) + "\n"))
                i = k + 1
                continue
            self.prose.append((i + 1, line))
            h = HEADING.match(line)
            if h:
                base = slug(h.group(2))
                n = counts.get(base, 0)
                counts[base] = n + 1
                self.anchors.add(base if n == 0 else "%s-%d" % (base, n))
            i += 1


_docs = {}


def load(path):
    path = os.path.abspath(path)
    if path not in _docs:
        _docs[path] = Doc(path)
    return _docs[path]


def rel(path):
    return os.path.relpath(path, os.getcwd())


def check_links(doc):
    """Yields (ok, description, reason) for every relative link."""
    for lineno, line in doc.prose:
        text = INLINE_CODE.sub("", line)
        for m in LINK.finditer(text):
            target = m.group(1)
            where = "%s:%d link %s" % (rel(doc.path), lineno, target)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            full = doc.path if path == "" else os.path.normpath(os.path.join(os.path.dirname(doc.path), path))
            if not os.path.exists(full):
                yield False, where, "no such file: %s" % rel(full)
                continue
            if anchor and full.endswith(".md"):
                if anchor not in load(full).anchors:
                    yield False, where, "no heading #%s in %s" % (anchor, rel(full))
                    continue
            yield True, where, ""


def check_wording(doc):
    bad = []
    for lineno, line in enumerate(doc.lines, 1):
        for rx, what in BANNED:
            # An HTML comment may name a test file: a marker that a test
            # script looks for (tests/consumers.sh finds the README's program).
            if what == "a test file name" and (COMMENT_LINE.match(line) or
                                               os.path.basename(doc.path) != "README.md"):
                continue
            m = rx.search(line)
            if m:
                bad.append("line %d: %s (%r)" % (lineno, what, m.group(0)))
    return not bad, "%s wording" % rel(doc.path), "; ".join(bad)


def run(cmd, cwd, timeout=300):
    try:
        p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, universal_newlines=True)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired:
        return 124, "timed out after %d s: %s" % (timeout, " ".join(cmd))
    except OSError as e:
        return 127, "%s: %s" % (cmd[0], e)


def tail(text, n=25):
    return "\n".join("      | " + l for l in text.rstrip().split("\n")[-n:])


def check_block(doc, lineno, marks, code):
    """Compiles (and maybe links and runs) one C block; returns (ok, what, reason)."""
    what = "%s:%d c block" % (rel(doc.path), lineno)
    has_main = re.search(r"\bmain\s*\(", code) is not None
    has_impl = re.search(r"^\s*#\s*define\s+DISTSGD_IMPLEMENTATION\b", code, re.M) is not None
    run_cxx = "check: run c++" in marks
    link = has_main and has_impl
    tmp = tempfile.mkdtemp(prefix="distsgd-docs.")
    try:
        src = os.path.join(tmp, "block.c")
        with open(src, "w", encoding="utf-8") as f:
            f.write(code)
        if not run_cxx:
            out = os.path.join(tmp, "block" if link else "block.o")
            cmd = [CC] + C_FLAGS + ["-I" + os.path.join(ROOT, "single_include"), src, "-o", out]
            cmd += LIBS if link else []
            if not link:
                cmd.insert(1, "-c")
            rc, log = run(cmd, tmp)
            if rc != 0:
                return False, what, "%s failed:\n%s" % (CC, tail(log))
            return True, what + (" (compiled, linked)" if link else " (compiled)"), ""
        # Built and run as C and as C++, with only a copy of the single
        # include beside it.
        if not link:
            return False, what, "marked 'check: run c++' but has no main() defining DISTSGD_IMPLEMENTATION"
        shutil.copy(SINGLE, os.path.join(tmp, "distsgd.h"))
        cpp = os.path.join(tmp, "block.cpp")
        shutil.copy(src, cpp)
        for comp, flags, source, exe in ((CC, C_FLAGS, "block.c", "prog_c"), (CXX, CXX_FLAGS, "block.cpp", "prog_cxx")):
            rc, log = run([comp] + flags + ["-I.", source, "-o", exe] + LIBS, tmp)
            if rc != 0:
                return False, what, "%s failed:\n%s" % (comp, tail(log))
            rc, log = run([os.path.join(tmp, exe)], tmp, RUN_TIMEOUT_S)
            if rc != 0:
                return False, what, "%s build exited %d:\n%s" % (comp, rc, tail(log))
        return True, what + " (built and run as C99 and C++20)", ""
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().split("\n")[2], file=sys.stderr)
        return 2
    if not os.path.exists(SINGLE):
        print("FAIL %s is missing (make amalgamate)" % rel(SINGLE))
        return 1
    passed = failed = 0
    results = []
    jobs = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for name in argv[1:]:
            doc = load(name)
            results.extend(check_links(doc))
            results.append(check_wording(doc))
            for lineno, lang, marks, code in doc.blocks:
                if lang != "c":
                    continue
                if "fragment" in marks:
                    continue
                jobs.append(pool.submit(check_block, doc, lineno, marks, code))
        for ok, what, why in results + [job.result() for job in jobs]:
            if ok:
                passed += 1
                print("ok   " + what)
            else:
                failed += 1
                print("FAIL %s: %s" % (what, why))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
