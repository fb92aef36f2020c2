#!/usr/bin/env python3
"""gen.py IN.metal OUT.cpp -- turn a .metal file into C++ for the msl_emu CPU emulator.

The output is compiled with clang++-16 -std=c++17 -I tests/metal_emu/include -I <dir of IN>
and linked with the msl_emu runtime; its kernels register themselves by name.

Every change is line-local and the output starts with `#line 1 "IN.metal"`, so compiler
errors, emulator diagnostics and sanitizer reports point at .metal lines. The changes:

  * comments are blanked (newlines kept);
  * a kernel-scope `threadgroup T x[N];` becomes `MSL_TG_STATIC T x[N]; MSL_TG_INIT(x);`:
    storage shared by the threads of one threadgroup, poisoned (NaN) once per threadgroup;
  * `[[threadgroup(n)]]` becomes `[[msl_emu_threadgroup(n)]]` (`threadgroup` is an empty
    macro, which would otherwise leave `[[(n)]]`);
  * `static_cast<float4>(x)` becomes `float4(x)`: between vectors of one size a C++ cast is
    a bitcast, in MSL a value conversion;
  * `template [[host_name("x")]] kernel decltype(f<T>) f<T>;` loses the attribute (C++ forbids
    it on an explicit instantiation) and is registered under "x";
  * the whole file goes into an unnamed namespace, so helpers with one name in two .metal
    files don't clash when both are linked into one program;
  * after it, one entry trampoline and one registration per kernel, with one role tag per
    parameter taken from its [[...]] attribute.

Lint (errors, with file:line): a kernel parameter without a known attribute, a threadgroup
variable with an initialiser or outside a kernel, a C-style cast to a vector type (a bitcast
in the emulator), static_cast to a vector type or a kernel inside an included header,
[[function_constant]] and other unsupported attributes.
"""
from __future__ import annotations

import os
import re
import sys

VEC_TYPES = r"(?:float|half|int|uint|short|ushort|char|uchar|long|ulong|bool)[234]"

# [[attribute]] of a kernel parameter -> role tag in msl_emu/bind.h
BUILTINS = {
    "thread_position_in_grid": "Bi<tpig>",
    "thread_position_in_threadgroup": "Bi<tpitg>",
    "threadgroup_position_in_grid": "Bi<tgpig>",
    "threads_per_threadgroup": "Bi<ntptg>",
    "dispatch_threads_per_threadgroup": "Bi<dtptg>",
    "threadgroups_per_grid": "Bi<ntgpg>",
    "threads_per_grid": "Bi<ntpg>",
    "thread_index_in_threadgroup": "Bi<tiitg>",
    "thread_index_in_simdgroup": "Bi<tiisg>",
    "simdgroup_index_in_threadgroup": "Bi<sgitg>",
    "simdgroups_per_threadgroup": "Bi<nsgptg>",
    "dispatch_simdgroups_per_threadgroup": "Bi<nsgptg>",
    "threads_per_simdgroup": "Bi<tpsg>",
    "thread_execution_width": "Bi<tpsg>",
    "thread_index_in_quadgroup": "Bi<tiiqg>",
    "quadgroup_index_in_threadgroup": "Bi<qgitg>",
    "quadgroups_per_threadgroup": "Bi<nqgptg>",
}

# Names a threadgroup declaration may use and still be sized at file scope (see static_tg_bytes).
KNOWN_TYPE_WORDS = {
    "float", "half", "int", "uint", "short", "ushort", "char", "uchar", "long", "ulong", "bool",
    "unsigned", "signed", "bfloat", "atomic_int", "atomic_uint", "atomic_float", "atomic_bool",
    "metal", "const", "volatile", "sizeof",
}


class GenError(Exception):
    pass


def blank_comments(src: str) -> str:
    """Comments become spaces (newlines kept); string and char literals are left alone."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in src[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            out.append(src[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def line_of(src: str, pos: int) -> int:
    return src.count("\n", 0, pos) + 1


def matching(src: str, i: int, open_c: str, close_c: str) -> int:
    """src[i] == open_c; returns the index just past its matching close_c."""
    depth = 0
    for j in range(i, len(src)):
        if src[j] == open_c:
            depth += 1
        elif src[j] == close_c:
            depth -= 1
            if depth == 0:
                return j + 1
    raise GenError("unbalanced '%s' at line %d" % (open_c, line_of(src, i)))


def split_params(s: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for c in s:
        if c in "([<{":
            depth += 1
        elif c in ")]>}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return [p.strip() for p in parts]


class Kernel:
    def __init__(self, name, params_pos, params, body_start, body_end, line, is_template, max_threads):
        self.name = name
        self.params_pos = params_pos
        self.params = params
        self.body_start = body_start
        self.body_end = body_end
        self.line = line
        self.is_template = is_template
        self.max_threads = max_threads
        self.roles: list[str] = []
        self.tg_decls: list[tuple[str, str, str]] = []  # (type, name, dims)


class Generator:
    def __init__(self, path: str):
        self.path = path
        self.display = path
        self.errors: list[str] = []

    def error(self, line: int, msg: str, path: str | None = None):
        self.errors.append("%s:%d: error: %s" % (path or self.display, line, msg))

    # ------------------------------------------------------------------ parsing
    def find_kernels(self, src: str) -> list[Kernel]:
        kernels = []
        for m in re.finditer(r"\bkernel\s+void\s+([A-Za-z_]\w*)\s*\(", src):
            name = m.group(1)
            p0 = m.end() - 1
            p1 = matching(src, p0, "(", ")")
            j = p1
            # optional trailing attributes, then the body
            while True:
                ws = re.match(r"\s*\[\[.*?\]\]", src[j:], re.S)
                if not ws:
                    break
                j += ws.end()
            ws = re.match(r"\s*", src[j:])
            j += ws.end()
            if j >= len(src) or src[j] != "{":
                # a declaration without a body (prototype); nothing to run
                continue
            b1 = matching(src, j, "{", "}")
            before = src[max(0, m.start() - 600):m.start()]
            is_template = bool(re.search(r"template\s*<[^;{}]*>\s*(?:\[\[[^\]]*\]\]\s*)*$", before))
            mt = re.search(r"\[\[\s*max_total_threads_per_threadgroup\s*\(([^)]*)\)\s*\]\]\s*$", before)
            k = Kernel(name, p0, src[p0 + 1:p1 - 1], j, b1, line_of(src, m.start()), is_template,
                       mt.group(1).strip() if mt else None)
            kernels.append(k)
        return kernels

    def roles_for(self, k: Kernel, src: str):
        base = k.params_pos + 1
        offset = 0
        for p in split_params(k.params):
            pos = src.find(p, base + offset)
            line = line_of(src, pos if pos >= 0 else base)
            offset = (pos - base + len(p)) if pos >= 0 else offset
            attrs = re.findall(r"\[\[\s*([A-Za-z_]\w*)\s*(?:\(([^()\]]*(?:\([^()]*\)[^()\]]*)*)\))?\s*\]\]", p)
            if not attrs:
                self.error(line, "kernel parameter without an attribute ([[buffer(n)]], [[threadgroup(n)]] or a "
                                 "builtin such as [[thread_position_in_grid]]): %r" % " ".join(p.split()))
                continue
            if len(attrs) > 1:
                self.error(line, "kernel parameter with several attributes is not supported: %r" % " ".join(p.split()))
                continue
            attr, arg = attrs[0]
            arg = (arg or "").strip()
            if attr == "buffer":
                k.roles.append("Buf<(%s)>" % arg)
            elif attr == "threadgroup":
                k.roles.append("Tg<(%s)>" % arg)
            elif attr in BUILTINS:
                k.roles.append(BUILTINS[attr])
            elif attr == "function_constant":
                self.error(line, "[[function_constant(n)]] is not supported by the emulator")
            else:
                self.error(line, "unsupported kernel parameter attribute [[%s]]" % attr)

    # ------------------------------------------------------------------ threadgroup variables
    TG_DECL = re.compile(
        r"(?:(?<=[;{}])|^)(?P<ws>[ \t\n]*)(?P<kw>threadgroup)\s+(?P<type>[A-Za-z_][\w:<>, ]*?)\s+"
        r"(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(?:\[[^\]]+\]\s*)*)(?P<end>[;={])", re.M)

    def rewrite_threadgroup_vars(self, src: str, kernels: list[Kernel]) -> str:
        out, last = [], 0
        for m in self.TG_DECL.finditer(src):
            pos = m.start("kw")
            line = line_of(src, pos)
            owner = next((k for k in kernels if k.body_start < pos < k.body_end), None)
            if m.group("end") != ";":
                self.error(line, "threadgroup variable '%s' has an initialiser; MSL forbids that (assign it from one "
                                 "thread, then threadgroup_barrier)" % m.group("name"))
                continue
            if owner is None:
                self.error(line, "threadgroup variable '%s' outside a kernel function; MSL allows them only at "
                                 "kernel scope" % m.group("name"))
                continue
            owner.tg_decls.append((m.group("type").strip(), m.group("name"), re.sub(r"\s+", "", m.group("dims"))))
            out.append(src[last:pos])
            out.append("MSL_TG_STATIC")
            out.append(src[m.end("kw"):m.end()])
            out.append(" MSL_TG_INIT(%s);" % m.group("name"))
            last = m.end()
        out.append(src[last:])
        return "".join(out)

    def file_scope_names(self, src: str, kernels: list[Kernel]) -> set[str]:
        """Names defined outside kernel bodies that a sizeof at the end of the file can see."""
        outside, last = [], 0
        for k in sorted(kernels, key=lambda k: k.body_start):
            outside.append(src[last:k.body_start])
            last = k.body_end
        outside.append(src[last:])
        text = "".join(outside)
        names = set(re.findall(r"^\s*#\s*define\s+([A-Za-z_]\w*)", src, re.M))
        names -= set(re.findall(r"^\s*#\s*undef\s+([A-Za-z_]\w*)", src, re.M))
        names |= set(re.findall(r"\b(?:struct|class|union|enum)\s+([A-Za-z_]\w*)", text))
        names |= set(re.findall(r"\btypedef\b[^;]*?\b([A-Za-z_]\w*)\s*;", text))
        names |= set(re.findall(r"\busing\s+([A-Za-z_]\w*)\s*=", text))
        names |= set(re.findall(r"\b(?:constant|constexpr)\b[^;=(]*?\b([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*=", text))
        return names

    def static_tg_bytes(self, k: Kernel, known: set[str]) -> str:
        """A C++ expression for the kernel's kernel-scope threadgroup bytes, or "0" when the
        declarations use names that aren't visible at file scope (the runtime still counts
        the real bytes at run time and enforces the limit then)."""
        if not k.tg_decls:
            return "0"
        if k.is_template:
            return "0"
        parts = []
        for typ, _name, dims in k.tg_decls:
            words = set(re.findall(r"[A-Za-z_]\w*", typ + " " + dims))
            if not all(w in KNOWN_TYPE_WORDS or w in known or re.fullmatch(VEC_TYPES, w) for w in words):
                return "0"
            parts.append("sizeof(%s%s)" % (typ, dims))
        return " + ".join(parts)

    # ------------------------------------------------------------------ lint of headers
    def lint_headers(self, raw_src: str):
        base = os.path.dirname(os.path.abspath(self.path))
        seen = set()
        todo = [(raw_src, base)]
        while todo:
            text, d = todo.pop()
            for m in re.finditer(r'^\s*#\s*include\s*"([^"]+)"', text, re.M):
                p = os.path.normpath(os.path.join(d, m.group(1)))
                if p in seen or not os.path.isfile(p):
                    continue
                seen.add(p)
                with open(p, encoding="utf-8") as f:
                    h = blank_comments(f.read())
                for hm in re.finditer(r"static_cast\s*<\s*(%s)\s*>" % VEC_TYPES, h):
                    self.error(line_of(h, hm.start()), "static_cast<%s> in a header is a bitcast in the emulator "
                                                       "(gen.py rewrites .metal files only); write %s(x)"
                               % (hm.group(1), hm.group(1)), p)
                for hm in re.finditer(r"\bkernel\s+void\b", h):
                    self.error(line_of(h, hm.start()), "kernel in an included header; keep kernels in .metal files", p)
                todo.append((h, os.path.dirname(p)))

    # ------------------------------------------------------------------ main
    def generate(self, raw: str) -> str:
        src = blank_comments(raw)
        self.lint_headers(src)
        kernels = self.find_kernels(src)
        for k in kernels:
            self.roles_for(k, src)
        for m in re.finditer(r"(?<![\w)\]])\(\s*(%s)\s*\)(?=\s*[\w(.\-+!~])" % VEC_TYPES, src):
            if re.search(r"\b(?:sizeof|alignof|decltype)\s*$", src[max(0, m.start() - 20):m.start()]):
                continue
            self.error(line_of(src, m.start()), "C-style cast to %s: a bitcast in the emulator but a value conversion "
                                                "in MSL; write %s(x) (or as_type<%s>(x) for a bitcast)"
                       % (m.group(1), m.group(1), m.group(1)))
        for m in re.finditer(r"\[\[\s*function_constant\s*\(", src):
            if not any(k.params_pos < m.start() < k.params_pos + len(k.params) + 2 for k in kernels):
                self.error(line_of(src, m.start()), "[[function_constant(n)]] is not supported by the emulator")

        templates = {k.name: k for k in kernels if k.is_template}
        entries = [(k.name, "&" + k.name, k) for k in kernels if not k.is_template]

        def host_name(m):
            host, decl = m.group(1), m.group(2)
            ids = list(re.finditer(r"([A-Za-z_]\w*)\s*(<)", decl))
            if not ids or ids[-1].group(1) not in templates:
                self.error(line_of(src, m.start()), "host_name(\"%s\"): cannot find the template kernel in %r"
                           % (host, " ".join(decl.split())))
                return m.group(0)
            tid = ids[-1]
            targs_end = matching(decl, tid.start(2), "<", ">")
            entries.append((host, "&" + decl[tid.start(1):targs_end], templates[tid.group(1)]))
            # keep every newline of the attribute so that later lines keep their numbers
            attr = m.group(0)[len("template"):m.start(2) - m.start(0)]
            return "template" + "".join(c if c == "\n" else " " for c in attr) + decl + ";"

        src = re.sub(r'template\s*\[\[\s*host_name\s*\(\s*"([^"]+)"\s*\)\s*\]\]\s*(kernel\b[^;]*);', host_name, src)
        # kernel positions moved only within the rewritten instantiations, which hold no bodies
        kernels = self.find_kernels(src)
        by_name = {k.name: k for k in kernels}
        for i, (name, expr, k) in enumerate(entries):
            entries[i] = (name, expr, by_name[k.name])
            by_name[k.name].roles = k.roles
        src = self.rewrite_threadgroup_vars(src, kernels)
        src = re.sub(r"\[\[\s*threadgroup\s*\(", "[[msl_emu_threadgroup(", src)
        src = re.sub(r"static_cast<\s*(%s)\s*>[ \t]*\(" % VEC_TYPES, r"\1(", src)
        if self.errors:
            raise GenError("\n".join(self.errors))

        known = self.file_scope_names(src, kernels)
        nlines = src.count("\n") + 1
        out = []
        out.append("// generated by tests/metal_emu/gen.py from %s -- do not edit\n" % self.display)
        # bind.h (host-side names such as Launch::kernel) before the shim's qualifier macros
        out.append('#define MSL_EMU_KERNEL 1\n#include "msl_emu/bind.h"\n#include "msl_emu/shim.h"\n')
        out.append("namespace {\n")
        out.append('#line 1 "%s"\n' % self.display)
        out.append(src)
        out.append('\n#line %d "%s"\n' % (nlines + 1, self.display))
        out.append("using namespace ::msl_emu::bind;\n")
        for i, (name, expr, k) in enumerate(entries):
            roles = "".join(", %s{}" % r for r in k.roles)
            out.append("void msl_emu_entry_%d(const ::msl_emu::Launch& L) { invoke(%s, L%s); }\n" % (i, expr, roles))
            max_threads = "(uint32_t)(%s)" % k.max_threads if k.max_threads else "::msl_emu::kMaxThreadsPerThreadgroup"
            out.append('const ::msl_emu::KernelReg msl_emu_reg_%d("%s", &msl_emu_entry_%d, "%s", %d, (uint32_t)(%s), %s);\n'
                       % (i, name, i, self.display, k.line, self.static_tg_bytes(k, known), max_threads))
        out.append("}  // namespace\n")
        self.kernel_names = [e[0] for e in entries]
        return "".join(out)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.split("\n")[0], file=sys.stderr)
        return 2
    inp, outp = argv[1], argv[2]
    g = Generator(inp)
    with open(inp, encoding="utf-8") as f:
        raw = f.read()
    try:
        text = g.generate(raw)
    except GenError as e:
        print(str(e), file=sys.stderr)
        return 1
    # Rewrite only on change (an unchanged output keeps its contents, so ccache and the
    # compiler's own dependency checks stay warm), but always touch it: the build system
    # compares its time with the .metal file's.
    old = None
    if os.path.exists(outp):
        with open(outp, encoding="utf-8") as f:
            old = f.read()
    if old != text:
        os.makedirs(os.path.dirname(os.path.abspath(outp)), exist_ok=True)
        with open(outp, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        os.utime(outp, None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
