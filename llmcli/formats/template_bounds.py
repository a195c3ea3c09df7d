"""The sizes a chat template may build (chat_template.py's sandbox calls these), checked before the
work is done: one C-level operation (a join, a replace) cannot be interrupted once it runs, and what
it allocates is held until it ends. Three bounds:

- each text, bytes or list: at most MAX_TEXT characters or items;
- all one render builds, kept or not: at most MAX_BUILT bytes as Python holds them (1, 2 or 4 bytes
  a character, 8 a list item, and the new texts a split or a list of a text's characters holds);
- forecasts: the operations whose result can be far longer than what they are given (join, replace,
  expandtabs, translate, indent, wordwrap, `%` and format, tojson, a container written as text,
  sum) first bound their result's length from the lengths of their inputs. A list holding one long
  text a thousand times is cheap; joined, it is a thousand copies, made by one C call.
"""

from __future__ import annotations

import contextvars
import re
import sys
from collections.abc import Mapping

MAX_TEXT = 32 << 20  # characters in the output or in any text (or items in a list) built on the way
MAX_BUILT = 256 << 20  # bytes one render builds in all, kept or not (sys.getsizeof's count)
MAX_INT_BITS = 1 << 16  # integers a template computes (10 ** 10 ** 10 would take forever)
MAX_INT_ARG = 1 << 20  # widths and counts passed to calls and filters, and in format strings
# characters one character of a text may become: in JSON (\u001f), repr (\U000e0001), a URL (%F0%9F%98%80)
JSON_CHAR, REPR_CHAR, URL_CHAR = 6, 10, 12


class TooBig(Exception):
    """A size bound was hit; the message says which."""


_built: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("built", default=None)


def counting():
    """A token for `done`: from here on, what the current render builds is counted."""
    return _built.set([0])


def done(token) -> None:
    _built.reset(token)


def _count(nbytes: int) -> None:
    built = _built.get()
    if built is not None:
        built[0] += nbytes
        if built[0] > MAX_BUILT:
            raise TooBig(f"built more than {MAX_BUILT >> 20} MiB in all")


def _check_length(n: int) -> None:
    if n > MAX_TEXT:
        raise TooBig(f"built a text or list of more than {MAX_TEXT} items")


def _reserve(nbytes: int) -> None:
    """Refuse, before it is built, what would take the render past MAX_BUILT."""
    built = _built.get()
    if built is not None and built[0] + nbytes > MAX_BUILT:
        raise TooBig(f"built more than {MAX_BUILT >> 20} MiB in all")


def _width(x) -> int:
    """Bytes a character of `x` may take (str.isascii is a flag: no scan)."""
    return 1 if isinstance(x, bytes) or isinstance(x, str) and x.isascii() else 4


def bounded_list(iterable) -> list:
    """list(iterable), counted as the items come: a list of one new object per character of a long
    text (its split, its sorted characters) takes ~60 bytes an item."""
    if isinstance(iterable, (list, tuple)):
        return list(iterable)
    out, nbytes = [], 0
    for x in iterable:
        out.append(x)
        nbytes += 8 + sys.getsizeof(x)
        _reserve(nbytes)
    _check_length(len(out))
    return out


def sized(value):
    """`value`, if it is within the bounds (and counted against the render's total)."""
    if isinstance(value, (str, bytes, list, tuple)):
        _check_length(len(value))
        _count(sys.getsizeof(value))  # a list's pointers; new items it holds were forecast (splits, bounded_list)
    elif isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise TooBig(f"computed a number of more than {MAX_INT_BITS} bits")
    return value


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_args(args, kwargs) -> None:
    for a in (*args, *kwargs.values()):
        if _is_int(a) and abs(a) > MAX_INT_ARG:
            raise TooBig(f"passed {a} to a function (at most {MAX_INT_ARG})")


# ------------------------------------------------------------------------------- forecasts

def text_bound(value, char: int = REPR_CHAR, indent: int = 0, sep: int = 2) -> int:
    """At least the characters str(value) or json.dumps(value, indent=, separators=) writes, each
    character of a text taken as `char` (escaped) and each item's separator as `sep`, counted
    without writing anything; stops past MAX_TEXT."""
    total, stack = 0, [(value, 1)]
    while stack and total <= MAX_TEXT:
        v, depth = stack.pop()
        if isinstance(v, (str, bytes)):
            total += char * len(v) + 3
        elif isinstance(v, Mapping):
            total += 2 + len(v) * (2 + 2 * sep + indent * depth)
            stack += [(x, depth + 1) for pair in v.items() for x in pair]
        elif isinstance(v, (list, tuple, set, frozenset)) or type(v).__name__.startswith("dict_"):
            total += 3 + len(v) * (1 + sep + indent * depth)
            stack += [(x, depth + 1) for x in v]
        elif _is_int(v):
            total += v.bit_length() // 3 + 2
        elif type(v).__name__ == "Namespace":  # jinja's namespace() writes its attributes
            total += 16
            stack.append((object.__getattribute__(v, "_Namespace__attrs"), depth))
        else:
            total += 32  # a float, None, a bool, a loop or macro object's short repr
    return total


def _str_bound(v) -> int:
    return len(v) if isinstance(v, (str, bytes)) else text_bound(v)


def _join(value, sep="", attribute=None):
    return sum(map(_str_bound, value)) + len(sep) * len(value)


def _replace(s, old, new, count=-1):
    n = s.count(old) if old else len(s) + 1
    if count is not None and count >= 0:
        n = min(n, count)
    return len(s) + n * max(0, len(new) - len(old))


def _expandtabs(s, tabsize=8):
    return len(s) + s.count("\t" if isinstance(s, str) else b"\t") * max(tabsize, 0)


def _translate(s, table, *args):
    if not isinstance(table, Mapping):
        return len(s)
    return len(s) * max((_str_bound(v) for v in table.values() if v is not None), default=1)


def _indent(s, width=4, first=False, blank=False):
    return len(s) + (s.count("\n") + 1) * (width if _is_int(width) else len(str(width)))


def _wordwrap(s, width=79, break_long_words=True, wrapstring=None, break_on_hyphens=True):
    return len(s) + (len(s) // max(width, 1) + s.count("\n") + 1) * len(wrapstring or "\n")


def _fields(fmt: str) -> int:
    return fmt.count("%") + fmt.count("{")


def percent(fmt, values) -> int:
    """`fmt % values`: every field may write the longest value, at its width."""
    items = list(values.values()) if isinstance(values, Mapping) else values if isinstance(values, tuple) else [values]
    return _format_bound(fmt, items)


def _format_bound(fmt, items) -> int:
    longest = max(map(_str_bound, items), default=0)
    widths = sum(int(n) for n in re.findall(r"\d+", fmt))  # '%1000000d' * 32: each field at its width
    given = (fmt.count("*") + fmt.count("{")) * max((abs(a) for a in items if _is_int(a)), default=0)  # '%*d', '{:{}}'
    return len(fmt) + _fields(fmt) * longest + widths + given


def _format_filter(value, *args, **kwargs):
    return _format_bound(value, list(kwargs.values()) or list(args))


def _str_format(fmt, *args, **kwargs):
    return _format_bound(fmt, [*args, *kwargs.values()])


def _format_map(fmt, mapping):
    return _format_bound(fmt, list(mapping.values()) if isinstance(mapping, Mapping) else [])


def _tojson(value, ensure_ascii=False, indent=None, separators=None, *args, **kwargs):
    """chat_template._tojson's arguments: '\\ud83d\\ude00' is 12 characters for one with ensure_ascii."""
    width = indent if _is_int(indent) else len(str(indent or ""))
    sep = max(map(len, separators)) if separators else 2
    return text_bound(value, 2 * JSON_CHAR if ensure_ascii else JSON_CHAR, width, sep)


def _sum(iterable, attribute=None, start=0):
    """Lists summed are as long as all of them together (numbers: nothing to bound; texts: refused)."""
    if not isinstance(start, (list, tuple)):
        return 0
    return len(start) + sum(len(x) if isinstance(x, (list, tuple)) and attribute is None else text_bound(x, 1)
                            for x in iterable)


_SPACES = "".join(c for c in map(chr, range(0x3001)) if c.isspace())  # what str.split() splits at


def _pieces(s, sep=None, maxsplit=-1):
    """Pieces a split makes, at most: each is a new object (8 bytes of list and ~50 of its own)."""
    if isinstance(s, bytes):
        n = s.count(sep) if sep else sum(s.count(c) for c in b" \t\n\r\x0b\x0c")
    else:
        n = s.count(sep) if sep else sum(s.count(c) for c in _SPACES)
    if maxsplit is not None and maxsplit >= 0:
        n = min(n, maxsplit)
    return n + 1


_LINE_ENDS = ("\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")  # str.splitlines()'s


def _splitlines(s, keepends=False):
    ends = (b"\n", b"\r") if isinstance(s, bytes) else _LINE_ENDS
    return sum(map(s.count, ends)) + 1


# filter name -> bound of its result's length from its arguments (the value first)
FILTERS = {
    "join": _join, "replace": _replace, "indent": _indent, "wordwrap": _wordwrap, "format": _format_filter,
    "tojson": _tojson, "sum": _sum, "string": text_bound, "pprint": lambda v, *a: text_bound(v, REPR_CHAR, 1),
    "urlencode": lambda v: text_bound(v, URL_CHAR), "urlize": lambda v, *a, **k: text_bound(v, URL_CHAR),
    "xmlattr": lambda v, *a: text_bound(v, JSON_CHAR), "escape": lambda v: text_bound(v, JSON_CHAR),
    "e": lambda v: text_bound(v, JSON_CHAR), "forceescape": lambda v: text_bound(v, JSON_CHAR),
}
# str and bytes method name -> the same, the text first
METHODS = {"join": lambda s, items: _join(items, s), "replace": _replace, "expandtabs": _expandtabs,
           "translate": _translate, "format": _str_format, "format_map": _format_map,
           "encode": lambda s, *args, **kwargs: REPR_CHAR * len(s)}  # 'unicode_escape' writes \U0001f600
# str and bytes method name -> the pieces it makes at most
SPLITS = {"split": _pieces, "rsplit": _pieces, "splitlines": _splitlines}
# filters whose first argument is walked (twice, for join and sum): an iterator or a text becomes a
# list first, counted as it comes
MATERIALIZED = ("join", "sum", "list", "sort", "unique", "batch", "slice", "groupby")
# filters that take containers as they are; every other one writes its value as text first (upper,
# trim, center, ...): a container given to it is bounded as if written out
STRUCTURAL = frozenset({"abs", "attr", "batch", "bool", "count", "d", "default", "dictsort", "first", "float",
                        "groupby", "int", "items", "join", "last", "length", "list", "map", "max", "min", "random",
                        "reject", "rejectattr", "reverse", "round", "select", "selectattr", "slice", "sort", "sum",
                        "tojson", "unique"})


def forecast(table: dict, name: str, args, kwargs) -> None:
    """TooBig where `name(*args, **kwargs)` could build more than MAX_TEXT characters or items, or
    take the render past MAX_BUILT bytes."""
    bound = table.get(name)
    if bound is None:
        return
    try:
        n = bound(*args, **kwargs)
    except (TypeError, ValueError, AttributeError):  # arguments the call itself will refuse
        return
    _check_length(n)
    _reserve(n * (_width(args[0]) if args else 4))


def forecast_split(name: str, args, kwargs) -> None:
    """The same for a str or bytes method that makes a list of new texts (split, splitlines)."""
    bound = SPLITS.get(name)
    if bound is None:
        return
    try:
        n = bound(*args, **kwargs)
    except (TypeError, ValueError, AttributeError):
        return
    _check_length(n)
    _reserve(n * (8 + sys.getsizeof("")) + sys.getsizeof(args[0]))


def check_binop(op: str, a, b) -> None:
    seq = (str, bytes, list, tuple)
    if op == "*":
        if _is_int(a) and _is_int(b):
            if a.bit_length() + b.bit_length() > MAX_INT_BITS:
                raise TooBig(f"computed a number of more than {MAX_INT_BITS} bits")
        elif isinstance(a, seq) and _is_int(b) or isinstance(b, seq) and _is_int(a):
            n, s = (b, a) if _is_int(b) else (a, b)
            _check_length(len(s) * n)
            _reserve(len(s) * n * (8 if isinstance(s, (list, tuple)) else _width(s)))
    elif op == "**":
        if _is_int(a) and _is_int(b) and abs(a) > 1 and b > 0 and a.bit_length() * b > MAX_INT_BITS:
            raise TooBig(f"computed a number of more than {MAX_INT_BITS} bits")
    elif op == "+":
        if isinstance(a, seq) and isinstance(b, seq):
            _check_length(len(a) + len(b))
            _reserve((len(a) + len(b)) * (8 if isinstance(a, (list, tuple)) else max(_width(a), _width(b))))
    elif op == "%" and isinstance(a, str):
        check_format(a)
        check_args(b if isinstance(b, tuple) else (b,), {})
        _check_length(percent(a, b))


def check_format(fmt: str) -> None:
    """Widths and precisions in a `%` or `.format` string ('%99999999999d' allocates that many)."""
    if any(int(n) > MAX_INT_ARG for n in re.findall(r"\d{7,}", fmt)):
        raise TooBig(f"used a format width above {MAX_INT_ARG}")


def to_text(value) -> str:
    """str(value), bounded first where it is a container (its texts written once each time they are held)."""
    if not isinstance(value, str):
        _check_length(text_bound(value))
    return str(value)


def finalize(value):
    """What an expression outputs (or a filter writes as text), checked before str() writes it."""
    if not isinstance(value, str):
        _check_length(text_bound(value))
    return value


def bounded_join(pieces) -> str:
    """The environment's `concat`: the output, `{% set %}` blocks, macro bodies, and `~`, counted as
    the pieces come."""
    kept, size = [], 0
    for piece in pieces:
        if piece:
            size += len(piece)
            if size > MAX_TEXT:
                raise TooBig(f"produced more than {MAX_TEXT} characters")
            kept.append(piece)
    return sized("".join(kept))
