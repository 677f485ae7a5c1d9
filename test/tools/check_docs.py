#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The docs' house rules (docs/design.md, "Style"):

  check_docs.py SOURCE_ROOT

- every page stays within its line budget (BUDGETS; a page that needs more says what it drops first);
- every page of docs/ opens with a table of contents (a "## Contents" section before its second heading) whose
  links name headings of the page;
- no page points outside the repository's files (the planning folder, ../shared);
- the README's first screen (its first 60 lines) holds the two commands and a complete fused call.
"""
import os
import re
import sys

# Lines per page. fmt documents 17 k header lines in 1,855 doc lines; fiar's 10.8 k header lines get 5,680, most of
# them the message catalogue (every message, checked by test/tools/check_messages.py) and the design's reasons.
BUDGETS = {
    "README.md": 300,
    "CHANGELOG.md": 260,
    # One line per public header, and the host emulator's asynchronous mode; drops the CudaPlatform accessors' detail first.
    "docs/api.md": 610,
    "docs/backends.md": 780,
    # Grew with the waits' failure word and the asynchronous emulator; drops the Status section's history first.
    "docs/design.md": 1300,
    "docs/epilogues.md": 150,
    "docs/formats.md": 200,
    # Grows with the kernels' tables and the model's sections; drops the figures from before issue 18 first.
    "docs/performance.md": 600,
    # The drop-in section (what differs from flashinfer.comm, and why) grew it; drops the Tests section's detail first.
    "docs/python.md": 215,
    # The message catalogue grows with every message the code can raise (check_messages.py holds it to them); when it
    # needs more, it drops its worked examples (multicast setup, TCP) first.
    "docs/troubleshooting.md": 1980,
}


def anchor(heading):
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def main():
    root = os.path.abspath(sys.argv[1])
    problems = []
    pages = ["README.md", "CHANGELOG.md"] + [
        "docs/" + n for n in sorted(os.listdir(os.path.join(root, "docs"))) if n.endswith(".md")
    ]
    for page in pages:
        text = open(os.path.join(root, page), encoding="utf-8").read()
        lines = text.splitlines()
        budget = BUDGETS.get(page)
        if budget is None:
            problems.append(f"{page}: no line budget (add it to BUDGETS in test/tools/check_docs.py)")
        elif len(lines) > budget:
            problems.append(f"{page}: {len(lines)} lines, over its budget of {budget}: shorten it")
        for n, line in enumerate(lines, 1):
            if re.search(r"\.\./shared|planning folder|/reference/", line):
                problems.append(f"{page}:{n}: points outside the repository: {line.strip()[:80]}")
        if not page.startswith("docs/"):
            continue
        # Headings outside code blocks.
        headings, in_code = [], False
        for line in lines:
            if line.startswith("```"):
                in_code = not in_code
            elif not in_code and re.match(r"#{1,6} ", line):
                headings.append(line)
        if len(headings) < 2 or headings[1] != "## Contents":
            problems.append(f"{page}: does not open with a table of contents ('## Contents' as its second heading)")
            continue
        anchors = {anchor(h.lstrip("#")) for h in headings}
        toc = text.split("## Contents", 1)[1].split("\n## ", 1)[0]
        for target in re.findall(r"\]\(#([^)]+)\)", toc):
            if target not in anchors:
                problems.append(f"{page}: its contents link to #{target}, which is no heading of the page")

    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read().splitlines()[:60]
    first = "\n".join(readme)
    for needed, what in [("meson setup build && meson compile -C build fiar-demo", "the demo command"),
                         ("meson setup build && meson test -C build", "the test command"),
                         ("ws.run<fiar::Pattern::", "a fused call")]:
        if needed not in first:
            problems.append(f"README.md: its first 60 lines lack {what} ({needed!r})")

    for p in problems:
        print("FAIL: " + p)
    if problems:
        return 1
    total = sum(len(open(os.path.join(root, p), encoding="utf-8").read().splitlines()) for p in pages)
    print(f"ok: {len(pages)} pages, {total} lines, each within its budget; every docs/ page opens with its contents; "
          "nothing points outside the repository; the README's first screen has the commands and a fused call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
