#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The layering of include/fiar (docs/design.md, "Layers"): every header includes only headers of its own folder
or of the folders below it, and every folder is a layer of the table.

  check_layers.py SOURCE_ROOT
"""
import os
import re
import sys

# Bottom up: a folder may include itself and everything before it.
LAYERS = ["core", "runtime", "comm", "exec", "algo", "platform", "backend"]
UMBRELLAS = {"fiar.hpp", "fiar.cuh", "instantiate.cuh"}  # the top level includes any layer


def main() -> int:
    root = os.path.join(os.path.abspath(sys.argv[1]), "include", "fiar")
    problems = []
    for entry in sorted(os.listdir(root)):
        path = os.path.join(root, entry)
        if os.path.isfile(path):
            if entry not in UMBRELLAS:
                problems.append(f"include/fiar/{entry}: a header outside every layer folder")
            continue
        if entry not in LAYERS:
            problems.append(f"include/fiar/{entry}/: not a layer of docs/design.md's table ({', '.join(LAYERS)})")
            continue
        allowed = set(LAYERS[: LAYERS.index(entry) + 1])
        for name in sorted(os.listdir(path)):
            with open(os.path.join(path, name), encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                    if not m:
                        continue
                    target = os.path.normpath(os.path.join(entry, m.group(1)))
                    folder = target.split(os.sep)[0]
                    if folder not in allowed:
                        problems.append(f"include/fiar/{entry}/{name}:{number}: includes {m.group(1)}, which is in "
                                        f"{folder}/, a layer above {entry}/")
    for p in problems:
        print("FAIL: " + p)
    if problems:
        return 1
    print(f"ok: every header of include/fiar includes only its own layer or the layers below ({' < '.join(LAYERS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
