// Card authorisations as a WebAssembly transform for eos-processor, in AssemblyScript: the same
// logic as examples/wasm/go/main.go, answering the same bytes for the same input
// (docs/TRANSFORMS.md "WebAssembly transforms"; the wasm-transform crate's tests compare them).
//
// Per card and UTC day it keeps what was spent in each currency, in minor units. An
// authorisation that would take the day's spend in its currency above the daily limit is
// refused (over_daily_limit); every other one is approved to the default output, and one of at
// least the flag threshold goes to the "flagged" output as well.
//
// The JSON is read and written by hand, because the answer must be the Go module's byte for
// byte: Go's encoding/json sorts map keys, escapes <, > and & as \u003c, \u003e and \u0026, and
// copies raw values as they came.

import { Host } from "@extism/as-pdk";

const INTERFACE_VERSION = "eos-transform/1";
// The same defaults as the Go module, in minor units.
const DAILY_LIMIT: i64 = 100000;
const FLAG_AT: i64 = 50000;
const I64_MAX: i64 = 9223372036854775807;

// A trap with the message in the host's error: the processor dead-letters the event.
export function abort(
  message: string | null,
  fileName: string | null,
  line: u32,
  column: u32,
): void {
  unreachable();
}

function output(text: string): void {
  // As bytes: the PDK's outputString counts UTF-16 units, not bytes.
  Host.output(Uint8Array.wrap(String.UTF8.encode(text)));
}

export function eos_interface_version(): i32 {
  output(INTERFACE_VERSION);
  return 0;
}

// ---- reading JSON --------------------------------------------------------------------------

class Reader {
  constructor(public text: string, public at: i32 = 0) {}

  ws(): void {
    while (this.at < this.text.length) {
      const c = this.text.charCodeAt(this.at);
      if (c != 0x20 && c != 0x09 && c != 0x0a && c != 0x0d) break;
      this.at++;
    }
  }

  peek(): i32 {
    this.ws();
    return this.at < this.text.length ? this.text.charCodeAt(this.at) : -1;
  }

  expect(c: i32): void {
    if (this.peek() != c) abort("unexpected JSON", null, 0, 0);
    this.at++;
  }

  // A string at the cursor, decoded.
  string(): string {
    this.expect(0x22);
    let out = "";
    let start = this.at;
    while (true) {
      const c = this.text.charCodeAt(this.at);
      if (c == 0x22) break;
      if (c == 0x5c) {
        out += this.text.substring(start, this.at);
        const e = this.text.charCodeAt(this.at + 1);
        this.at += 2;
        if (e == 0x75) {
          out += String.fromCharCode(i32(parseInt(this.text.substr(this.at, 4), 16)));
          this.at += 4;
        } else if (e == 0x6e) out += "\n";
        else if (e == 0x74) out += "\t";
        else if (e == 0x72) out += "\r";
        else if (e == 0x62) out += "\b";
        else if (e == 0x66) out += "\f";
        else out += String.fromCharCode(e);
        start = this.at;
        continue;
      }
      this.at++;
    }
    out += this.text.substring(start, this.at);
    this.at++;
    return out;
  }

  // Skips the value at the cursor and answers its text as it came.
  raw(): string {
    const c = this.peek();
    const start = this.at;
    if (c == 0x22) {
      this.string();
    } else if (c == 0x7b || c == 0x5b) {
      const close = c == 0x7b ? 0x7d : 0x5d;
      this.at++;
      if (this.peek() == close) {
        this.at++;
      } else {
        while (true) {
          if (c == 0x7b) {
            this.string();
            this.expect(0x3a);
          }
          this.raw();
          if (this.peek() == 0x2c) {
            this.at++;
            continue;
          }
          this.expect(close);
          break;
        }
      }
    } else {
      while (this.at < this.text.length) {
        const d = this.text.charCodeAt(this.at);
        if (d == 0x2c || d == 0x7d || d == 0x5d || d == 0x20 || d == 0x0a) break;
        this.at++;
      }
    }
    return this.text.substring(start, this.at);
  }

  // The members of the object at the cursor: keys decoded, values as they came.
  members(): Map<string, string> {
    const members = new Map<string, string>();
    this.expect(0x7b);
    if (this.peek() == 0x7d) {
      this.at++;
      return members;
    }
    while (true) {
      const key = this.string();
      this.expect(0x3a);
      members.set(key, this.raw());
      if (this.peek() == 0x2c) {
        this.at++;
        continue;
      }
      this.expect(0x7d);
      return members;
    }
  }
}

function decodeString(raw: string): string {
  return new Reader(raw).string();
}

function isString(raw: string): bool {
  return raw.length > 0 && raw.charCodeAt(0) == 0x22;
}

// ---- writing JSON as Go's encoding/json does -------------------------------------------------

const HEX = "0123456789abcdef";

// Whether Go's encoder would escape anything in `text`: most text needs nothing, and is then
// copied whole rather than character by character (each += copies the string so far).
function plain(text: string, raw: bool): bool {
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c == 0x3c || c == 0x3e || c == 0x26 || c == 0x2028 || c == 0x2029) return false;
    if (!raw && (c < 0x20 || c == 0x22 || c == 0x5c)) return false;
  }
  return true;
}

function quote(text: string): string {
  if (plain(text, false)) return '"' + text + '"';
  let out = '"';
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c == 0x22) out += '\\"';
    else if (c == 0x5c) out += "\\\\";
    else if (c == 0x0a) out += "\\n";
    else if (c == 0x0d) out += "\\r";
    else if (c == 0x09) out += "\\t";
    else if (c < 0x20 || c == 0x3c || c == 0x3e || c == 0x26 || c == 0x2028 || c == 0x2029) {
      out += "\\u" + HEX.charAt((c >> 12) & 15) + HEX.charAt((c >> 8) & 15);
      out += HEX.charAt((c >> 4) & 15) + HEX.charAt(c & 15);
    } else out += String.fromCharCode(c);
  }
  return out + '"';
}

// A raw value as Go re-emits a json.RawMessage: compact already, with its HTML characters
// escaped.
function rawOut(raw: string): string {
  if (plain(raw, true)) return raw;
  let out = "";
  for (let i = 0; i < raw.length; i++) {
    const c = raw.charCodeAt(i);
    if (c == 0x3c) out += "\\u003c";
    else if (c == 0x3e) out += "\\u003e";
    else if (c == 0x26) out += "\\u0026";
    else if (c == 0x2028) out += "\\u2028";
    else if (c == 0x2029) out += "\\u2029";
    else out += String.fromCharCode(c);
  }
  return out;
}

function sortedKeys<V>(map: Map<string, V>): string[] {
  const keys = map.keys();
  keys.sort((a: string, b: string): i32 => (a < b ? -1 : a > b ? 1 : 0));
  return keys;
}

// Go's strconv.Quote for the printable text an amount is.
function goQuote(text: string): string {
  let out = '"';
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c == 0x22) out += '\\"';
    else if (c == 0x5c) out += "\\\\";
    else if (c == 0x0a) out += "\\n";
    else if (c == 0x09) out += "\\t";
    else if (c == 0x0d) out += "\\r";
    else if (c < 0x20 || c == 0x7f) out += "\\x" + HEX.charAt(c >> 4) + HEX.charAt(c & 15);
    else out += String.fromCharCode(c);
  }
  return out + '"';
}

// ---- the logic ------------------------------------------------------------------------------

function isDigits(part: string): bool {
  if (part.length == 0) return false;
  for (let i = 0; i < part.length; i++) {
    const c = part.charCodeAt(i);
    if (c < 0x30 || c > 0x39) return false;
  }
  return true;
}

// "12.50" → 1250; -1 when it is not digits with up to two decimal places or passes an i64.
function minorUnits(text: string): i64 {
  const point = text.indexOf(".");
  const units = point < 0 ? text : text.substring(0, point);
  const cents = point < 0 ? "" : text.substring(point + 1);
  if (!isDigits(units) || (point >= 0 && (!isDigits(cents) || cents.length > 2))) return -1;
  let whole: i64 = 0;
  for (let i = 0; i < units.length; i++) {
    const digit = i64(units.charCodeAt(i) - 0x30);
    if (whole > (I64_MAX - digit) / 10) return -1;
    whole = whole * 10 + digit;
  }
  if (whole > I64_MAX / 100) return -1;
  let minor: i64 = 0;
  if (cents.length >= 1) minor = i64(cents.charCodeAt(0) - 0x30) * 10;
  if (cents.length == 2) minor += i64(cents.charCodeAt(1) - 0x30);
  if (whole * 100 > I64_MAX - minor) return -1;
  return whole * 100 + minor;
}

// 1250 → "12.50".
function decimal(minor: i64): string {
  const sign = minor < 0 ? "-" : "";
  const abs: u64 = minor < 0 ? u64(-minor) : u64(minor);
  const cents = abs % 100;
  return sign + (abs / 100).toString() + "." + (cents < 10 ? "0" : "") + cents.toString();
}

function isCurrency(c: string): bool {
  if (c.length != 3) return false;
  for (let i = 0; i < 3; i++) {
    const b = c.charCodeAt(i);
    if (b < 0x41 || b > 0x5a) return false;
  }
  return true;
}

function refusal(code: string, detail: string): string {
  return '{"refusal":{"code":' + quote(code) + ',"detail":' + quote(detail) + "}}";
}

function authorise(input: string): string {
  const top = new Reader(input).members();
  const event = new Reader(top.get("event")).members();
  const value = new Reader(event.get("value")).members();
  const entity = decodeString(event.get("entity"));
  const eventId = decodeString(event.get("event_id"));

  let day = "";
  const spent = new Map<string, i64>();
  const state = top.has("state") ? top.get("state") : "null";
  if (state != "null") {
    const card = new Reader(state).members();
    if (card.has("day") && isString(card.get("day"))) day = decodeString(card.get("day"));
    if (card.has("spent") && card.get("spent") != "null") {
      const stored = new Reader(card.get("spent")).members();
      const currencies = stored.keys();
      for (let i = 0; i < currencies.length; i++) {
        spent.set(currencies[i], I64.parseInt(stored.get(currencies[i])));
      }
    }
  }

  // Go unmarshals the amount into a string: null leaves it empty, anything but a string or
  // null fails and is shown as it came.
  const amountRaw = value.has("amount") ? value.get("amount") : "";
  if (amountRaw != "null" && !isString(amountRaw)) {
    return refusal(
      "invalid_amount",
      "amount " + amountRaw + " is not a decimal string with up to 2 places",
    );
  }
  const amountText = amountRaw == "null" ? "" : decodeString(amountRaw);
  const amount = minorUnits(amountText);
  if (amount < 0) {
    return refusal(
      "invalid_amount",
      "amount " + goQuote(amountText) + " is not a decimal string with up to 2 places",
    );
  }
  const currencyRaw = value.has("currency") ? value.get("currency") : "";
  const currency = isString(currencyRaw) ? decodeString(currencyRaw) : "";
  if (!isCurrency(currency)) {
    return refusal("invalid_currency", "currency is not an ISO 4217 code");
  }
  const at = event.has("occurred_at") ? event.get("occurred_at") : "null";
  const occurredAt = at == "null" ? "" : decodeString(at);
  // Go measures the length in bytes; a UTC RFC 3339 time is ASCII.
  if (at == "null" || String.UTF8.byteLength(occurredAt) < 10) {
    return refusal("missing_time", "the authorisation has no /at");
  }
  const today = occurredAt.substring(0, 10);
  if (day != today) {
    day = today;
    spent.clear();
  }
  const before: i64 = spent.has(currency) ? spent.get(currency) : 0;
  const after = before + amount;
  if (after < before || after > DAILY_LIMIT) {
    return refusal(
      "over_daily_limit",
      "card " + entity + " would spend " + decimal(after) + " " + currency + " on " + day +
        ", over its daily limit of " + decimal(DAILY_LIMIT),
    );
  }
  spent.set(currency, after);

  let outputs = "";
  if (amount >= FLAG_AT) {
    outputs +=
      '{"output":"flagged","value":{"amount":' + quote(amountText) +
      ',"auth_id":' + quote(eventId) + ',"card":' + quote(entity) +
      ',"currency":' + quote(currency) +
      ',"reason":"large_amount"},"headers":{"eos-flag":"large_amount"}},';
  }
  value.set("status", '"approved"');
  value.set("day_spent", '"' + decimal(after) + '"');
  const keys = sortedKeys(value);
  let approved = "";
  for (let i = 0; i < keys.length; i++) {
    if (i > 0) approved += ",";
    approved += quote(keys[i]) + ":" + rawOut(value.get(keys[i]));
  }
  outputs += '{"output":"default","value":{' + approved + "}}";

  const currencies = sortedKeys(spent);
  let spentJson = "";
  for (let i = 0; i < currencies.length; i++) {
    if (i > 0) spentJson += ",";
    spentJson += quote(currencies[i]) + ":" + spent.get(currencies[i]).toString();
  }
  return (
    '{"state":{"day":' + quote(day) + ',"spent":{' + spentJson + '}},"outputs":[' + outputs +
    "]}"
  );
}

export function apply(): i32 {
  output(authorise(Host.inputString()));
  return 0;
}
