#!/usr/bin/env python3
"""check_docs.py : fail when docs/ names a file or function that no longer exists.

Every backquoted reference in the checked pages (default: every docs/*.md) of
the form

    `path`            a file or folder of the repository, e.g. `src/api.c`
    `path:name`       a name defined or used in the code of that file, e.g.
                      `src/api.c:fc_prepare_attention`

is checked: the path must exist, and `name` must occur as a whole identifier in
the file with its comments and string literals removed (C, C++, CUDA, Python,
shell, CMake), so a name that survives only in a comment is stale too. A
reference is recognised by its path: it starts with one of the top-level
entries of the repository (src/, include/, tools/, ...) or is one of its files.

Pages may mark a prefix as pending, for code another branch is writing:

    <!-- check_docs: pending python/ (issue 6) -->

A reference under a pending prefix whose file does not exist yet is listed as
pending, not failed; once the file exists it is checked like any other. A
section written ahead of the code it describes (a branch not merged yet) is
fenced by

    <!-- check_docs: pending-until src/cuda/sm80/bwd_kernel.cuh -->
    ...
    <!-- check_docs: end -->

and its references are pending while that file does not exist; from the merge
that adds it on, every reference in the section is checked.

    python3 tools/check_docs.py [PAGE.md ...]

Prints what it checked, one line per page, then each stale reference with its
page and line; exits 1 when there is one.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
# top-level names a reference may start with (those that exist, plus python/)
TOP = {"src", "include", "tools", "tests", "bench", "docs", "scripts", "python", ".ci", "cmake",
       "CMakeLists.txt", "README.md", "DEVELOPERS.md", "run.sh", "test.sh"}
REF = re.compile(r"`([A-Za-z0-9_.][A-Za-z0-9_./-]*)(?::([A-Za-z_][A-Za-z0-9_]*))?`")
PENDING = re.compile(r"<!--\s*check_docs:\s*pending\s+(\S+)")
GATE = re.compile(r"<!--\s*check_docs:\s*pending-until\s+(\S+)\s*-->")
GATE_END = re.compile(r"<!--\s*check_docs:\s*end\s*-->")


def code_only(path, text):
    """text without comments and string literals, by the file's language."""
    suffix = path.suffix
    if suffix in (".c", ".h", ".cu", ".cuh", ".cpp"):
        pat = r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\''
    elif suffix == ".py":
        pat = r'#[^\n]*|"""(?:.|\n)*?"""|\'\'\'(?:.|\n)*?\'\'\'|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\''
    elif suffix == ".sh" or path.name == "CMakeLists.txt":
        pat = r'(?m)(^|\s)#[^\n]*'
    else:
        return text  # prose and data: the name must simply appear
    return re.sub(pat, " ", text, flags=re.S)


def check_page(page):
    """(references checked, pending, failures) of one page."""
    text = (ROOT / page).read_text()
    pending = PENDING.findall(text)
    checked, waiting, bad = [], [], []
    gated = False  # inside a pending-until section whose file does not exist yet
    for lineno, line in enumerate(text.splitlines(), 1):
        g = GATE.search(line)
        if g:
            gated = not (ROOT / g.group(1)).exists()
            continue
        if GATE_END.search(line):
            gated = False
            continue
        for m in REF.finditer(line):
            path, name = m.group(1).rstrip("/"), m.group(2)
            if path.split("/")[0] not in TOP:
                continue
            if gated:
                waiting.append(m.group(0))
                continue
            f = ROOT / path
            if not f.exists():
                if any((path + "/").startswith(p.rstrip("/") + "/") for p in pending):
                    waiting.append(m.group(0))
                else:
                    bad.append("%s:%d: %s: no such file" % (page, lineno, m.group(0)))
                continue
            if name:
                if f.is_dir() or not re.search(r"\b%s\b" % re.escape(name),
                                               code_only(f, f.read_text())):
                    bad.append("%s:%d: %s: %s not found in %s" % (page, lineno, m.group(0), name,
                                                                   path))
                    continue
            checked.append(m.group(0))
    return checked, waiting, bad


def main():
    pages = sys.argv[1:] or sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
    failures = []
    for page in pages:
        checked, waiting, bad = check_page(page)
        files = {r.strip("`").split(":")[0] for r in checked}
        names = [r for r in checked if ":" in r]
        print("check_docs: %s: %d references (%d files, %d names) exist%s" %
              (page, len(checked), len(files), len(names),
               ", %d pending (code not merged yet) in %s" %
               (len(waiting), " ".join(sorted({r.strip("`").split(":")[0] for r in waiting})))
               if waiting else ""))
        failures += bad
    for f in failures:
        print("check_docs: STALE " + f)
    if failures:
        print("check_docs: %d stale references" % len(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
