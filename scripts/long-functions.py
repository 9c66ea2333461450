#!/usr/bin/env python3
"""Lists every `fn` in the given trees whose body (opening brace to closing brace) spans more
than LIMIT lines. A rough scanner: skips strings, chars and comments when counting braces."""
import os, re, sys
LIMIT = int(os.environ.get("LIMIT", "120"))
FN = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"[^"]*"\s+)?fn\s+(\w+)')

def strip(line, state):
    """The line without comments and string contents; state carries block comments/strings."""
    out, i = [], 0
    while i < len(line):
        c = line[i]
        if state['block']:
            if line.startswith('*/', i): state['block'] -= 1; i += 2; continue
            if line.startswith('/*', i): state['block'] += 1; i += 2; continue
            i += 1; continue
        if state['str']:
            if c == '\\': i += 2; continue
            if c == '"': state['str'] = False
            i += 1; continue
        if state['raw'] is not None:
            end = '"' + '#' * state['raw']
            j = line.find(end, i)
            if j < 0: return ''.join(out)
            state['raw'] = None; i = j + len(end); continue
        if line.startswith('//', i): break
        if line.startswith('/*', i): state['block'] += 1; i += 2; continue
        m = re.match(r'r(#*)"', line[i:])
        if m and (i == 0 or not (line[i-1].isalnum() or line[i-1] == '_')):
            state['raw'] = len(m.group(1)); i += len(m.group(0)); continue
        if c == '"': state['str'] = True; i += 1; continue
        if c == "'":
            m = re.match(r"'(\\.|[^\\'])'", line[i:]) or re.match(r"'\\u\{[0-9a-fA-F]+\}'", line[i:])
            if m: i += len(m.group(0)); continue
        out.append(c); i += 1
    return ''.join(out)

def scan(path):
    lines = open(path, encoding='utf-8').read().split('\n')
    state = {'block': 0, 'str': False, 'raw': None}
    stack = []  # (name, start line, depth at open)
    pending = None
    depth = 0
    found = []
    for n, line in enumerate(lines, 1):
        code = strip(line, state)
        m = FN.match(code)
        if m: pending = (m.group(7), n)
        for c in code:
            if c == '{':
                depth += 1
                if pending: stack.append((pending[0], pending[1], depth)); pending = None
            elif c == '}':
                if stack and stack[-1][2] == depth:
                    name, start, _ = stack.pop()
                    if n - start + 1 > LIMIT: found.append((n - start + 1, path, start, name))
                depth -= 1
            elif c == ';' and pending and depth >= 0:
                pending = None  # a declaration without a body
    return found

found = []
for root in sys.argv[1:]:
    for d, _, fs in os.walk(root):
        for f in fs:
            if f.endswith('.rs'): found += scan(os.path.join(d, f))
for lines, path, start, name in sorted(found, reverse=True):
    print(f"{lines:5} {path}:{start} {name}")
print(f"{len(found)} functions over {LIMIT} lines", file=sys.stderr)
