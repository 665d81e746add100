"""generated.py : the command line of the generators of committed files
(tools/gen_instances.py, tools/gen_wgmma.py), so that both behave alike:

    python3 tools/gen_X.py           write what differs, remove what is stale
    python3 tools/gen_X.py --check   write nothing; exit 1 naming every file that
                                     differs from what the generator makes from
                                     the tables now, is missing, or should be
                                     removed (test.sh runs it, so CI fails on a
                                     table edited without regenerating)
    python3 tools/gen_X.py --help    the generator's description; nothing else

A generator hands main() a function that returns what it makes, in memory:
({path: text} of every file, [paths that exist but must not]).
"""
import argparse
import difflib
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DIFF_LINES = 20  # of each stale file's diff shown by --check


def main(doc, generate):
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 naming each generated file that is not current")
    args = ap.parse_args()
    files, stale = generate()
    if args.check:
        sys.exit(check(files, stale))
    for path, text in files.items():
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    for path in stale:
        path.unlink()
        print(f"removed {path.relative_to(ROOT)}")


def check(files, stale):
    """0 when every file is as generated and none is stale; else 1, each named."""
    me = pathlib.Path(sys.argv[0]).resolve().relative_to(ROOT)
    bad = 0
    for path, text in files.items():
        name = path.relative_to(ROOT)
        old = path.read_text() if path.exists() else None
        if old == text:
            continue
        bad = 1
        if old is None:
            print(f"{name}: missing")
            continue
        print(f"{name}: differs from what {me} makes now:")
        diff = list(difflib.unified_diff(old.splitlines(), text.splitlines(), f"{name} (committed)",
                                         f"{name} (generated)", lineterm=""))
        print("\n".join(diff[:DIFF_LINES] + (["..."] if len(diff) > DIFF_LINES else [])))
    for path in stale:
        print(f"{path.relative_to(ROOT)}: stale, {me} no longer makes it")
        bad = 1
    print(f"regenerate: python3 {me}" if bad else f"{me}: the generated files are current ({len(files)})")
    return bad
