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
import * as transaction from 'idem:handler/transaction@0.1.0';
import * as hostLog from 'idem:handler/log@0.1.0';

/** Permanent: the host dead-letters the message. Throw it from `handle`. */
export const reject = (reason) => ({ tag: 'reject', val: reason });
/** Transient: the host delivers the message again later. */
export const retry = (reason) => ({ tag: 'retry', val: reason });

/** A line in the host's log: level is 'debug', 'info', 'warn' or 'error'. */
export function log(level, message) {
  hostLog.log(level, message);
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
// be told from 2^53 and 1) and keep the last of two equal keys, where the
// Rust handlers take exact 64-bit integers, refuse a float for an integer,
// and refuse a repeated field. This reader is strict RFC 8259 as serde_json
// is: no lone surrogate in a \u escape, nesting bounded as serde_json's
// recursion limit (128), nothing after the value but whitespace.

const MAX_DEPTH = 128;
const I64_MIN = -(2n ** 63n);
const I64_MAX = 2n ** 63n - 1n;

/** A JSON number, kept as its text until a field's type says how to read it. */
class JsonNumber {
  constructor(text) { this.text = text; }
}

/** A JSON object: its members in order, repeats included. */
class JsonObject {
  constructor(members) { this.members = members; }
}

class JsonError extends Error {}

const WHITESPACE = /[ \t\n\r]*/y;
const NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;
const PLAIN = /[^"\\\u0000-\u001f]*/y; // string characters that need no escape
const ESCAPES = { '"': '"', '\\': '\\', '/': '/', b: '\b', f: '\f', n: '\n', r: '\r', t: '\t' };

class JsonReader {
  constructor(text) { this.text = text; this.at = 0; }

  fail(what) { throw new JsonError(`${what} at character ${this.at}`); }

  /** Advances past what `sticky` (a /y regex) matches here; returns the match. */
  skip(sticky) {
    sticky.lastIndex = this.at;
    const m = sticky.exec(this.text);
    if (m) this.at += m[0].length;
    return m && m[0];
  }

  ws() { this.skip(WHITESPACE); }

  /** The whole text as one value. */
  document() {
    const v = this.value(0);
    this.ws();
    if (this.at < this.text.length) this.fail('trailing characters');
    return v;
  }

  value(depth) {
    this.ws();
    const c = this.text[this.at];
    switch (c) {
      case '{': return this.object(depth + 1);
      case '[': return this.array(depth + 1);
      case '"': return this.string();
      case 't': return this.literal('true', true);
      case 'f': return this.literal('false', false);
      case 'n': return this.literal('null', null);
      case undefined: return this.fail('EOF while parsing a value');
    }
    const number = this.skip(NUMBER);
    if (!number) this.fail('expected value');
    return new JsonNumber(number);
  }

  literal(word, v) {
    if (this.text.startsWith(word, this.at)) { this.at += word.length; return v; }
    return this.fail('expected value');
  }

  enter(depth) {
    if (depth >= MAX_DEPTH) this.fail('recursion limit exceeded');
    this.at++; // the opening bracket
    this.ws();
  }

  /** After an element: true for another one, false at the closing bracket. */
  next(close) {
    this.ws();
    const c = this.text[this.at++];
    if (c === ',') return true;
    if (c === close) return false;
    this.at--;
    return this.fail(close === '}' ? 'expected `,` or `}`' : 'expected `,` or `]`');
  }

  array(depth) {
    this.enter(depth);
    const items = [];
    if (this.text[this.at] === ']') { this.at++; return items; }
    do items.push(this.value(depth)); while (this.next(']'));
    return items;
  }

  object(depth) {
    this.enter(depth);
    const members = [];
    if (this.text[this.at] === '}') { this.at++; return new JsonObject(members); }
    do {
      this.ws();
      if (this.text[this.at] !== '"') this.fail('key must be a string');
      const key = this.string();
      this.ws();
      if (this.text[this.at++] !== ':') { this.at--; this.fail('expected `:`'); }
      members.push([key, this.value(depth)]);
    } while (this.next('}'));
    return new JsonObject(members);
  }

  string() {
    const t = this.text;
    let out = '';
    this.at++; // the opening quote
    for (;;) {
      out += this.skip(PLAIN);
      const c = t[this.at++];
      if (c === '"') return out;
      if (c === undefined) { this.at--; this.fail('EOF while parsing a string'); }
      if (c !== '\\') { this.at--; this.fail('control character (\\u0000-\\u001F) found while parsing a string'); }
      const e = t[this.at++];
      if (e === 'u') {
        const unit = this.hex4();
        if (unit >= 0xdc00 && unit <= 0xdfff) this.fail('lone leading surrogate in hex escape');
        if (unit >= 0xd800 && unit <= 0xdbff) {
          if (t[this.at] !== '\\' || t[this.at + 1] !== 'u') this.fail('unexpected end of hex escape');
          this.at += 2;
          const low = this.hex4();
          if (low < 0xdc00 || low > 0xdfff) this.fail('lone leading surrogate in hex escape');
          out += String.fromCharCode(unit, low);
        } else {
          out += String.fromCharCode(unit);
        }
      } else if (e !== undefined && Object.prototype.hasOwnProperty.call(ESCAPES, e)) {
        out += ESCAPES[e];
      } else {
        this.fail('invalid escape');
      }
    }
  }

  hex4() {
    const h = this.text.slice(this.at, this.at + 4);
    if (!/^[0-9a-fA-F]{4}$/.test(h)) this.fail('invalid escape');
    this.at += 4;
    return parseInt(h, 16);
  }
}

/** How serde names what it found, for "invalid type" errors. */
function found(v) {
  if (v === null) return 'null';
  if (typeof v === 'boolean') return `boolean \`${v}\``;
  if (typeof v === 'string') return `string ${JSON.stringify(v)}`;
  if (v instanceof JsonNumber) return isInteger(v) ? `integer \`${v.text}\`` : `floating point \`${v.text}\``;
  if (v instanceof JsonObject) return 'map';
  return 'sequence';
}

const isInteger = (n) => /^-?[0-9]+$/.test(n.text);

/** The field types of `readEvent`, as serde reads the Rust field types. */
export const I64 = 'i64'; // i64: a JSON integer in [-2^63, 2^63), as a BigInt
export const STRING = 'string'; // String
export const OPTIONAL_STRING = 'string?'; // Option<String>: absent or null is null

function field(type, v) {
  if (type === I64) {
    if (!(v instanceof JsonNumber) || !isInteger(v)) throw new JsonError(`invalid type: ${found(v)}, expected i64`);
    const n = BigInt(v.text);
    if (n < I64_MIN || n > I64_MAX) throw new JsonError(`invalid value: integer \`${v.text}\`, expected i64`);
    return n;
  }
  if (type === OPTIONAL_STRING && v === null) return null;
  if (typeof v !== 'string') throw new JsonError(`invalid type: ${found(v)}, expected a string`);
  return v;
}

/**
 * The message's payload as the Rust handler's event struct: `fields` is a
 * list of [name, type] in the struct's order. Returns an object with one
 * property per field; other members of the JSON object are ignored. Anything
 * serde_json would refuse is rejected as "<what>: <reason>", e.g.
 * "not a like event: missing field `post_id`".
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
    const doc = new JsonReader(text).document();
    if (!(doc instanceof JsonObject)) throw new JsonError(`invalid type: ${found(doc)}, expected a JSON object`);
    const seen = new Set();
    for (const [name, v] of doc.members) {
      if (!types.has(name)) continue;
      if (seen.has(name)) throw new JsonError(`duplicate field \`${name}\``);
      seen.add(name);
      event[name] = field(types.get(name), v);
    }
    for (const [name, type] of fields) {
      if (seen.has(name)) continue;
      if (type !== OPTIONAL_STRING) throw new JsonError(`missing field \`${name}\``);
      event[name] = null;
    }
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
  const integer = (n) => {
    const exact = BigInt(n);
    if (exact < I64_MIN || exact > I64_MAX) throw new RangeError(`${exact} is not a 64-bit integer`);
    if (big) return exact;
    const approx = Number(exact);
    if (BigInt(approx) !== exact) {
      // QuickJS passes s64 as a double: this value would arrive rounded.
      throw reject(`integer ${exact} cannot be passed to the database exactly by this build (QuickJS: 64-bit integers cross as doubles); use the StarlingMonkey build`);
    }
    return approx;
  };
  const value = (v) => {
    if (v === null || v === undefined) return { tag: 'null' };
    switch (typeof v) {
      case 'bigint': return { tag: 'integer', val: integer(v) };
      case 'number':
        if (!Number.isSafeInteger(v)) throw new TypeError(`${v} is not an integer parameter`);
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
