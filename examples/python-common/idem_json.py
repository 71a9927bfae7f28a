"""Reading a JSON event as the Rust handlers' `serde_json::from_slice` into a
`#[derive(Deserialize)]` struct does, in one call: what the Python handlers
of the examples share, and what `idem new --lang python` copies next to
`app.py`. The same reader as `readEvent` of examples/js-common/idem.js:
the same payloads accepted, the same reasons for the others.

    from idem_json import I64, STRING, BadPayload, read_event

    CREDIT_EVENT = [("account_id", I64), ("amount", I64)]

    def handle(self, msg):
        try:
            event = read_event(msg.payload, "not a credit event", CREDIT_EVENT)
        except BadPayload as e:
            raise e.reject()  # Err(HandlerError_Reject(...)): dead-lettered
        event["account_id"], event["amount"]  # ints in [-2^63, 2^63)

componentize-py finds it on the build's Python path: scripts/build-python.sh
(and a scaffolded folder's build.sh) copies it beside the handler's module.

`json.loads` would take what serde_json refuses: `NaN` and `Infinity`, a
byte order mark or UTF-16 (on bytes), a lone surrogate in a `\\u` escape, a
repeated field (it keeps the last), `-0` or `1.0` for an integer, and it
builds every member of the object. This reader is strict RFC 8259 as
serde_json is: strict UTF-8, no lone surrogate in a `\\u` escape, nesting
bounded as serde_json's recursion limit (128), nothing after the value but
whitespace. It reads the event object member by member as serde's derived
struct does: a listed field's value is read as its type says, any other
member is checked and skipped without building anything, so a payload's
size, not its shape, bounds the memory a message takes.

Differences from idem.js, none in what is accepted: `at character N`
counts code points (JavaScript counts UTF-16 units, so the two differ after
a character beyond U+FFFF), and a payload that is not UTF-8 names the byte
where the bad sequence starts.
"""

import functools
import math
import re

# The field types of `read_event`, as serde reads the Rust field types.
I64 = "i64"  # i64: a JSON integer in [-2^63, 2^63), as an int
STRING = "string"  # String
OPTIONAL_STRING = "string?"  # Option<String>: absent or null is None

__all__ = ["I64", "STRING", "OPTIONAL_STRING", "BadPayload", "read_event"]

MAX_DEPTH = 128  # serde_json's recursion limit
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
U64_MAX = 2**64 - 1
QUOTED_MAX = 40  # characters of a string an error message quotes


class BadPayload(ValueError):
    """The payload is not the event: `reason` is "<what>: <why>", e.g.
    "not a like event: missing field `post_id`". Permanent: `reject()` is
    the error to raise from `handle` (the host dead-letters the message)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason

    def reject(self):
        """`Err(HandlerError_Reject(reason))`: raised from `handle`, the
        WIT `reject` outcome. (componentize-py takes only an `Err` itself
        from `handle`, not a subclass, hence this rather than BadPayload
        being one.)"""
        # Imported here, so that the reader also runs outside a component
        # (the bindings exist only in componentize-py's build).
        from componentize_py_types import Err
        from wit_world.imports.types import HandlerError_Reject

        return Err(HandlerError_Reject(self.reason))


def read_event(payload: bytes, what: str, fields) -> dict:
    """The message's payload as the Rust handler's event struct: `fields`
    is a list of (name, type) in the struct's order (or a dict). Returns a
    dict with one entry per field; other members of the JSON object are
    checked and ignored (repeats of them too). Anything serde_json would
    refuse raises BadPayload("<what>: <reason>"), in serde's wording where
    it can (a position is `at character N`, not serde's line and column; a
    quoted string stops after 40 characters)."""
    types = dict(fields)
    for name, kind in types.items():
        if kind not in (I64, STRING, OPTIONAL_STRING):
            raise ValueError(f"read_event: field `{name}`: unknown type {kind!r}")
    try:
        text = bytes(payload).decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadPayload(f"{what}: the payload is not UTF-8 (invalid UTF-8 at byte {e.start})") from None
    event = {}
    try:
        json = _Reader(text)
        json.ws()
        if json.peek() != "{":
            raise json.invalid_type("a JSON object")
        json.open(1)
        seen = set()
        ignored = _ignored_members(tuple(types))
        first = True
        while json.member(first):
            first = False
            run = ignored.match(text, json.at)
            if run:  # members the struct does not have: serde ignores them, repeats included
                json.at = run.end()
            else:
                name = json.string(True)
                json.colon()
                json.ws()
                kind = types.get(name)
                if kind is None:
                    json.skip_value(1)
                else:
                    if name in seen:
                        raise _JsonError(f"duplicate field `{name}`")
                    seen.add(name)
                    event[name] = json.field(kind)
            if not json.next("}"):
                break
        for name, kind in types.items():
            if name in seen:
                continue
            if kind != OPTIONAL_STRING:
                raise _JsonError(f"missing field `{name}`")
            event[name] = None
        json.ws()
        if json.at < len(text):
            json.fail("trailing characters")
    except _JsonError as e:
        raise BadPayload(f"{what}: {e}") from None
    return event


# ---- the reader --------------------------------------------------------------
#
# Character by character in Python, a 1 MiB payload would take seconds. So
# regexes find the next character of a class (the runs between are skipped in
# C), and what is skipped goes in runs: a valid string, or a run of scalar
# elements or members (`1, 2, 3`, `"a": 1, "b": "x"`), is passed in one match
# (possessive, so nothing is kept to backtrack: Python 3.11 or later; the
# components have CPython 3.14). A run stops before anything
# else, valid or not; the reader goes on from there token by token, and says
# what is wrong where it would have without the run.


class _JsonError(Exception):
    pass


_WHITESPACE = frozenset(" \t\n\r")
_DIGITS = frozenset("0123456789")
_NOT_WHITESPACE = re.compile(r"[^ \t\n\r]")
_STRING_STOP = re.compile(r'["\\\x00-\x1f]')  # where a run of characters needing no escape ends
_NOT_DIGIT = re.compile(r"[^0-9]")
_INTEGER = re.compile(r"-?[0-9]+")
_EXPONENT = re.compile(r"[eE]")
_NON_ZERO = re.compile(r"[1-9]")
# What a one-character escape stands for, by the escape's character.
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = {c: int(c, 16) for c in "0123456789abcdefABCDEF"}
_LITERALS = {"t": "true", "f": "false", "n": "null"}

# Runs of valid JSON, each ending where the reader's own token would (a number
# is followed by none of its characters, else the reader reads it itself).
_WS = r"[ \t\n\r]*+"
_NUMBER = r"-?+(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?+(?:[eE][+-]?+[0-9]++)?+(?![0-9.eE])"
_ESCAPE = (
    r'\\["\\/bfnrt]'
    r"|\\u(?![dD][89abAB])(?![dD][c-fC-F])[0-9a-fA-F]{4}"
    r"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
_STRING = rf'"(?:[^"\\\x00-\x1f]++|{_ESCAPE})*+"'
_SCALAR = rf"(?:{_NUMBER}|{_STRING}|true|false|null)"
_VALID_STRING = re.compile(_STRING)
_ELEMENTS = re.compile(rf"{_SCALAR}(?:{_WS},{_WS}{_SCALAR})*+")
_MEMBERS = re.compile(rf"{_STRING}{_WS}:{_WS}{_SCALAR}(?:{_WS},{_WS}{_STRING}{_WS}:{_WS}{_SCALAR})*+")


@functools.lru_cache(maxsize=32)
def _ignored_members(names: tuple):
    """A run of the event's members that are none of `names`: scalar values
    under keys without escapes (a key with one is read, then compared)."""
    listed = "|".join(re.escape(n) for n in names) or "(?!)"
    other = r'"(?!(?:%s)")[^"\\\x00-\x1f]*+"' % listed
    return re.compile(rf"{other}{_WS}:{_WS}{_SCALAR}(?:{_WS},{_WS}{other}{_WS}:{_WS}{_SCALAR})*+")


def _find(pattern, text: str, start: int) -> int:
    """The index of the first match of `pattern` in `text` from `start`, or len(text)."""
    m = pattern.search(text, start)
    return m.start() if m else len(text)


class _Reader:
    __slots__ = ("text", "at")

    def __init__(self, text: str):
        self.text = text
        self.at = 0

    def fail(self, what: str):
        raise _JsonError(f"{what} at character {self.at}")

    def peek(self) -> str:
        """The character here ("" at the end)."""
        return self.text[self.at : self.at + 1]

    def ws(self):
        if self.peek() in _WHITESPACE:
            self.at = _find(_NOT_WHITESPACE, self.text, self.at + 1)

    def open(self, depth: int):
        """Past an opening bracket here, of a container `depth` deep (the document's own value is 1)."""
        if depth >= MAX_DEPTH:
            self.fail("recursion limit exceeded")
        self.at += 1
        self.ws()

    def next(self, close: str) -> bool:
        """After an element: True past a comma (another one follows), False past the closing bracket."""
        self.ws()
        c = self.peek()
        if c == close:
            self.at += 1
            return False
        if c != ",":
            is_list = close == "]"
            if c == "":
                self.fail("EOF while parsing a list" if is_list else "EOF while parsing an object")
            self.fail("expected `,` or `]`" if is_list else "expected `,` or `}`")
        self.at += 1
        self.ws()
        if self.peek() == close:
            self.fail("trailing comma")
        return True

    def member(self, first: bool) -> bool:
        """In an object, past `{` (first) or a comma: True at a key, False past the `}` of `{}`."""
        self.ws()
        c = self.peek()
        if c == '"':
            return True
        if first and c == "}":
            self.at += 1
            return False
        self.fail("EOF while parsing an object" if c == "" else "key must be a string")

    def colon(self):
        """Past the colon after a key."""
        self.ws()
        c = self.peek()
        if c == ":":
            self.at += 1
            return
        self.fail("EOF while parsing an object" if c == "" else "expected `:`")

    def literal(self) -> str:
        """`true`, `false` or `null` here, as its text."""
        t, c = self.text, self.peek()
        word = _LITERALS.get(c)
        if word is None:
            self.fail("EOF while parsing a value" if c == "" else "expected value")
        if t.startswith(word, self.at):
            self.at += len(word)
            return word
        i = 1
        while True:  # as serde_json: where the word goes wrong
            d = t[self.at + i : self.at + i + 1]
            if d != word[i]:
                self.at += i
                self.fail("EOF while parsing a value" if d == "" else "expected ident")
            i += 1

    def digits(self, start: int) -> int:
        """Past a run of digits from `start`."""
        if self.text[start : start + 1] in _DIGITS:
            return _find(_NOT_DIGIT, self.text, start + 1)
        return start

    def skip_number(self):
        """Past a number here (`-` or a digit), checking its grammar."""
        t = self.text
        if self.peek() == "-":
            self.at += 1
        c = self.peek()
        if c == "0":
            self.at += 1
            if self.peek() in _DIGITS:
                self.fail("invalid number")  # no leading zero
        elif c in _DIGITS:
            self.at = self.digits(self.at + 1)
        else:
            self.fail("invalid number")
        if t[self.at : self.at + 1] == ".":
            start = self.at + 1
            self.at = self.digits(start)
            if self.at == start:
                self.fail("invalid number")
        if t[self.at : self.at + 1] in ("e", "E"):
            self.at += 1
            if self.peek() in ("+", "-"):
                self.at += 1
            start = self.at
            self.at = self.digits(start)
            if self.at == start:
                self.fail("invalid number")

    def number(self):
        """A number here: what serde_json makes of it, an int (an integer it reads as u64 or i64) or a finite float."""
        start = self.at
        self.skip_number()
        text = self.text[start : self.at]
        negative = text[0] == "-"
        # Integers of at most 20 digits: the only ones that can fit a u64 (and int() of
        # thousands of digits would only cost, or fail past Python's 4300).
        if len(text) - negative <= 20 and text != "-0" and _INTEGER.fullmatch(text):
            n = int(text)
            if (n >= I64_MIN) if negative else (n <= U64_MAX):
                return n
        # Anything else serde_json reads as an f64, `-0` included, and refuses it if it overflows.
        x = _to_float(text)
        if not math.isfinite(x):
            self.fail("number out of range")
        return x

    def string(self, keep: bool) -> str:
        """A string here: its value if `keep`, else only checked (nothing built)."""
        t = self.text
        if not keep:
            run = _VALID_STRING.match(t, self.at)
            if run:
                self.at = run.end()
                return ""
        out = []
        self.at += 1  # the opening quote
        while True:
            c0 = self.peek()
            stop = self.at if c0 in ("\\", '"') else _find(_STRING_STOP, t, self.at)
            if keep and stop > self.at:
                out.append(t[self.at : stop])
            self.at = stop
            c = t[self.at : self.at + 1]
            self.at += 1
            if c == '"':
                return "".join(out)
            if c != "\\":
                self.at -= 1
                self.fail(
                    "EOF while parsing a string"
                    if c == ""
                    else "control character (\\u0000-\\u001F) found while parsing a string"
                )
            e = t[self.at : self.at + 1]
            self.at += 1
            if e == "u":
                unit = self.hex4()
                if 0xDC00 <= unit <= 0xDFFF:
                    self.fail("lone leading surrogate in hex escape")
                if 0xD800 <= unit <= 0xDBFF:
                    if t[self.at : self.at + 2] != "\\u":
                        self.fail("unexpected end of hex escape")
                    self.at += 2
                    low = self.hex4()
                    if not 0xDC00 <= low <= 0xDFFF:
                        self.fail("lone leading surrogate in hex escape")
                    if keep:
                        out.append(chr(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)))
                elif keep:
                    out.append(chr(unit))
            else:
                ch = _ESCAPES.get(e)
                if ch is None:
                    self.at -= 1
                    self.fail("EOF while parsing a string" if e == "" else "invalid escape")
                if keep:
                    out.append(ch)

    def hex4(self) -> int:
        """The code unit of the four hex digits here."""
        unit = 0
        for i in range(4):
            c = self.text[self.at + i : self.at + i + 1]
            d = _HEX.get(c)
            if d is None:
                self.at += i
                self.fail("EOF while parsing a string" if c == "" else "invalid escape")
            unit = unit * 16 + d
        self.at += 4
        return unit

    def skip_value(self, depth: int):
        """Checks and skips a value in a container `depth` deep, building nothing."""
        self.ws()
        c = self.peek()
        if c == "{":
            self.open(depth + 1)
            first = True
            while self.member(first):
                first = False
                run = _MEMBERS.match(self.text, self.at)
                if run:
                    self.at = run.end()
                else:
                    self.string(False)
                    self.colon()
                    self.skip_value(depth + 1)
                if not self.next("}"):
                    break
        elif c == "[":
            self.open(depth + 1)
            if self.peek() == "]":
                self.at += 1
                return
            while True:
                run = _ELEMENTS.match(self.text, self.at)
                if run:
                    self.at = run.end()
                else:
                    self.skip_value(depth + 1)
                if not self.next("]"):
                    break
        elif c == '"':
            self.string(False)
        elif c == "-" or c in _DIGITS:
            self.skip_number()
        else:
            self.literal()

    def field(self, kind: str):
        """A listed field's value (whitespace skipped), read as serde reads the field's type."""
        c = self.peek()
        if kind == I64:
            if c != "-" and c not in _DIGITS:
                raise self.invalid_type("i64")
            n = self.number()
            if type(n) is not int:
                raise _JsonError(f"invalid type: floating point `{_serde_float(n)}`, expected i64")
            if n > I64_MAX:
                raise _JsonError(f"invalid value: integer `{n}`, expected i64")
            return n
        if kind == OPTIONAL_STRING and c == "n":
            self.literal()
            return None
        if c != '"':
            raise self.invalid_type("a string")
        return self.string(True)

    def invalid_type(self, expected: str) -> _JsonError:
        """serde_json's "invalid type" error for the value here (whitespace
        skipped), reading of it only what the message needs, as serde_json does."""
        c = self.peek()
        if c == "[":
            what = "sequence"
        elif c == "{":
            what = "map"
        elif c == '"':
            what = f"string {_debug_string(self.string(True))}"
        elif c == "-" or c in _DIGITS:
            n = self.number()
            what = f"integer `{n}`" if type(n) is int else f"floating point `{_serde_float(n)}`"
        else:
            word = self.literal()
            what = "null" if word == "null" else f"boolean `{word}`"
        return _JsonError(f"invalid type: {what}, expected {expected}")


def _to_float(text: str) -> float:
    """The float a number's text stands for. A long one (a 400 000-digit
    integer, say) is cut to its first 20 significant digits and its exponent
    first, as idem.js does: serde_json itself keeps no more than that."""
    if len(text) <= 64:
        return float(text)
    sign = "-" if text[0] == "-" else ""
    m = _EXPONENT.search(text)
    exponent = 0
    if m is None:
        end = len(text)
    else:
        end = m.start()
        e = text[end + 1 :]
        first = _NON_ZERO.search(e)  # leading zeros are allowed in an exponent
        size = 0 if first is None else len(e) - first.start()
        exponent = 0 if size == 0 else 10**9 if size > 9 else int(e[first.start() :])
        if e[:1] == "-":
            exponent = -exponent
    dot = text.find(".")
    whole = text[len(sign) : end if dot < 0 else dot]  # no leading zero unless it is "0"
    fraction = "" if dot < 0 else text[dot + 1 : end]
    if whole != "0":  # the significant digits, and the power of ten of the first
        digits = whole[:20]
        if len(digits) < 20:
            digits += fraction[: 20 - len(digits)]
        point = len(whole) - 1
    else:
        first = _NON_ZERO.search(fraction)
        if first is None:
            return -0.0 if sign else 0.0
        digits = fraction[first.start() : first.start() + 20]
        point = -1 - first.start()
    power = max(-99999, min(99999, point + exponent))
    return float(f"{sign}{digits[0]}.{digits[1:] or '0'}e{power}")


def _serde_float(x: float) -> str:
    """A finite float as serde_json shows it in errors: shortest digits, fixed notation for 1e-5 <= |x| < 1e16."""
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    sign = "-" if x < 0 else ""
    # repr: the shortest digits that read back as x, as JavaScript's toExponential().
    mantissa, _, exp = repr(abs(x)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    all_digits = whole + fraction
    power = (int(exp) if exp else 0) + len(whole) - 1
    digits = all_digits.lstrip("0")
    power -= len(all_digits) - len(digits)
    digits = digits.rstrip("0") or "0"
    if power < -5 or power > 15:
        rest = f".{digits[1:]}" if len(digits) > 1 else ""
        return f"{sign}{digits[0]}{rest}e{'+' if power >= 0 else '-'}{abs(power)}"
    if len(digits) - 1 <= power:
        return f"{sign}{digits}{'0' * (power + 1 - len(digits))}.0"
    if power >= 0:
        return f"{sign}{digits[: power + 1]}.{digits[power + 1 :]}"
    return f"{sign}0.{'0' * (-power - 1)}{digits}"


def _debug_string(s: str) -> str:
    """A string as Rust's `{:?}` shows it, cut after QUOTED_MAX characters (then `…` follows the quotes)."""
    out = ['"']
    for n, ch in enumerate(s):
        if n == QUOTED_MAX:
            return "".join(out) + '"…'
        c = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif c == 0:
            out.append("\\0")
        elif c < 0x20 or 0x7F <= c < 0xA0:
            out.append("\\u{" + format(c, "x") + "}")  # Rust's \u{7f}
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)
