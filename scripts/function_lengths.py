#!/usr/bin/env python3
"""Lists C++ function bodies longer than a limit (issue 12: no function in src/ longer than about 100 lines).

    scripts/function_lengths.py src --max 100     # exit 1 naming file:line:function for each one over the limit
    scripts/function_lengths.py src --top 10      # also print the 10 longest functions
    scripts/function_lengths.py --self-test       # checks the scanner on made-up files (a 101-line function, ...)

A function's length counts from the line of its name to its closing brace, both included. The scanner is a
heuristic, not a C++ parser: comments, string and character literals (raw strings too) and preprocessor lines are
blanked first, then braces are matched. A brace opens a function body when it sits at namespace or class scope
and the text before it ends like a parameter list: `) {`, `) const override {`, `) -> T {`, or a constructor's
`) : a_(x), b_{y} {`. Lambdas and blocks inside a function count as part of it; a lambda at namespace scope
counts as its own function.
"""

import argparse
import os
import re
import sys
import tempfile

EXTENSIONS = (".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hh", ".cu", ".cuh", ".inl")


def blank(text):
    """The text with comments, literals and preprocessor lines replaced by spaces; newlines (so line numbers) stay."""
    out = []
    i, n = 0, len(text)
    line_start = True  # only whitespace so far on this line
    while i < n:
        ch = text[i]
        if ch == "\n":
            out.append(ch)
            line_start = True
            i += 1
            continue
        if line_start and ch == "#":
            # A preprocessor directive, with its continuation lines (its comments go with it).
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                if text.startswith("/*", i):
                    end = text.find("*/", i + 2)
                    end = n if end < 0 else end + 2
                    out.append(re.sub(r"[^\n]", " ", text[i:end]))
                    i = end
                    continue
                out.append(" ")
                i += 1
            continue
        if not ch.isspace():
            line_start = False
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(" " * (end - i))
            i = end
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        raw = re.match(r'(?:u8|u|U|L)?R"([^()\\\s]{0,16})\(', text[i:i + 24])
        if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            close = ")" + raw.group(1) + '"'
            end = text.find(close, i + raw.end())
            end = n if end < 0 else end + len(close)
            out.append('"' + re.sub(r"[^\n]", " ", text[i + 1:end - 1]) + '"')
            i = end
            continue
        if ch == '"' or (ch == "'" and not digit_separator(text, i)):
            j = i + 1
            while j < n and text[j] != ch and text[j] != "\n":
                j += 2 if text[j] == "\\" and j + 1 < n and text[j + 1] != "\n" else 1
            closed = j < n and text[j] == ch
            out.append(ch + " " * (j - i - 1) + (ch if closed else ""))
            i = j + 1 if closed else j
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def digit_separator(text, i):
    """True for the ' in 1'000'000 or 0xFF'FF (C++14), which opens no character literal."""
    return 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum() and re.match(
        r"[0-9]", re.search(r"[\w']*$", text[:i]).group(0) or "x") is not None


QUALIFIER_WORDS = {"const", "volatile", "noexcept", "override", "final", "mutable", "&", "&&"}
CLASS_KEY = re.compile(r"\b(class|struct|union|enum)\b")
NAMESPACE_KEY = re.compile(r'(?:\bnamespace\b[\w:\s]*|\bextern\s*"[^"]*"\s*)$')


def without_template_prefix(h):
    """The header without leading `template <...>` lists (whose `class T` is no class)."""
    while True:
        m = re.match(r"\s*template\s*<", h)
        if not m:
            return h
        depth, k = 1, m.end()
        while k < len(h) and depth:
            depth += {"<": 1, ">": -1}.get(h[k], 0)
            k += 1
        h = h[k:]


def strip_qualifiers(h):
    """The header without trailing `const`, `noexcept(...)`, `override`, `&` and such."""
    while True:
        h = h.rstrip()
        m = re.search(r"(?:\bnoexcept\s*\([^()]*\)|\bthrow\s*\(\s*\)|&&|&|\b\w+)$", h)
        if not m or (m.group(0) not in QUALIFIER_WORDS and not m.group(0).startswith(("noexcept", "throw"))):
            return h
        h = h[:m.start()]


def params_end(header):
    """Index just past the ')' that closes the parameter list, or -1 when the header is no function's."""
    h = header.rstrip()
    plain = without_template_prefix(h)
    offset = len(h) - len(plain)
    # At depth 0: a constructor's initializer list `) : member(x), base{y}` (':' not '::') or a trailing `) -> T`.
    depth = 0
    arrow = -1
    for k, ch in enumerate(plain):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0 and ch == ")" and re.match(r"\s*(?:noexcept\s*)?:(?!:)", plain[k + 1:]) \
                    and not CLASS_KEY.search(plain[:k]):
                # The body's brace follows a whole initializer; after a bare `member` it is that member's `{x}`.
                return offset + k + 1 if plain.endswith((")", "}")) else -1
        elif depth == 0 and plain.startswith("->", k):
            arrow = k
    if arrow >= 0 and strip_qualifiers(h[:offset + arrow]).endswith(")"):
        h = h[:offset + arrow]
    h = strip_qualifiers(h)
    return len(h) if h.endswith(")") else -1


def function_name(header, end):
    """The name before the parameter list that closes at header[end - 1]."""
    depth = 0
    k = end - 1
    while k >= 0:
        if header[k] == ")":
            depth += 1
        elif header[k] == "(":
            depth -= 1
            if depth == 0:
                break
        k -= 1
    before = header[:max(k, 0)].rstrip()
    if before.endswith("]"):
        named = re.search(r"([A-Za-z_]\w*)\s*=\s*\[[^\]]*\]$", before)
        return (named.group(1) + " (lambda)" if named else "<lambda>"), None
    m = re.search(r"((?:[A-Za-z_]\w*\s*(?:<[^<>;{}]*>)?\s*::\s*)*~?\s*(?:operator\s*(?:\(\s*\)|[^\s(]+)|[A-Za-z_]\w*))$",
                  before)
    if not m:
        return "<unnamed>", None
    return re.sub(r"\s+", "", m.group(1)), m.start(1) + len(m.group(1)) - len(m.group(1).lstrip())


def functions(text):
    """(name, first line, last line) of each function body in C++ source text."""
    code = blank(text)
    found = []
    # Scope kinds: "ns" (namespace, extern "C" or the file), "class", "func", "other" (a block or braced init).
    stack = [("ns", None)]
    header_start = 0
    in_function = 0  # braces open inside the current function, its body's included
    for pos, ch in enumerate(code):
        if in_function:
            # Inside a function: only match braces.
            if ch == "{":
                in_function += 1
            elif ch == "}":
                in_function -= 1
                if not in_function:
                    name, start_line = stack.pop()[1]
                    found.append((name, start_line, code.count("\n", 0, pos) + 1))
                    header_start = pos + 1
            continue
        if stack[-1][0] == "other" and ch in "{};":
            # A braced initializer (or a lambda in one) outside functions: match its braces, its ';' end nothing.
            if ch == "{":
                stack.append(("other", None))
            elif ch == "}":
                stack.pop()
            continue
        if ch == ";":
            header_start = pos + 1
        elif ch == "{":
            header = code[header_start:pos]
            end = params_end(header)
            if NAMESPACE_KEY.search(header.rstrip()):
                stack.append(("ns", None))
                header_start = pos + 1
            elif end >= 0:
                name, at = function_name(header, end)
                if at is None:
                    at = len(header) - len(header.lstrip())
                line = code.count("\n", 0, header_start + at) + 1
                stack.append(("func", (name, line)))
                in_function = 1
            elif CLASS_KEY.search(without_template_prefix(header)) and not re.search(r"=\s*$", header):
                stack.append(("class", None))
                header_start = pos + 1
            else:
                stack.append(("other", None))  # a braced initializer: the header goes on
        elif ch == "}":
            if len(stack) > 1:
                top = stack.pop()
                if top[0] != "other":
                    header_start = pos + 1
    return found


def source_files(paths):
    for path in paths:
        if os.path.isfile(path):
            yield path
            continue
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for f in sorted(files):
                if f.endswith(EXTENSIONS):
                    yield os.path.join(root, f)


def scan(paths):
    """(path, line, name, length) for every function in the files under paths."""
    rows = []
    for path in source_files(paths):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for name, first, last in functions(text):
            rows.append((path, first, name, last - first + 1))
    return rows


def check(paths, limit, top=0, out=sys.stdout):
    rows = scan(paths)
    if top:
        print(f"the {min(top, len(rows))} longest of {len(rows)} functions:", file=out)
        for path, line, name, length in sorted(rows, key=lambda r: -r[3])[:top]:
            print(f"  {length:5d}  {path}:{line}:{name}", file=out)
    long = [r for r in rows if r[3] > limit]
    for path, line, name, length in long:
        print(f"{path}:{line}:{name}: {length} lines, more than {limit}", file=out)
    if long:
        print(f"{len(long)} function(s) longer than {limit} lines: split them into functions with names that say "
              f"what they do", file=out)
    elif not rows:
        print(f"no C++ functions found under {' '.join(paths)}", file=out)
        return 1
    else:
        print(f"{len(rows)} functions, none longer than {limit} lines", file=out)
    return 1 if long else 0


def body(lines):
    return "".join(f"  x += {i};\n" for i in range(lines))


SELF_TEST_FILE = (
    '#include <string>\n'                                                    # 1
    '#define BRACE {\n'                                                      # 2
    'namespace demo {\n'                                                     # 3
    '// a comment with a brace {\n'                                          # 4
    'int too_long(int x) {\n'                                                # 5: 101 lines, 5..105
    + body(99) +
    '}\n'                                                                    # 105
    'int just_fits(int x) {\n'                                               # 106: 100 lines, 106..205
    '  const char* s = "}}} {";  /* } */\n'
    "  char c = '}';\n"
    '  auto raw = R"x(})x";\n'
    '  auto f = [&](int y) { return y + 1; };\n'
    + body(94) +
    '}\n'                                                                    # 205
    'struct Holder : Base {\n'                                               # 206
    '  Holder(int v) : v_{v}, w_(v) {\n'                                     # 207: 101 lines, 207..307
    + body(99) +
    '  }\n'                                                                  # 307
    '  int get() const noexcept { return v_; }\n'                            # 308
    '  int v_{0}, w_ = 1\'000;\n'                                             # 309
    '};\n'                                                                   # 310
    'auto trailing(int x) -> int {\n'                                        # 311: 102 lines, 311..412
    + body(100) +
    '}\n'                                                                    # 412
    '}  // namespace demo\n'
)


def self_test():
    """The scanner finds exactly the functions over 100 lines in a made-up file, with their lines and names."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fake.cpp")
        with open(path, "w") as f:
            f.write(SELF_TEST_FILE)
        got = {(line, name, length) for _, line, name, length in scan([tmp])}
        want_all = {(5, "too_long", 101), (106, "just_fits", 100), (207, "Holder", 101), (308, "get", 1),
                    (311, "trailing", 102)}
        failures = []
        if got != want_all:
            failures.append(f"functions found {sorted(got)}, expected {sorted(want_all)}")
        class Sink:
            text = ""
            def write(self, s):
                self.text += s
        sink = Sink()
        rc = check([tmp], 100, out=sink)
        for line, name in ((5, "too_long"), (207, "Holder"), (311, "trailing")):
            if f"fake.cpp:{line}:{name}: " not in sink.text:
                failures.append(f"the report does not name fake.cpp:{line}:{name}:\n{sink.text}")
        if "just_fits" in sink.text:
            failures.append(f"a 100-line function was reported at --max 100:\n{sink.text}")
        if rc == 0:
            failures.append("exit code 0 with functions over the limit")
        if check([tmp], 102, out=Sink()) != 0:
            failures.append("exit code not 0 when every function fits")
    for f in failures:
        print("self-test: " + f)
    print("self-test: " + ("failed" if failures else "passed"))
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("paths", nargs="*", help="source files or folders (searched for C++ files)")
    p.add_argument("--max", type=int, default=100, help="longest allowed function, in lines (default 100)")
    p.add_argument("--top", type=int, default=0, help="also print the N longest functions")
    p.add_argument("--self-test", action="store_true", help="check the scanner on made-up files and exit")
    a = p.parse_args()
    if a.self_test:
        return self_test()
    if not a.paths:
        p.error("name the source folders to check, e.g. src")
    return check(a.paths, a.max, a.top)


if __name__ == "__main__":
    sys.exit(main())
