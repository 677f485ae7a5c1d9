#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""docs/troubleshooting.md against the messages the code can raise, both ways.

  check_messages.py SOURCE_ROOT

1. Every piece of message text in include/fiar (a run of adjacent string literals, 25 characters or more once white
   space is folded) appears word for word in troubleshooting.md, with `{rank}` (agree()'s placeholder) written
   `<r>`. What is not message text (inline PTX, file names, the parts of info lines and of reasons quoted inside
   other messages) is listed in NOT_MESSAGES below, each with why.
2. Every message troubleshooting.md quotes (bold code spans starting `fiar: ` or `... `) still exists: each of its
   fixed parts (between `<placeholders>` and `...`) of 20 characters or more is, or contains, a piece of the
   code's text.
"""
import os
import re
import sys

# Literal text in include/fiar that is not a message the doc must quote, and why.
NOT_MESSAGES = {
    # Descriptions handed to allocation and agreement helpers: they appear inside messages whose doc entry writes
    # them as <what>.
    "the digests of a mismatch are stored 16 bytes at a time": "static_assert text",
    "the multimem barrier generations": "an allocation's <what>",
    "setting up the nccl workspace's symmetric window": "an agreement step's name, never printed alone",
    # The backend choice's info line (FIAR_LOG_LEVEL=info) and the reasons it gives: log text, shown by fiar-check.
    " (this group has NVLink multicast)": "info line",
    " (one node whose ranks can map each other's memory)": "info line",
    " (it runs on any topology; 'mnnvl' would need NVLink multicast, which this group does not have)": "info line",
    "interconnect overridden by the caller: ": "discovery note's prefix (Discovery notes)",
    "an adopted communicator (register your own windows on it)": "the classic path's reason (info line)",
    "fiar was built against an NCCL older than 2.27 (no symmetric windows in its nccl.h)": "info line's reason",
    "the NCCL loaded at run time is ": "info line's reason",
    " cannot use symmetric windows (its NCCL or FIAR_NCCL_SYMMETRIC)": "info line's reason",
    "NCCL did not register the symmetric window on any rank: ": "info line's reason",
    # Compile-time diagnostics (the compile errors section names them by their identifiers).
    "fiar::detail::ContextModel (exec/context_model.hpp) must declare every member ExecutionContext requires":
        "static_assert text of a private check",
}


def fold(text):
    return re.sub(r"\s+", " ", text).strip()


def literal_runs(path):
    """The runs of adjacent string literals of a C++ file (comments and character literals removed)."""
    src = open(path, encoding="utf-8").read()
    src = re.sub(r"//[^\n]*", "", src)
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    src = re.sub(r"'(?:[^'\\\n]|\\.)'", "''", src)
    runs, current, last_end = [], None, None
    for m in re.finditer(r'"((?:[^"\\\n]|\\.)*)"', src):
        text = m.group(1).replace('\\"', '"').replace("\\\\", "\\").replace("\\n", "\n")
        if current is not None and src[last_end:m.start()].strip() == "":
            current += text
        else:
            if current is not None:
                runs.append(current)
            current = text
        last_end = m.end()
    if current is not None:
        runs.append(current)
    return runs


def is_code(text):
    """Inline PTX, format strings, paths and include names: not message text."""
    return (bool(re.search(r"%\d|\[%|\{%", text)) or re.fullmatch(r"\w+", text) is not None or
            text.startswith(("ld.", "st.", "atom.", "multimem.", "/", "..")))


def covered(part, texts, max_values=5):
    """Whether `part` reads as pieces of the code's text with at most max_values words between them (values
    the code fills in that the doc writes out, e.g. a backend's name), in order."""
    words = part.split(" ")
    corpus = "\x00".join(texts)
    best = {0: 0}  # words consumed -> fewest single-word values used
    for i in range(len(words)):
        if i not in best:
            continue
        for j in range(len(words), i, -1):
            if " ".join(words[i:j]) in corpus:
                best[j] = min(best.get(j, max_values + 1), best[i])
        if best[i] < max_values:
            best[i + 1] = min(best.get(i + 1, max_values + 1), best[i] + 1)
    return best.get(len(words), max_values + 1) <= max_values


def main():
    root = os.path.abspath(sys.argv[1])
    doc = open(os.path.join(root, "docs", "troubleshooting.md"), encoding="utf-8").read()
    doc_folded = fold(doc)
    pieces = []  # (file, folded text)
    for folder, _, names in os.walk(os.path.join(root, "include", "fiar")):
        for name in sorted(names):
            path = os.path.join(folder, name)
            for run in literal_runs(path):
                pieces.append((os.path.relpath(path, root), fold(run)))
    problems = []

    # 1. The code's message text is in the doc.
    quoted = 0
    for path, text in pieces:
        if len(text) < 25 or is_code(text):
            continue
        if text in NOT_MESSAGES or text.strip() in (fold(k) for k in NOT_MESSAGES):
            continue
        quoted += 1
        text = text.replace("{rank}", "<r>")
        if text not in doc_folded and text.replace('"', '\\"') not in doc_folded:  # the doc escapes #error's quotes
            problems.append(f"{path}: message text not in docs/troubleshooting.md: {text!r}")

    texts = {t for _, t in pieces}
    for stale in NOT_MESSAGES:
        if fold(stale) not in texts:
            problems.append(f"NOT_MESSAGES lists text no code has any more: {stale!r}")

    # 2. The doc's messages are still built by the code.
    code_texts = [t for _, t in pieces if len(t) >= 15]
    messages = re.findall(r"\*\*`((?:fiar: |\.\.\. )[^`]+)`\*\*", doc)
    for message in messages:
        for part in re.split(r"<[^>]*>|\.\.\.", fold(message)):
            part = part.strip()
            part = part[len("fiar: "):] if part.startswith("fiar: ") else part  # often a prefix of its own
            if len(part) < 20:
                continue
            if not covered(part, code_texts):
                problems.append(f"docs/troubleshooting.md quotes text no code builds: {part!r} (in {message[:80]!r})")

    for p in problems:
        print("FAIL: " + p)
    if problems:
        print(f"{len(problems)} problem(s): fix the message or its entry in docs/troubleshooting.md (or, for text that "
              "is not a message, NOT_MESSAGES in this script, with the reason)")
        return 1
    print(f"ok: {quoted} pieces of message text in include/fiar are quoted in docs/troubleshooting.md, and its "
          f"{len(messages)} quoted messages are all built by the code")
    return 0


if __name__ == "__main__":
    sys.exit(main())
