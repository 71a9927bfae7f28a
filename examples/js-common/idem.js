// What every JavaScript handler of the examples shares: reading a JSON event
// as the Rust handlers' `serde_json::from_slice` into a `#[derive(Deserialize)]`
// struct does, running statements the way the Rust guest SDK's `tx::execute`
// and `?` do, and the host's log. Imported by relative path
// (`import { ... } from '../js-common/idem.js'`); scripts/build-js.sh makes
// this folder visible to both engines while they snapshot the module.
//
// The two engines scripts/build-js.sh knows differ in one way that matters:
// - QuickJS (componentize-qjs): WIT s64/u64 are JS numbers, exact below 2^53;
// - StarlingMonkey (componentize-js): WIT s64/u64 are BigInts.
// Either way a failed import call throws an Error whose `payload` is the WIT
// error value, and `handle` reports its own error by throwing the
// `handler-error` variant ({ tag: 'reject' | 'retry', val: reason }).
import * as transaction from 'idem:handler/transaction@0.2.0';
import * as hostLog from 'idem:handler/log@0.2.0';
import * as hostOutbox from 'idem:handler/outbox@0.2.0';

/** Permanent: the host dead-letters the message. Throw it from `handle`. */
export const reject = (reason) => ({ tag: 'reject', val: reason });
/** Transient: the host delivers the message again later. */
export const retry = (reason) => ({ tag: 'retry', val: reason });

/** A line in the host's log: level is 'debug', 'info', 'warn' or 'error'. */
export function log(level, message) {
  hostLog.log(level, message);
}

/**
 * Publishes `payload` (a string or bytes) to `subject` once the message's
 * transaction commits, and only then (the outbox; the subject must be
 * granted by the handler's `publish`). `headers` is a list of [name, value]
 * pairs; messages with the same `key` leave in commit order. Throws an
 * Error whose `payload` is the refusal ({ tag: 'not-granted' | 'over-limit'
 * | 'invalid', val: why }).
 */
export function publish(subject, payload, headers = [], key = undefined) {
  const bytes = typeof payload === 'string' ? utf8Encode(payload) : payload;
  hostOutbox.publish(subject, new Uint8Array(bytes), headers, key);
}

/**
 * POSTs `body` to the endpoint the handler's config names `endpoint` once
 * the message's transaction commits, with an Idempotency-Key header; as
 * `publish` otherwise.
 */
export function call(endpoint, body, headers = [], key = undefined) {
  const bytes = typeof body === 'string' ? utf8Encode(body) : body;
  hostOutbox.call(endpoint, new Uint8Array(bytes), headers, key);
}

// ---- UTF-8 -------------------------------------------------------------------

/** Strict UTF-8 decoding (QuickJS has no TextDecoder); throws on malformed input. */
export function utf8Decode(bytes) {
  if (typeof TextDecoder === 'function') {
    // ignoreBOM: keep a leading U+FEFF, which the JSON reader then refuses, as serde_json does.
    return new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(bytes);
  }
  let out = '';
  let units = []; // UTF-16 code units not yet in `out`
  for (let i = 0; i < bytes.length; ) {
    if (units.length >= 4096) { out += String.fromCharCode.apply(null, units); units = []; }
    const b = bytes[i++];
    let cp, need, min;
    if (b < 0x80) { units.push(b); continue; }
    else if (b >= 0xc2 && b < 0xe0) { cp = b & 0x1f; need = 1; min = 0x80; }
    else if (b >= 0xe0 && b < 0xf0) { cp = b & 0x0f; need = 2; min = 0x800; }
    else if (b >= 0xf0 && b < 0xf5) { cp = b & 0x07; need = 3; min = 0x10000; }
    else throw new Error(`invalid UTF-8 at byte ${i - 1}`);
    for (; need > 0; need--) {
      const c = bytes[i++];
      if (c === undefined || (c & 0xc0) !== 0x80) throw new Error(`invalid UTF-8 at byte ${i - 1}`);
      cp = (cp << 6) | (c & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) throw new Error('invalid UTF-8');
    if (cp < 0x10000) units.push(cp);
    else units.push(0xd800 | ((cp - 0x10000) >> 10), 0xdc00 | (cp & 0x3ff));
  }
  return out + String.fromCharCode.apply(null, units);
}

/** The UTF-8 bytes of a string (as Rust's `str::as_bytes`). */
export function utf8Encode(text) {
  const out = [];
  for (const ch of text) {
    const cp = ch.codePointAt(0);
    if (cp < 0x80) out.push(cp);
    else if (cp < 0x800) out.push(0xc0 | (cp >> 6), 0x80 | (cp & 0x3f));
    else if (cp < 0x10000) out.push(0xe0 | (cp >> 12), 0x80 | ((cp >> 6) & 0x3f), 0x80 | (cp & 0x3f));
    else out.push(0xf0 | (cp >> 18), 0x80 | ((cp >> 12) & 0x3f), 0x80 | ((cp >> 6) & 0x3f), 0x80 | (cp & 0x3f));
  }
  return out;
}

// ---- JSON, read as serde_json reads it ---------------------------------------
//
// JSON.parse would make every number a double (so 2^53 + 1 and 1.0 could not
// be told from 2^53 and 1), keep the last of two equal keys, and build every
// member, where the Rust handlers take exact 64-bit integers, refuse a float
// for an integer, refuse a repeated field and skip what they ignore. This
// reader is strict RFC 8259 as serde_json is: no lone surrogate in a \u
// escape, nesting bounded as serde_json's recursion limit (128), nothing
// after the value but whitespace. It reads the event object member by member
// as serde's derived struct does: a listed field's value is read as its type
// says, any other member is checked and skipped without building anything
// (no string, number or container is made for it), so a payload's size, not
// its shape, bounds the memory a message takes.
//
// Scanning uses charCodeAt, and regexes only to find the next character of a
// class (global, not sticky, never `[...]*`): QuickJS keeps a backtracking
// entry per character a greedy `*` consumes (a 1 MiB run took ~20 MiB).

const MAX_DEPTH = 128;
const I64_MIN = -(2n ** 63n);
const I64_MAX = 2n ** 63n - 1n;
const U64_MAX = 2n ** 64n - 1n;
const QUOTED_MAX = 40; // characters of a string an error message quotes

class JsonError extends Error {}

const TAB = 0x09, LF = 0x0a, CR = 0x0d, SPACE = 0x20, QUOTE = 0x22, PLUS = 0x2b, COMMA = 0x2c;
const MINUS = 0x2d, DOT = 0x2e, ZERO = 0x30, ONE = 0x31, NINE = 0x39, COLON = 0x3a, UPPER_E = 0x45;
const OPEN_BRACKET = 0x5b, BACKSLASH = 0x5c, CLOSE_BRACKET = 0x5d, LOWER_E = 0x65, LOWER_F = 0x66;
const LOWER_N = 0x6e, LOWER_T = 0x74, LOWER_U = 0x75, OPEN_BRACE = 0x7b, CLOSE_BRACE = 0x7d;

const NOT_WHITESPACE = /[^ \t\n\r]/g;
const STRING_STOP = /["\\\u0000-\u001f]/g; // where a run of characters needing no escape ends
const NOT_DIGIT = /[^0-9]/g;
const INTEGER = /^-?[0-9]+$/;
// What a one-character escape stands for, by the escape's character code.
const ESCAPES = { 0x22: '"', 0x5c: '\\', 0x2f: '/', 0x62: '\b', 0x66: '\f', 0x6e: '\n', 0x72: '\r', 0x74: '\t' };

const isDigit = (c) => c >= ZERO && c <= NINE;

/** The index of the first match of `global` (a /g regex) in `text` from `from`, or text.length. */
function find(global, text, from) {
  global.lastIndex = from;
  const m = global.exec(text);
  return m ? m.index : text.length;
}

class JsonReader {
  constructor(text) { this.text = text; this.at = 0; }

  fail(what) { throw new JsonError(`${what} at character ${this.at}`); }

  /** The character code here (NaN at the end). */
  peek() { return this.text.charCodeAt(this.at); }

  ws() {
    const c = this.peek();
    if (c === SPACE || c === LF || c === CR || c === TAB) this.at = find(NOT_WHITESPACE, this.text, this.at + 1);
  }

  /** Past an opening bracket here, of a container `depth` deep (the document's own value is 1). */
  open(depth) {
    if (depth >= MAX_DEPTH) this.fail('recursion limit exceeded');
    this.at++;
    this.ws();
  }

  /** After an element: true past a comma (another one follows), false past the closing bracket. */
  next(close) {
    this.ws();
    const c = this.peek();
    if (c === close) { this.at++; return false; }
    if (c !== COMMA) {
      const list = close === CLOSE_BRACKET;
      if (Number.isNaN(c)) this.fail(list ? 'EOF while parsing a list' : 'EOF while parsing an object');
      this.fail(list ? 'expected `,` or `]`' : 'expected `,` or `}`');
    }
    this.at++;
    this.ws();
    if (this.peek() === close) this.fail('trailing comma');
    return true;
  }

  /** In an object, past `{` (first) or a comma: true at a key, false past the `}` of `{}`. */
  member(first) {
    this.ws();
    const c = this.peek();
    if (c === QUOTE) return true;
    if (first && c === CLOSE_BRACE) { this.at++; return false; }
    return this.fail(Number.isNaN(c) ? 'EOF while parsing an object' : 'key must be a string');
  }

  /** Past the colon after a key. */
  colon() {
    this.ws();
    const c = this.peek();
    if (c === COLON) { this.at++; return; }
    this.fail(Number.isNaN(c) ? 'EOF while parsing an object' : 'expected `:`');
  }

  /** `true`, `false` or `null` here, as its text. */
  literal() {
    const t = this.text, c = this.peek();
    const word = c === LOWER_T ? 'true' : c === LOWER_F ? 'false' : c === LOWER_N ? 'null' : null;
    if (word === null) this.fail(Number.isNaN(c) ? 'EOF while parsing a value' : 'expected value');
    if (t.startsWith(word, this.at)) { this.at += word.length; return word; }
    for (let i = 1; ; i++) { // as serde_json: where the word goes wrong
      const d = t.charCodeAt(this.at + i);
      if (d !== word.charCodeAt(i)) { this.at += i; this.fail(Number.isNaN(d) ? 'EOF while parsing a value' : 'expected ident'); }
    }
  }

  /** Past a run of digits from `from`. */
  digits(from) {
    return isDigit(this.text.charCodeAt(from)) ? find(NOT_DIGIT, this.text, from + 1) : from;
  }

  /** Past a number here (`-` or a digit), checking its grammar. */
  skipNumber() {
    const t = this.text;
    if (this.peek() === MINUS) this.at++;
    const c = this.peek();
    if (c === ZERO) {
      this.at++;
      if (isDigit(this.peek())) this.fail('invalid number'); // no leading zero
    } else if (c >= ONE && c <= NINE) {
      this.at = this.digits(this.at + 1);
    } else {
      this.fail('invalid number');
    }
    if (t.charCodeAt(this.at) === DOT) {
      const from = this.at + 1;
      this.at = this.digits(from);
      if (this.at === from) this.fail('invalid number');
    }
    const e = t.charCodeAt(this.at);
    if (e === LOWER_E || e === UPPER_E) {
      this.at++;
      const sign = this.peek();
      if (sign === PLUS || sign === MINUS) this.at++;
      const from = this.at;
      this.at = this.digits(from);
      if (this.at === from) this.fail('invalid number');
    }
  }

  /** A number here: what serde_json makes of it, a BigInt (an integer it reads as u64 or i64) or a finite double. */
  number() {
    const from = this.at;
    this.skipNumber();
    const text = this.text.slice(from, this.at);
    const negative = text.charCodeAt(0) === MINUS;
    // Integers of at most 20 digits: the only ones that can fit a u64 (BigInt of more would only cost).
    if (text.length - (negative ? 1 : 0) <= 20 && text !== '-0' && INTEGER.test(text)) {
      const n = BigInt(text);
      if (negative ? n >= I64_MIN : n <= U64_MAX) return n;
    }
    // Anything else serde_json reads as an f64, `-0` included, and refuses it if it overflows.
    const x = toDouble(text);
    if (!Number.isFinite(x)) this.fail('number out of range');
    return x;
  }

  /** A string here: its value if `keep`, else only checked (nothing built). */
  string(keep) {
    const t = this.text;
    let out = '';
    this.at++; // the opening quote
    for (;;) {
      const c0 = this.peek();
      const stop = c0 === BACKSLASH || c0 === QUOTE ? this.at : find(STRING_STOP, t, this.at);
      if (keep && stop > this.at) out += t.slice(this.at, stop);
      this.at = stop;
      const c = t.charCodeAt(this.at++);
      if (c === QUOTE) return out;
      if (c !== BACKSLASH) {
        this.at--;
        this.fail(Number.isNaN(c) ? 'EOF while parsing a string' : 'control character (\\u0000-\\u001F) found while parsing a string');
      }
      const e = t.charCodeAt(this.at++);
      if (e === LOWER_U) {
        const unit = this.hex4();
        if (unit >= 0xdc00 && unit <= 0xdfff) this.fail('lone leading surrogate in hex escape');
        if (unit >= 0xd800 && unit <= 0xdbff) {
          if (t.charCodeAt(this.at) !== BACKSLASH || t.charCodeAt(this.at + 1) !== LOWER_U) this.fail('unexpected end of hex escape');
          this.at += 2;
          const low = this.hex4();
          if (low < 0xdc00 || low > 0xdfff) this.fail('lone leading surrogate in hex escape');
          if (keep) out += String.fromCharCode(unit, low);
        } else if (keep) {
          out += String.fromCharCode(unit);
        }
      } else {
        const ch = ESCAPES[e];
        if (ch === undefined) { this.at--; this.fail(Number.isNaN(e) ? 'EOF while parsing a string' : 'invalid escape'); }
        if (keep) out += ch;
      }
    }
  }

  /** The code unit of the four hex digits here. */
  hex4() {
    let unit = 0;
    for (let i = 0; i < 4; i++) {
      const c = this.text.charCodeAt(this.at + i);
      const d = isDigit(c) ? c - ZERO : c >= 0x41 && c <= 0x46 ? c - 0x37 : c >= 0x61 && c <= 0x66 ? c - 0x57 : -1;
      if (d < 0) { this.at += i; this.fail(Number.isNaN(c) ? 'EOF while parsing a string' : 'invalid escape'); }
      unit = unit * 16 + d;
    }
    this.at += 4;
    return unit;
  }

  /** Checks and skips a value in a container `depth` deep, building nothing. */
  skipValue(depth) {
    this.ws();
    const c = this.peek();
    if (c === OPEN_BRACE) {
      this.open(depth + 1);
      for (let first = true; this.member(first); first = false) {
        this.string(false);
        this.colon();
        this.skipValue(depth + 1);
        if (!this.next(CLOSE_BRACE)) break;
      }
    } else if (c === OPEN_BRACKET) {
      this.open(depth + 1);
      if (this.peek() === CLOSE_BRACKET) { this.at++; return; }
      do this.skipValue(depth + 1); while (this.next(CLOSE_BRACKET));
    } else if (c === QUOTE) {
      this.string(false);
    } else if (c === MINUS || isDigit(c)) {
      this.skipNumber();
    } else {
      this.literal();
    }
  }

  /** A listed field's value (whitespace skipped), read as serde reads the field's type. */
  field(type) {
    const c = this.peek();
    if (type === I64) {
      if (c !== MINUS && !isDigit(c)) throw this.invalidType('i64');
      const n = this.number();
      if (typeof n !== 'bigint') throw new JsonError(`invalid type: floating point \`${serdeFloat(n)}\`, expected i64`);
      if (n > I64_MAX) throw new JsonError(`invalid value: integer \`${n}\`, expected i64`);
      return n;
    }
    if (type === OPTIONAL_STRING && c === LOWER_N) { this.literal(); return null; }
    if (c !== QUOTE) throw this.invalidType('a string');
    return this.string(true);
  }

  /**
   * serde_json's "invalid type" error for the value here (whitespace
   * skipped), reading of it only what the message needs, as serde_json does.
   */
  invalidType(expected) {
    const c = this.peek();
    let what;
    if (c === OPEN_BRACKET) what = 'sequence';
    else if (c === OPEN_BRACE) what = 'map';
    else if (c === QUOTE) what = `string ${debugString(this.string(true))}`;
    else if (c === MINUS || isDigit(c)) {
      const n = this.number();
      what = typeof n === 'bigint' ? `integer \`${n}\`` : `floating point \`${serdeFloat(n)}\``;
    } else {
      const word = this.literal();
      what = word === 'null' ? 'null' : `boolean \`${word}\``;
    }
    return new JsonError(`invalid type: ${what}, expected ${expected}`);
  }
}

/**
 * The double a number's text stands for. A long one (a 400 000-digit
 * integer, say) is cut to its first 20 significant digits and its exponent
 * first: serde_json itself keeps no more than that, and converting all of it
 * would only cost.
 */
function toDouble(text) {
  if (text.length <= 64) return Number(text);
  const sign = text.charCodeAt(0) === MINUS ? '-' : '';
  let end = text.search(/[eE]/);
  let exponent = 0;
  if (end < 0) {
    end = text.length;
  } else {
    const e = text.slice(end + 1);
    const first = e.search(/[1-9]/); // leading zeros are allowed in an exponent
    const size = first < 0 ? 0 : e.length - first;
    exponent = size === 0 ? 0 : size > 9 ? 1e9 : Number(e.slice(first));
    if (e.charCodeAt(0) === MINUS) exponent = -exponent;
  }
  const dot = text.indexOf('.');
  const whole = text.slice(sign.length, dot < 0 ? end : dot); // no leading zero unless it is "0"
  const fraction = dot < 0 ? '' : text.slice(dot + 1, end);
  let digits, point; // the significant digits, and the power of ten of the first
  if (whole !== '0') {
    digits = whole.slice(0, 20);
    if (digits.length < 20) digits += fraction.slice(0, 20 - digits.length);
    point = whole.length - 1;
  } else {
    const first = fraction.search(/[1-9]/);
    if (first < 0) return sign ? -0 : 0;
    digits = fraction.slice(first, first + 20);
    point = -1 - first;
  }
  const power = Math.max(-99999, Math.min(99999, point + exponent));
  return Number(`${sign}${digits[0]}.${digits.slice(1) || '0'}e${power}`);
}

/** A finite double as serde_json shows it in errors: shortest digits, fixed notation for 1e-5 <= |x| < 1e16. */
function serdeFloat(x) {
  if (x === 0) return Object.is(x, -0) ? '-0.0' : '0.0';
  const s = x.toExponential(); // shortest round-trip digits: "-1.2345e+25"
  const m = /^(-?)([0-9])(?:\.([0-9]+))?e([+-][0-9]+)$/.exec(s);
  const power = Number(m[4]);
  if (power < -5 || power > 15) return s;
  const sign = m[1], digits = m[2] + (m[3] || '');
  if (digits.length - 1 <= power) return `${sign}${digits}${'0'.repeat(power + 1 - digits.length)}.0`;
  if (power >= 0) return `${sign}${digits.slice(0, power + 1)}.${digits.slice(power + 1)}`;
  return `${sign}0.${'0'.repeat(-power - 1)}${digits}`;
}

/** A string as Rust's `{:?}` shows it, cut after QUOTED_MAX characters (then `…` follows the quotes). */
function debugString(s) {
  let out = '"', n = 0;
  for (const ch of s) {
    if (n++ === QUOTED_MAX) return `${out}"…`;
    const c = ch.codePointAt(0);
    if (c === QUOTE || c === BACKSLASH) out += `\\${ch}`;
    else if (c === LF) out += '\\n';
    else if (c === CR) out += '\\r';
    else if (c === TAB) out += '\\t';
    else if (c === 0) out += '\\0';
    else if (c < SPACE || (c >= 0x7f && c < 0xa0)) out += `\\u{${c.toString(16)}}`;
    else out += ch;
  }
  return `${out}"`;
}

/** The field types of `readEvent`, as serde reads the Rust field types. */
export const I64 = 'i64'; // i64: a JSON integer in [-2^63, 2^63), as a BigInt
export const STRING = 'string'; // String
export const OPTIONAL_STRING = 'string?'; // Option<String>: absent or null is null

/**
 * The message's payload as the Rust handler's event struct: `fields` is a
 * list of [name, type] in the struct's order. Returns an object with one
 * property per field; other members of the JSON object are checked and
 * ignored. Anything serde_json would refuse is rejected as
 * "<what>: <reason>", e.g. "not a like event: missing field `post_id`".
 */
export function readEvent(msg, what, fields) {
  let text;
  try {
    text = utf8Decode(msg.payload);
  } catch (e) {
    throw reject(`${what}: the payload is not UTF-8 (${e.message})`);
  }
  const types = new Map(fields);
  const event = {};
  try {
    const json = new JsonReader(text);
    json.ws();
    if (json.peek() !== OPEN_BRACE) throw json.invalidType('a JSON object');
    json.open(1);
    const seen = new Set();
    for (let first = true; json.member(first); first = false) {
      const name = json.string(true);
      json.colon();
      json.ws();
      const type = types.get(name);
      if (type === undefined) {
        json.skipValue(1); // a member the struct does not have: serde ignores it, repeats included
      } else {
        if (seen.has(name)) throw new JsonError(`duplicate field \`${name}\``);
        seen.add(name);
        event[name] = json.field(type);
      }
      if (!json.next(CLOSE_BRACE)) break;
    }
    for (const [name, type] of fields) {
      if (seen.has(name)) continue;
      if (type !== OPTIONAL_STRING) throw new JsonError(`missing field \`${name}\``);
      event[name] = null;
    }
    json.ws();
    if (json.at < text.length) json.fail('trailing characters');
  } catch (e) {
    if (e instanceof JsonError) throw reject(`${what}: ${e.message}`);
    throw e;
  }
  return event;
}

// ---- statements ----------------------------------------------------------------

/**
 * Statements in the host's transaction, bound to the engine of `msg`: as the
 * Rust guest SDK's `tx::execute(sql, params![...])?`. Parameters map by JS
 * type: BigInt or integral number -> integer, string -> text, null -> null,
 * boolean -> boolean, Uint8Array -> bytes.
 */
export function statements(msg) {
  // The engine's representation of WIT s64: BigInt (StarlingMonkey) or number (QuickJS).
  const big = typeof msg.streamSequence === 'bigint';
  // QuickJS passes s64 as a double, both ways: a value a double cannot hold
  // would reach the database rounded, and a number beyond ±2^53 (such as a
  // `msg.publishedMs` there) may have arrived rounded already.
  const inexact = (n) => reject(`integer ${n} cannot be passed to the database exactly by this build (QuickJS: 64-bit integers cross as doubles, exact within ±2^53); use the StarlingMonkey build`);
  const integer = (n) => {
    const exact = BigInt(n);
    if (exact < I64_MIN || exact > I64_MAX) throw new RangeError(`${exact} is not a 64-bit integer`);
    if (big) return exact;
    const approx = Number(exact);
    if (BigInt(approx) !== exact) throw inexact(exact);
    return approx;
  };
  const value = (v) => {
    if (v === null || v === undefined) return { tag: 'null' };
    switch (typeof v) {
      case 'bigint': return { tag: 'integer', val: integer(v) };
      case 'number':
        if (!Number.isInteger(v)) throw new TypeError(`${v} is not an integer parameter`);
        if (!big && !Number.isSafeInteger(v)) throw inexact(v);
        return { tag: 'integer', val: integer(v) };
      case 'string': return { tag: 'text', val: v };
      case 'boolean': return { tag: 'boolean', val: v };
    }
    if (v instanceof Uint8Array) return { tag: 'bytes', val: v };
    throw new TypeError(`unsupported parameter ${String(v)}`);
  };
  const run = (call, sql, params) => {
    const values = params.map(value);
    try {
      return call(sql, values);
    } catch (e) {
      const err = e && e.payload;
      if (!err || typeof err.kind !== 'string') throw e; // not a db-error: a bug, let it trap
      // As the Rust SDK's `?`: `other` (timeout, connection lost, ...) is worth a
      // retry; every other kind would fail the same way again.
      const reason = `database ${err.kind}: ${err.message}`;
      throw err.kind === 'other' ? retry(reason) : reject(reason);
    }
  };
  return {
    /** One INSERT, UPDATE or DELETE; the number of rows affected. */
    execute: (sql, params = []) => Number(run(transaction.execute, sql, params)),
    /** One SELECT (or a statement with RETURNING): { columns, rows }. */
    query: (sql, params = []) => run(transaction.query, sql, params),
  };
}
