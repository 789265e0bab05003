#!/usr/bin/env python3
"""Reads include/clmla.h and include/clmla_tuning.h into plain Python data, and writes the binding's
declaration table.

    python3 python/tools/clmla_header.py include/clmla.h include/clmla_tuning.h > python/src/clmla/_decls.py

The package's ctypes binding (clmla/_binding.py) is built from the table in clmla/_decls.py, and
python/tests/test_header.py parses the headers again with parse() and requires the table to be
equal: every function (return type, parameter types in order), every struct (field names, types,
order), every enumerator and every integer #define, of the stable header and of the tuning header
(the binding wraps both). A changed header therefore fails the tests until this script is run
again (and the high-level API checked against the change). The headers are read in the order
given, as one: a later header may use the #defines and enumerators of an earlier one, and the
table holds each header's declarations after the previous header's.

The parser knows the subset of C that the headers use: comments, preprocessor lines, enums (named or
not), structs (with several declarators per line, arrays sized by a macro, function-pointer
fields), opaque struct typedefs, scalar typedefs, function-pointer typedefs and prototypes.
Types are written canonically: "const char*", "clmla_context**", "char[128]",
"void(*)(void*,int,const char*)".
"""

import re
import sys

__all__ = ["parse", "render"]


def _strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _preprocess(text):
    """Drops preprocessor lines and the __cplusplus blocks; returns (code, {define: int})."""
    defines = {}
    out = []
    skip = 0
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#"):
            d = s[1:].strip()
            if skip:
                if d.startswith("if"):
                    skip += 1
                elif d.startswith("endif"):
                    skip -= 1
                continue
            if d.startswith("ifdef __cplusplus"):
                skip = 1
                continue
            m = re.match(r"define\s+(CLMLA_\w+)\s+(-?\d+)\s*$", d)
            if m:
                defines[m.group(1)] = int(m.group(2))
            continue
        if not skip:
            out.append(line)
    return "\n".join(out), defines


def _split_outside(text, sep):
    """The pieces of text between the `sep` characters outside brackets, braces and parentheses, and
    what follows the last one."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    return parts, "".join(cur)


def _statements(code):
    """Top-level statements, split at ';' outside braces and parentheses."""
    parts, rest = _split_outside(code, ";")
    if rest.strip():
        raise ValueError("header: text after the last ';': %r" % rest.strip()[:80])
    return [s for s in (" ".join(p.split()) for p in parts) if s]


def _split_commas(s):
    parts, rest = _split_outside(s, ",")
    return [p.strip() for p in parts] + ([rest.strip()] if rest.strip() else [])


def _canon_base(tokens):
    """'const', 'char' -> 'const char'; 'unsigned' alone stays 'unsigned'."""
    return " ".join(tokens)


def _declarator(decl, defines, param=False):
    """One declaration 'const size_t values[16]' -> (name, canonical type)."""
    decl = decl.strip()
    m = re.match(r"^(.*?)\(\s*\*\s*(\w*)\s*\)\s*\((.*)\)$", decl)
    if m:  # function pointer
        ret = _type_only(m.group(1), defines)
        params = _params(m.group(3), defines)
        return m.group(2), "%s(*)(%s)" % (ret, ",".join(t for _, t in params))
    m = re.match(r"^(.*?)(\w+)\s*((?:\[[^\]]*\]\s*)*)$", decl)
    if not m:
        raise ValueError("header: cannot read declaration %r" % decl)
    head, name, dims = m.group(1), m.group(2), m.group(3)
    stars = head.count("*")
    base = _canon_base(head.replace("*", " ").split())
    if not base:  # a lone type ("void", "clmla_context *") with no name
        return None, _type_only(decl, defines)
    t = base + "*" * stars
    sizes = re.findall(r"\[([^\]]*)\]", dims)
    if sizes:
        if param:  # an array parameter is a pointer
            t += "*" * len(sizes)
        else:
            for size in sizes:
                size = size.strip()
                n = defines[size] if size in defines else int(size)
                t += "[%d]" % n
    return name, t


def _type_only(s, defines):
    stars = s.count("*")
    return _canon_base(s.replace("*", " ").split()) + "*" * stars


def _params(s, defines):
    s = s.strip()
    if s in ("", "void"):
        return []
    out = []
    for p in _split_commas(s):
        name, t = _declarator(p, defines, param=True)
        out.append((name or "", t))
    return out


def _enum_body(body, known):
    values, nxt = {}, 0
    for item in _split_commas(body):
        if "=" in item:
            k, v = (x.strip() for x in item.split("=", 1))
            v = int(v) if re.match(r"^-?\d+$", v) else known[v]
        else:
            k, v = item.strip(), nxt
        values[k] = v
        known[k] = v
        nxt = v + 1
    return values


def parse(*paths):
    """The headers, read in order as one, as {"defines", "enums", "typedefs", "opaque", "structs",
    "functions"}. A name declared by two of them is an error."""
    if not paths:
        raise ValueError("parse: no header given")
    code_parts, defines = [], {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            code, own = _preprocess(_strip_comments(f.read()))
        for name in own:
            if name in defines:
                raise ValueError("%s: #define %s again" % (path, name))
        defines.update(own)
        code_parts.append((path, code))
    enums, typedefs, opaque, structs, functions = {}, {}, [], {}, {}
    known = dict(defines)
    seen = set()
    for path, code in code_parts:
        _parse_code(path, code, defines, known, enums, typedefs, opaque, structs, functions, seen)
    return {"defines": defines, "enums": enums, "typedefs": typedefs, "opaque": opaque, "structs": structs,
            "functions": functions}


def _declared(path, kind, name, seen):
    if (kind, name) in seen:
        raise ValueError("%s: %s %s is declared again" % (path, kind, name))
    seen.add((kind, name))


def _parse_code(path, code, defines, known, enums, typedefs, opaque, structs, functions, seen):
    for st in _statements(code):
        if st.startswith('extern "C"'):
            continue
        m = re.match(r"^(typedef\s+)?enum\s*(\w*)\s*\{(.*)\}\s*(\w*)$", st)
        if m:
            name = m.group(4) or m.group(2) or ""
            enums.setdefault(name, {}).update(_enum_body(m.group(3), known))
            if m.group(4):
                typedefs[m.group(4)] = "enum"
            continue
        m = re.match(r"^typedef\s+struct\s+(\w+)\s*\{(.*)\}\s*(\w+)$", st)
        if m:
            fields = []
            for decl in _statements(m.group(2)):
                fm = re.match(r"^(.*?\(\s*\*\s*\w+\s*\)\s*\(.*\))$", decl)
                if fm:
                    fields.append(_declarator(decl, defines))
                    continue
                # several declarators: "int a, b, c" / "cl_mem q; size_t off" (already split at ';')
                parts = _split_commas(decl)
                first_name, first_t = _declarator(parts[0], defines)
                fields.append((first_name, first_t))
                base = re.match(r"^(.*?)[\s*]*\w+\s*(?:\[[^\]]*\]\s*)*$", parts[0]).group(1).strip()
                for p in parts[1:]:
                    fields.append(_declarator(base + " " + p, defines))
            _declared(path, "struct", m.group(3), seen)
            structs[m.group(3)] = fields
            continue
        m = re.match(r"^typedef\s+struct\s+(\w+)\s+(\w+)$", st)
        if m:
            _declared(path, "type", m.group(2), seen)
            opaque.append(m.group(2))
            continue
        m = re.match(r"^typedef\s+(.*\(\s*\*\s*(\w+)\s*\)\s*\(.*\))$", st)
        if m:
            _, t = _declarator(m.group(1), defines)
            typedefs[m.group(2)] = t
            continue
        m = re.match(r"^typedef\s+(.*?)\s*(\w+)$", st)
        if m:
            typedefs[m.group(2)] = _type_only(m.group(1), defines)
            continue
        m = re.match(r"^(.*?)(\w+)\s*\((.*)\)$", st)
        if m:
            _declared(path, "function", m.group(2), seen)
            functions[m.group(2)] = (_type_only(m.group(1), defines), _params(m.group(3), defines))
            continue
        raise ValueError("%s: cannot read statement %r" % (path, st[:120]))


COMMAND = "python3 python/tools/clmla_header.py include/clmla.h include/clmla_tuning.h > python/src/clmla/_decls.py"


def render(decls, source="include/clmla.h and include/clmla_tuning.h"):
    lines = [
        '"""The declarations of %s, as python/tools/clmla_header.py reads them.' % source,
        "",
        "Generated: do not edit. After a change to a header, run from the repository root",
        "    " + COMMAND,
        "python/tests/test_header.py fails until the table matches the headers again.",
        '"""',
        "",
    ]
    for key in ("defines", "enums", "typedefs", "opaque", "structs", "functions"):
        table = decls[key]
        if isinstance(table, dict):  # one entry a line
            lines.append("%s = {" % key.upper())
            lines.extend("    %r: %r," % item for item in table.items())
            lines.append("}")
        else:
            lines.append("%s = %r" % (key.upper(), table))
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: clmla_header.py PATH/TO/clmla.h [PATH/TO/clmla_tuning.h] > _decls.py")
    sys.stdout.write(render(parse(*sys.argv[1:])))
