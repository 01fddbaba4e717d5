#!/usr/bin/env python3
"""The module graph of each crate named, and its import circles.

    scripts/module-graph.py [--print] SRC_DIR...

For every module with submodules, an edge A -> B joins two of its children
when code in A (or below it) names B (or something below it) through a
`crate::` or `super::` path; comments and `#[cfg(test)] mod tests` blocks are
left out (a test module may use anything). A child naming its parent, or a
parent its child, is not an edge: only siblings can form a circle. Prints
the circles found (and, with --print, every edge) and exits 1 if there is
one. A reading of the source text, not of the compiler's name resolution: a
path built by a macro or a glob re-export is not followed.
"""
import os
import re
import sys


def modules(root):
    """Module path (tuple) -> file, for every .rs file below root."""
    found = {}
    for directory, _, names in os.walk(root):
        for name in names:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(directory, name)
            parts = os.path.relpath(path, root)[:-3].split(os.sep)
            if parts in (["lib"], ["main"]):
                parts = []
            elif parts[-1] == "mod":
                parts = parts[:-1]
            found[tuple(parts)] = path
    return found


def references(module, source):
    """The module paths `source` (the text of `module`) names."""
    source = re.sub(r"//[^\n]*", "", source)
    cut = source.find("#[cfg(test)]\nmod tests {")
    if cut >= 0:
        source = source[:cut]
    for m in re.finditer(r"\bcrate((?:::\w+)+)", source):
        yield m.group(1).split("::")[1:]
    for m in re.finditer(r"\b((?:super::)+)((?:\w+::)*\w+)", source):
        up = m.group(1).count("super::")
        yield list(module[: max(len(module) - up, 0)]) + m.group(2).split("::")
    for m in re.finditer(r"use (crate|super)::\{([^;]*)\};", source, re.S):
        base = [] if m.group(1) == "crate" else list(module[:-1])
        for item in re.findall(r"[\w:]+", m.group(2)):
            yield base + item.split("::")


def sibling_edges(found):
    edges = {}
    for module, path in found.items():
        if "tests" in module:
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for ref in references(module, text):
            # The longest prefix of the reference that is a module.
            target = next(
                tuple(ref[:k]) for k in range(len(ref), -1, -1) if tuple(ref[:k]) in found
            )
            common = 0
            while common < min(len(module), len(target)) and module[common] == target[common]:
                common += 1
            if common < len(module) and common < len(target):
                a, b = module[: common + 1], target[: common + 1]
                edges.setdefault(a, set()).add(b)
    return edges


def circles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    return found


def main(argv):
    show = "--print" in argv
    roots = [a for a in argv if a != "--print"]
    if not roots:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    failed = False
    for root in roots:
        edges = sibling_edges(modules(root))
        if show:
            print(f"## {root}")
            for a in sorted(edges):
                print("  " + "::".join(a), "->", ", ".join("::".join(b) for b in sorted(edges[a])))
        for component in circles(edges):
            failed = True
            print(f"{root}: import circle: " + " <-> ".join("::".join(m) for m in component))
    if not failed:
        print(f"no import circle in {len(roots)} crates")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
